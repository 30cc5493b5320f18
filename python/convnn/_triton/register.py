"""The Python package's launcher of convnn's Triton kernels: the CUDA kernel of
convnn::_triton_launch, through which the C++ library runs the kernels of this package where it
embeds none (the package's own build; issue 38 §4's one route).

The C++ side decides everything else, once for both routes (src/ops/cuda/triton/): whether a call
takes the kernels and why (path_choice.h, convnn.cuda_paths() shows it), which kernels with which
grids and arguments (the *_launches.cpp launchers), and the first-call check that turns wrong
kernels off on a device. A launch arrives here as a key of specialisations.py, a grid and the
arguments in launch order; Triton compiles that key's kernel for the GPU it runs on, on first use.
Under Triton's interpreter (TRITON_INTERPRET=1) the tensors may be CPU tensors: that is how the
tests run the C++ launchers and these kernels together without a GPU.
"""
import contextlib
import functools
import importlib.util

import torch

_table = None
# Launches made, by key, while `recording` is a list: the tests' proof that a call took the kernels.
recording = None


def specialisation(key):
    """(kernel, signature, constexprs, launch options) of the key, as specialisations.py lists it."""
    global _table
    if _table is None:
        from . import specialisations

        _table = {name: (kernel, signature, constexprs, options)
                  for name, kernel, signature, constexprs, options in specialisations.all_specialisations()}
    if key not in _table:
        raise RuntimeError(f"convnn: no Triton kernel '{key}' in specialisations.py (asked for by the C++ launchers)")
    return _table[key]


# The tensor dtype of each pointer type of specialisations.py's signatures.
_POINTER_DTYPES = {"*fp32": torch.float32, "*bf16": torch.bfloat16, "*fp16": torch.float16, "*i64": torch.int64,
                   "*i32": torch.int32, "*i1": torch.bool}


@functools.cache
def _outputs_in_the_ops_dtype():
    """({dtype code: torch dtype}, specialisations.OUTPUTS_IN_THE_OPS_DTYPE), read once (not per launch)."""
    from . import select, specialisations

    return {code: dtype for dtype, code in select.DTYPE_CODES.items()}, specialisations.OUTPUTS_IN_THE_OPS_DTYPE


def _check_pointer_types(key, kernel, signature, arguments):
    """Each tensor argument has the dtype of its pointer in the key's signature (an output written in
    the op's dtype: the dtype its dtype_code names): the embedded route's images are compiled for
    exactly those types, and read another dtype's bytes as theirs; this route's JIT would compile
    for whatever it is given, so the tests check the launches here."""
    dtype_of_code, outputs = _outputs_in_the_ops_dtype()
    named = dict(zip(kernel.arg_names, arguments))
    in_the_ops_dtype = outputs.get(kernel.__name__, ())
    for name, argument in named.items():
        if not isinstance(argument, torch.Tensor):
            continue
        if name in in_the_ops_dtype:
            wanted = dtype_of_code[named["dtype_code"]]
            takes = f"{wanted} (the op's dtype, by dtype_code)"
        else:
            wanted, takes = _POINTER_DTYPES[signature[name]], signature[name]
        if argument.dtype != wanted:
            raise RuntimeError(f"convnn: the launch of Triton kernel '{key}' passes {name} as {argument.dtype}, "
                               f"where the compiled kernel takes {takes} (specialisations.py)")


def _as_compiled(kernel, signature, arguments):
    """The arguments as the compiled kernel takes them: an output written in the op's dtype through a
    pointer compiled as float32 (OUTPUTS_IN_THE_OPS_DTYPE) passed as that pointer's type
    (triton.reinterpret: the same memory). Triton's JIT types a pointer by its tensor's dtype, so a
    bfloat16 output would otherwise compile, here and under the interpreter, a kernel whose pointer
    arithmetic before select.store_as's cast steps 2 bytes an element where the embedded route's
    image, compiled from specialisations.py's signature, steps 4: one kernel on both routes, and the
    interpreter tests run the embedded route's addressing."""
    import triton
    import triton.language as tl

    from . import specialisations

    in_the_ops_dtype = specialisations.OUTPUTS_IN_THE_OPS_DTYPE.get(kernel.__name__, ())
    compiled = list(arguments)
    for position, name in enumerate(kernel.arg_names[:len(arguments)]):
        argument = arguments[position]
        if name not in in_the_ops_dtype or not isinstance(argument, torch.Tensor):
            continue
        wanted = _POINTER_DTYPES[signature[name]]
        if argument.dtype != wanted:
            compiled[position] = triton.reinterpret(argument, {"*fp32": tl.float32}[signature[name]])
    return compiled


