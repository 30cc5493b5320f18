"""Convolutional Nearest Neighbors (ConvNN) for PyTorch.

Importing the package registers the C++ ops with PyTorch's dispatcher (torch.ops.convnn.*); the
layers and functional forms call them. Semantics: docs/operator.md in the repository.
"""
from . import _library

_library.load()

from . import _build_info  # noqa: E402

from . import _vmap, flops, models, nn, pretrained, timm_models, viz  # noqa: E402,F401  (flops registers FlopCounterMode's formulas)
from . import _decompositions  # noqa: E402,F401  (the ops as ATen ops for torch.onnx.export)

_vmap.register()

from ._triton import register as _triton_kernels  # noqa: E402

_triton_kernels.register()  # the launcher of the Triton kernels (Triton compiles each on first use)
cuda_paths = _triton_kernels.cuda_paths

timm_models.register_when_timm_loads()  # at timm's first import: `import convnn` does not import timm

ops = __import__("torch").ops.convnn
__version__ = _build_info.CONVNN_VERSION

__all__ = ["nn", "models", "pretrained", "viz", "ops", "cuda_paths", "__version__"]
