"""Loads the compiled library that registers the convnn ops with PyTorch's dispatcher.

The ops and layers are C++ (libconvnn_ops.so, libconvnn.so beside this file); Python reaches
them as torch.ops.convnn.*. A library compiled against another torch would crash or misbehave,
so a mismatch is refused here, with what to do about it.
"""
import pathlib

import torch

from . import _build_info

LIBRARY = pathlib.Path(__file__).resolve().parent / "lib" / "libconvnn.so"
# The models' library and the torch.save reader's (whose checks load_checkpoint runs): in the package
# where nlohmann-json's headers were found at build time.
MODELS_LIBRARY = LIBRARY.with_name("libconvnn_models.so")
TORCH_FILE_LIBRARY = LIBRARY.with_name("libconvnn_torch_file.so")


def _release(version: str) -> str:
    """'2.11.0+cu130' -> '2.11.0': the local suffix names the wheel's CUDA, not the C++ ABI."""
    return version.split("+", 1)[0]


def load() -> None:
    built, running = _build_info.TORCH_VERSION, torch.__version__
    if _release(built) != _release(running):
        raise ImportError(
            f"convnn was built against torch {built}, but this environment has torch {running}; "
            f"reinstall convnn in this environment (pip install --force-reinstall <convnn clone>) "
            f"or install torch=={_release(built)}")
    if not LIBRARY.is_file():
        raise ImportError(f"convnn's compiled library is missing: {LIBRARY} (reinstall the package)")
    torch.ops.load_library(str(LIBRARY))
    for library in (MODELS_LIBRARY, TORCH_FILE_LIBRARY):
        if library.is_file():
            torch.ops.load_library(str(library))


def has_models() -> bool:
    return MODELS_LIBRARY.is_file()