def _scratch(size, alignment, stream):
    """Global memory for a launch of a kernel that makes TMA descriptors on the device (Triton's global
    scratch: bounded_select._tile_descriptors), from PyTorch's caching allocator, on the current device
    (Triton launches there), whose blocks start on 512 bytes."""
    assert 512 % alignment == 0, alignment
    return torch.empty(size, dtype=torch.uint8, device="cuda")


def with_scratch_memory():
    """Gives Triton an allocator for kernels' global scratch (the embedded route's launch.cpp allocates
    its own), unless one is set already: the user's, which serves as well. Triton keeps it per context
    (a ContextVar), so each launching thread asks."""
    import triton
    from triton.runtime import _allocation  # Triton has no public getter of the allocator

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def run(kernel, grid, arguments, constexprs, options):
    """One launch (the tests replace it to make a kernel wrong)."""
    with_scratch_memory()
    kernel[grid](*arguments, **constexprs, **options)


def architecture(arguments):
    """sm_<arch> of the GPU the launch runs on (its first CUDA tensor's), as specialisations.py's
    ByArchitecture takes it; under Triton's interpreter (CPU tensors) 90, an H100's, the GPU the
    kernels are tuned for."""
    device = next((a.device for a in arguments if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None:
        return 90
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def triton_launch(key, grid, pointers, int32s, float32s, kinds):
    """convnn::_triton_launch on CUDA: the arguments in the order of `kinds` (p, i, f)."""
    kernel, signature, constexprs, options = specialisation(key)
    sources = {"p": iter(pointers), "i": iter(int32s), "f": iter(float32s)}
    arguments = [next(sources[kind]) for kind in kinds]
    _check_pointer_types(key, kernel, signature, arguments)
    arguments = _as_compiled(kernel, signature, arguments)
    if recording is not None:
        recording.append(key)
    if 0 in grid:
        return
    from . import specialisations
    run(kernel, tuple(grid), arguments, specialisations.for_architecture(constexprs, architecture(arguments)), options)


def register():
    """The launcher, where triton is installed, this library has the Triton route and no launcher is
    registered yet (without one, CUDA tensors take the ATen path, and convnn.cuda_paths() says so)."""
    if (importlib.util.find_spec("triton") is not None and hasattr(torch.ops.convnn, "_triton_launch")
            and not torch._C._dispatch_has_kernel_for_dispatch_key("convnn::_triton_launch", "CUDA")):
        torch.library.register_kernel("convnn::_triton_launch", "cuda", triton_launch)


@contextlib.contextmanager
def cuda_paths():
    """Which path each core op took on CUDA tensors inside the block, and why: a list that fills
    with "op: why" entries when the block ends (e.g. "knn_select: Triton kernels (python route)",
    "knn_attention_backward: ATen path: dtype Double (the Triton kernels take float32, bfloat16
    and float16)"). The choice is the C++ library's (src/ops/cuda/triton/path_choice.h); calls in
    other threads inside the block are kept too (autograd's backward runs in its own)."""
    if not hasattr(torch.ops.convnn, "cuda_path_log"):
        raise RuntimeError("convnn.cuda_paths: this build of convnn has no Triton route (its build's Python had no "
                           "triton), so every op on CUDA tensors takes the ATen path")
    log = torch.ops.convnn.cuda_path_log
    kept = []
    log(True)
    try:
        yield kept
    finally:
        kept.extend(log(False))
