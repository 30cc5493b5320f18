"""convnn's Triton kernels (python/convnn/_triton) executed by Triton's CPU interpreter on CPU
tensors (TRITON_INTERPRET=1): this project's machines have no GPU, so this is where their logic is
proven, launched as a CUDA tensor launches them: each op's CUDA kernel (the C++ path choice and
launchers, src/ops/cuda/triton/) through the Python package's launcher. On a machine with a CUDA
device and without TRITON_INTERPRET, the same tests run the compiled kernels on the GPU
(scripts/gpu-check.sh). Each kernel is compared with the device-generic path (the op's
CompositeExplicitAutograd kernel) and the fused CPU op, in float32, bfloat16 and float16 (the dtypes
the kernels take), with tolerances from float64 references; the backward is bitwise repeatable;
every output element is written and no byte outside a tensor is touched (guard regions); the
first-call safety net turns a wrong kernel off with one warning. scripts/triton_compile_check.py
compiles the same kernels for sm_80 and sm_90.
"""
import contextlib
import os

import numpy as np
import pytest

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# Triton's interpreter must be chosen before triton is first imported in the process, so ctest runs
# this file in a process of its own with TRITON_INTERPRET=1 (python.triton_interpreter in
# tests/CMakeLists.txt); in the shared pytest run on a machine without a GPU it is skipped.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    # The ops' checks read no values on any device, CPU included (src/ops/checks.h), as on a GPU:
    # the CUDA kernels run here on CPU tensors, and a NaN must reach the kernels, not the checks.
    os.environ["CONVNN_DEVICE_VALUE_CHECKS"] = "0"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("run with TRITON_INTERPRET=1 in the environment (ctest: python.triton_interpreter), "
                "or on a CUDA device", allow_module_level=True)
# Where the kernels run: CPU tensors under the interpreter, else the GPU.
DEVICE = torch.device("cpu") if INTERPRETED else torch.device("cuda", torch.cuda.current_device())

import convnn  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from convnn._triton import aggregate, attention, attention_backward, bitonic, pair_gradients, register, select, similarities  # noqa: E402,E501

if INTERPRETED:
    import triton_interpreter  # noqa: E402  (beside this file)

    triton_interpreter.round_bfloat16_to_nearest_even()
    # The first call's check of a bfloat16 op also runs the tensor-core select (bounded_select.py),
    # whose tl.dot of bfloat16 operands the bare interpreter multiplies as bit patterns.
    triton_interpreter.multiply_bfloat16_as_numbers()

ops = torch.ops.convnn
GENERIC = torch._C.DispatchKey.CompositeExplicitAutograd
CUDA = torch._C.DispatchKey.CUDA


@contextlib.contextmanager
def launches_recorded():
    """The keys of the Triton launches made inside the block (register.recording); the first call of a
    set of kernels on a device and dtype launches the first-call check's too (path_choice.h)."""
    register.recording = []
    try:
        yield register.recording
    finally:
        register.recording = None


# The kernels run as a CUDA tensor runs them: each op's CUDA kernel (the C++ path choice and
# launchers, src/ops/cuda/triton/) launching them through the package's launcher (register.py),
# here on the test's tensors whatever their device. Each call must take the Triton kernels: the
# path log says so.
def through_kernels(op, *args):
    with convnn.cuda_paths() as paths:
        result = op._op_dk(CUDA, *args)
    assert paths and all(": Triton kernels" in path for path in paths), f"{op} took the ATen path: {paths}"
    return result


def aggregate_forward(values, weights, indices, kernel, bias):
    return through_kernels(ops.knn_aggregate.default, values, weights, indices, kernel, bias)


def aggregate_backward(grad_output, values, weights, indices, kernel, output_mask):
    return through_kernels(ops.knn_aggregate_backward.default, grad_output, values, weights, indices, kernel,
                           output_mask)


def select_forward(queries, keys, k, similarity, mask, index_order):
    return through_kernels(ops.knn_select.default, queries, keys, k, similarity, mask, index_order)


def select_backward(grad_scores, queries, keys, indices, scores, similarity):
    return through_kernels(ops.knn_select_backward.default, grad_scores, queries, keys, indices, scores, similarity)


def attention_forward(*args):
    return through_kernels(ops.knn_attention_device_fused.default, *args)


def softmax_scores_gradient(grad_output, values, weights, indices, kernel, temperature):
    return through_kernels(ops.knn_attention_softmax_scores_gradient_device_fused.default, grad_output, values,
                           weights, indices, kernel, temperature)[0]


def two_kernel_backward(grad_output, queries, keys, values, kernel, scores, indices, weights, similarity, temperature):
    return through_kernels(ops.knn_attention_backward_device_fused.default, grad_output, queries, keys, values, kernel,
                           scores, indices, weights, similarity, "softmax", temperature)


def row_layout(t):
    """The (batch, head, row) strides a kernel takes for t's rows, as the C++ RowLayout
    (src/ops/cuda/triton/kernel_arguments.h): [G, rows, width] has head 0; a dimension of size 1
    steps 0."""
    strides = [0 if size == 1 else stride for size, stride in zip(t.shape, t.stride())]
    return (strides[0], 0, strides[1]) if t.dim() == 3 else tuple(strides[:3])


def layouts(*tensors):
    """The heads and the row layouts of `tensors` as a kernel takes them after its other arguments."""
    heads = tensors[0].shape[1] if tensors[0].dim() == 4 else 1
    return (heads, *(stride for t in tensors for stride in row_layout(t)))


def inverse_index(indices, m):
    """(order, run_start) of the slots by the row they read, as the C++ launchers build it (both int32),
    for the tests that launch a kernel directly."""
    g = indices.shape[0]
    target = (indices + torch.arange(g, device=indices.device).view(g, 1, 1) * m).reshape(-1)
    sorted_target, order = torch.sort(target, stable=True)
    return order.int(), torch.searchsorted(sorted_target, torch.arange(g * m + 1, device=indices.device),
                                           out_int32=True)


def busiest_first(run_start):
    """The rows by run length, longest first, as the two-kernel backward's launcher orders them."""
    return torch.sort(run_start[1:] - run_start[:-1], descending=True, stable=True).indices.int()


def reasons(call):
    """The path log of `call`: each op's choice, and why."""
    with convnn.cuda_paths() as paths:
        call()
    return paths


@pytest.fixture
def fresh_first_call_checks():
    """The first-call checks forgotten before and after the test (they are remembered per device,
    dtype and route for the whole process)."""
    ops._cuda_path_checks_reset()
    yield
    ops._cuda_path_checks_reset()

def inputs(dtype, g=2, n=5, m=6, c=4, k=3, seed=0, kind="depthwise"):
    """Depthwise kernel [C,K], or standard [C+3,C,K] (more output than input channels)."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(g, m, c, generator=generator).to(dtype)
    weights = torch.randn(g, n, k, generator=generator).to(dtype)
    indices = torch.randint(0, m, (g, n, k), generator=generator)
    indices[0, 1] = 2  # one row gathered by every slot of a query, and by other queries
    shape = (c, k) if kind == "depthwise" else (c + 3, c, k)
    kernel = torch.randn(*shape, generator=generator).to(dtype)
    bias = torch.randn(shape[0], generator=generator).to(dtype)
    return tuple(t.to(DEVICE) for t in (values, weights, indices, kernel, bias))


def generic_aggregate(*args):
    """The device-generic path on any device (on a CUDA tensor, ops.knn_aggregate would run the
    Triton kernels under test)."""
    return ops.knn_aggregate.default._op_dk(GENERIC, *args)


def on_cpu(*tensors):
    return tuple(None if t is None else t.cpu() for t in tensors)


KINDS = ["depthwise", "standard"]


TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_equals_the_generic_path_and_the_fused_cpu_op(kind, dtype, with_bias):
    values, weights, indices, kernel, bias = inputs(dtype, kind=kind)
    bias = bias if with_bias else None
    got = aggregate_forward(values, weights, indices, kernel, bias)
    tolerance = TOLERANCE[dtype]
    for want in (ops.knn_aggregate.default._op_dk(GENERIC, values, weights, indices, kernel, bias),
                 ops.knn_aggregate(*on_cpu(values, weights, indices, kernel, bias))):  # the fused CPU op
        torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_every_gradient_equals_the_generic_path_and_only_the_asked_ones_come_back(kind, dtype):
    values, weights, indices, kernel, _ = inputs(dtype, seed=1, kind=kind)
    grad_output = torch.randn(2, 5, kernel.shape[0], generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    everything = [True, True, True, True]
    got = aggregate_backward(grad_output, values, weights, indices, kernel, everything)
    want = ops.knn_aggregate_backward.default._op_dk(GENERIC, grad_output, values, weights, indices, kernel,
                                                     everything)
    tolerance = TOLERANCE[dtype]
    for name, a, b in zip(("values", "weights", "kernel", "bias"), got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=tolerance, atol=tolerance, msg=name)
    only_values = aggregate_backward(grad_output, values, weights, indices, kernel,
                                               [True, False, False, False])
    assert torch.equal(only_values[0], got[0]) and only_values[1:] == (None, None, None)


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_gradient_summed_over_several_chunks_of_rows_equals_the_generic_path(kind):
    """130 rows in chunks of 16 (the launcher's rule: about KERNEL_GRADIENT_CHUNKS chunks of whole
    blocks; the last one short): each chunk's partial sum, then their sum."""
    assert aggregate.KERNEL_GRADIENT_CHUNKS < 130
    values, weights, indices, kernel, _ = inputs(torch.float32, g=2, n=65, m=9, c=3, k=2, seed=9, kind=kind)
    grad_output = torch.randn(2, 65, kernel.shape[0], generator=torch.Generator().manual_seed(10)).to(DEVICE)
    mask = [False, False, True, False]
    got = aggregate_backward(grad_output, values, weights, indices, kernel, mask)[2]
    want = ops.knn_aggregate_backward.default._op_dk(GENERIC, grad_output, values, weights, indices, kernel, mask)[2]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_backward_is_bitwise_repeatable(kind):
    values, weights, indices, kernel, _ = inputs(torch.float32, g=3, n=9, m=4, seed=3, kind=kind)  # many slots per row
    grad_output = torch.randn(3, 9, kernel.shape[0], generator=torch.Generator().manual_seed(4)).to(DEVICE)
    first = aggregate_backward(grad_output, values, weights, indices, kernel, [True] * 4)
    second = aggregate_backward(grad_output, values, weights, indices, kernel, [True] * 4)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def guarded(shape, dtype, fill):
    """A tensor of `shape` inside a flat buffer with 64 guard elements before and after, all
    `fill`: (buffer, tensor view)."""
    numel = 1
    for size in shape:
        numel *= size
    buffer = torch.full((numel + 128,), fill, dtype=dtype, device=DEVICE)
    return buffer, buffer[64:64 + numel].view(shape)


def between_nan_guards(*tensors):
    """Copies of `tensors`, each inside NaN guard regions: a read outside a tensor carries a NaN
    into the results."""
    placed = []
    for t in tensors:
        _, view = guarded(t.shape, t.dtype, float("nan"))
        view.copy_(t)
        placed.append(view)
    return placed


def test_every_output_element_is_written_once_and_no_guard_byte_changes():
    """Outputs start as NaN inside guards of a canary value: afterwards no NaN is left (every
    element written) and every guard still holds the canary. Inputs sit between NaN guards: a read
    outside a tensor would carry a NaN into the results."""
    values, weights, indices, kernel, bias = inputs(torch.float32, g=3, n=7, m=5, c=6, k=4, seed=6)
    values, weights, kernel, bias = between_nan_guards(values, weights, kernel, bias)
    canary = 12345.0
    output_buffer, output = guarded((3, 7, 6), torch.float32, canary)
    output.fill_(float("nan"))
    aggregate._forward_kernel[(triton.cdiv(21, aggregate.ROWS), triton.cdiv(6, aggregate.CHANNELS))](
        values, weights, indices, kernel, bias, output, 21, 7, 5, 6, 4, HAS_BIAS=True,
        ROWS=aggregate.ROWS, CHANNELS=aggregate.CHANNELS, ACC=tl.float32)
    assert not output.isnan().any()
    assert (output_buffer[:64] == canary).all() and (output_buffer[-64:] == canary).all()
    torch.testing.assert_close(output.cpu(), ops.knn_aggregate(*on_cpu(values, weights, indices, kernel, bias)),
                               rtol=1e-5, atol=1e-5)
    # The values' gradient through the inverse index, the same way.
    grad_output = torch.randn(3, 7, 6, device=DEVICE)
    order, run_start = inverse_index(indices, 5)
    grad_buffer, grad_values = guarded((3, 5, 6), torch.float32, canary)
    grad_values.fill_(float("nan"))
    aggregate._values_gradient_kernel[(15, triton.cdiv(6, aggregate.CHANNELS))](
        grad_output, weights, kernel, order, run_start, grad_values, 6, 4, CHANNELS=aggregate.CHANNELS, ACC=tl.float32)
    assert not grad_values.isnan().any()
    assert (grad_buffer[:64] == canary).all() and (grad_buffer[-64:] == canary).all()


def test_the_cuda_kernel_takes_the_aten_path_where_the_kernels_do_not_apply_and_says_why(monkeypatch):
    """knn_aggregate's CUDA kernel on the test's tensors: float64 and CONVNN_CUDA_KERNELS=generic take
    the generic path, with the reason in the path log and the generic path's answer; float32 takes
    the Triton kernels, depthwise or standard; a shape error is the op's C++ message."""
    values, weights, indices, kernel, bias = inputs(torch.float32, seed=7)
    standard = torch.randn(3, 4, 3, device=DEVICE)
    cuda_aggregate = ops.knn_aggregate.default._op_dk
    as_double = (values.double(), weights.double(), indices, kernel.double(), None)
    assert reasons(lambda: torch.testing.assert_close(cuda_aggregate(CUDA, *as_double),
                                                      generic_aggregate(*as_double))) == [
        "knn_aggregate: ATen path: dtype Double (the Triton kernels take float32, bfloat16 and float16)"]
    for chosen in (kernel, standard):
        assert reasons(lambda: torch.testing.assert_close(
            cuda_aggregate(CUDA, values, weights, indices, chosen, None),
            generic_aggregate(values, weights, indices, chosen, None), rtol=1e-5, atol=1e-5)) == [
            "knn_aggregate: Triton kernels (python route)"]
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    assert reasons(lambda: cuda_aggregate(CUDA, values, weights, indices, kernel, bias)) == [
        "knn_aggregate: ATen path: CONVNN_CUDA_KERNELS=generic"]
    monkeypatch.delenv("CONVNN_CUDA_KERNELS")
    with pytest.raises(RuntimeError, match="knn_aggregate"):
        cuda_aggregate(CUDA, values, weights[:, :, :2], indices, kernel, bias)


def test_a_kernel_that_disagrees_on_first_use_is_turned_off_with_one_warning(monkeypatch, capfd,
                                                                           fresh_first_call_checks):
    """A launcher whose aggregation forward writes zeros: the first-call check catches it, warns
    once naming the kernel, and the generic path answers from then on, with the reason. (The
    warning is PyTorch's TORCH_WARN: a Python warning where the op is called from Python, on
    stderr here, where the test calls the CUDA kernel directly.)"""
    def wrong(kernel, grid, arguments, constexprs, options, right=register.run):
        right(kernel, grid, arguments, constexprs, options)
        if kernel is aggregate._forward_kernel:
            arguments[5].zero_()  # the output
    monkeypatch.setattr(register, "run", wrong)
    values, weights, indices, kernel, bias = inputs(torch.float32, seed=8)
    cuda_aggregate = ops.knn_aggregate.default._op_dk
    capfd.readouterr()
    out = cuda_aggregate(CUDA, values, weights, indices, kernel, bias)
    warned = capfd.readouterr().err
    assert warned.count("disagrees with the generic path") == 1, warned
    assert (f"the fused Triton kernel knn_aggregate (depthwise, forward) disagrees with the generic path on {DEVICE} "
            "(Float, python route)") in warned
    torch.testing.assert_close(out, generic_aggregate(values, weights, indices, kernel, bias), rtol=1e-5, atol=1e-5)
    assert reasons(lambda: cuda_aggregate(CUDA, values, weights, indices, kernel, bias)) == [
        f"knn_aggregate: ATen path: the first-call check found the Triton kernel knn_aggregate (depthwise, "
        f"forward) wrong on {DEVICE} (Float, python route)"]
    assert "disagrees" not in capfd.readouterr().err  # no second warning


def test_an_interrupt_during_the_first_call_check_reaches_the_caller_and_turns_nothing_off(monkeypatch, capfd,
                                                                                            fresh_first_call_checks):
    """Ctrl-C (or a time limit's SIGINT) while the first call compiles a kernel is no verdict on the
    kernel: the KeyboardInterrupt reaches the caller, no warning is given, and the next call checks
    again and takes the Triton kernels (before, the interrupt was remembered as a failure and every
    later call of the process took the generic path)."""
    def interrupted(kernel, grid, arguments, constexprs, options):
        raise KeyboardInterrupt
    monkeypatch.setattr(register, "run", interrupted)
    values, weights, indices, kernel, bias = inputs(torch.float32, seed=9)
    cuda_aggregate = ops.knn_aggregate.default._op_dk
    capfd.readouterr()
    with pytest.raises(KeyboardInterrupt):
        cuda_aggregate(CUDA, values, weights, indices, kernel, bias)
    assert "disagrees" not in capfd.readouterr().err
    monkeypatch.undo()
    assert reasons(lambda: cuda_aggregate(CUDA, values, weights, indices, kernel, bias)) == [
        "knn_aggregate: Triton kernels (python route)"]


def test_the_kernels_and_the_launcher_are_registered_for_cuda_tensors():
    for op in (ops.knn_select.default, ops.knn_select_backward.default, ops.knn_aggregate.default,
               ops.knn_aggregate_backward.default, ops.knn_attention_device_fused.default,
               ops.knn_attention_rho_aggregate_device_fused.default,
               ops.knn_attention_softmax_scores_gradient_device_fused.default,
               ops.knn_attention_backward_device_fused.default, ops._triton_launch.default):
        assert op.has_kernel_for_dispatch_key(CUDA), op


def test_launches_give_triton_scratch_memory_unless_the_user_gave_an_allocator():
    """A kernel that makes TMA descriptors on the device (the tensor-core select's two-tile step) needs
    Triton's global scratch: the launcher gives Triton PyTorch's caching allocator where no allocator
    is set (Triton's refuses such a launch), and keeps the user's where one is. In fresh contexts:
    Triton keeps the allocator in a ContextVar."""
    import contextvars

    from triton.runtime import _allocation

    def allocator_after_launcher():
        register.with_scratch_memory()
        return _allocation._allocator.get()

    assert contextvars.Context().run(allocator_after_launcher) is register._scratch

    def users_allocator(size, alignment, stream):
        raise AssertionError("not called here")

    def users_then_launcher():
        triton.set_allocator(users_allocator)
        return allocator_after_launcher()

    assert contextvars.Context().run(users_then_launcher) is users_allocator


# knn_select (python/convnn/_triton/select.py). Integer-valued features make every score and
# distance exact on every path, ties included, so the selected indices must be equal, not close.
SIMILARITIES = list(ops.similarity_names())  # the library's name table: a new one is tested too


def select_inputs(dtype, g=2, n=9, m=70, d=5, seed=11):
    """M = 70: two candidate tiles, the second short; values in [-3, 3]: many exact ties. Cosine's
    scores are rounded, but every path computes them from the same exact dot products and norms in
    the same order (src/ops/kernels/similarity.h), so they are the same bits, near-ties included."""
    generator = torch.Generator().manual_seed(seed)

    def draw(rows):
        return torch.randint(-3, 4, (g, rows, d), generator=generator).to(DEVICE, dtype)

    return draw(n), draw(m), generator


def select_masks(g, n, m, generator):
    short = torch.rand(g, n, m, generator=generator) > 0.4
    short[0, 0, :] = False  # no valid candidate at all
    short[1, 2, :] = False
    short[1, 2, 60:63] = True  # fewer valid candidates than K, in the second tile
    additive = torch.where(torch.rand(n, m, generator=generator) > 0.5, 0.0, float("-inf"))
    return {"none": None, "bool [G,N,M] with short rows": short.to(DEVICE),
            "additive 0/-inf [N,M]": additive.to(DEVICE)}


@pytest.mark.parametrize("index_order", [False, True])
@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_select_picks_the_generic_paths_indices_and_scores_with_every_similarity_and_mask(similarity, index_order):
    queries, keys, generator = select_inputs(torch.float32)
    for name, mask in select_masks(2, 9, 70, generator).items():
        got = select_forward(queries, keys, 6, similarity, mask, index_order)
        want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, similarity, mask, index_order)
        assert torch.equal(got[1], want[1]), f"{similarity}, {name}: indices"
        # The distances' scores are exp(-distance): Triton's exp on a GPU is within 1e-5 of the C++ one
        # (measured on an H100: 1.8e-6), not correctly rounded.
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=0, msg=lambda m: f"{similarity}, {name}: {m}")


def test_a_mask_slice_that_serves_several_query_slices_reads_as_the_mask_repeated(monkeypatch):
    """A [G',N,M] mask, G' dividing G (docs/operator.md, "Masks"): the kernels read each mask slice for
    its G/G' query slices in place (select.mask_slice_start; the launchers pass it as given, not
    repeated), and the select and the fused attention give the repeated mask's results bit for bit:
    G = 4 query slices over 2 mask slices that differ (slices 2 and 3 read the second), over 1, and
    an additive mask of 2."""
    queries, keys, generator = select_inputs(torch.float32, g=4)
    values = torch.randint(-3, 4, (4, 70, 4), generator=generator).to(DEVICE, torch.float32)
    kernel = torch.randint(-3, 4, (4, 6), generator=generator).to(DEVICE, torch.float32)
    bool_masks = (torch.rand(2, 9, 70, generator=generator) > 0.4).to(DEVICE)
    additive = torch.randint(-4, 3, (2, 9, 70), generator=generator).float().to(DEVICE)
    for mask in (bool_masks, bool_masks[1:], additive):
        repeated = mask.repeat_interleave(4 // mask.shape[0], 0)
        launched = _LaunchedTensors(monkeypatch)
        got = select_forward(queries, keys, 6, "dot", mask, False)
        read = launched.of("_select_kernel")
        assert read["mask_ptr"].shape == mask.shape and read["slices_per_mask_slice"] == 4 // mask.shape[0]
        for got_part, want_part in zip(got, select_forward(queries, keys, 6, "dot", repeated, False)):
            assert torch.equal(got_part, want_part)
        arguments = (queries, keys, values, kernel, None, 6, "dot")
        got = attention_forward(*arguments, mask, False, "softmax", 1.0)
        assert launched.of("_attention_kernel")["mask_ptr"].shape == mask.shape
        for got_part, want_part in zip(got, attention_forward(*arguments, repeated, False, "softmax", 1.0)):
            assert torch.equal(got_part, want_part)


def test_select_scores_exactly_orthogonal_integer_rows_exactly_zero_under_cosine():
    """The query (2, 3) against one candidate of positive cosine, one of negative cosine and four
    exactly orthogonal ones, (3, -2) times 1, 9, 2 and 3: normalising the rows before the product
    (the kernels before) scored (-9, 6) 3e-8 in float32, above the lower indices at 0. Here the two
    lowest orthogonal indices follow the positive one, with scores exactly 0, as on the C++ paths
    (GenericSelect.CosineOfExactlyOrthogonalIntegerRowsIsExactlyZeroOnEveryPath)."""
    queries = torch.tensor([[[2.0, 3.0]]], device=DEVICE)
    keys = torch.tensor([[[3.0, 1.0], [-1.0, -1.0], [3.0, -2.0], [-27.0, 18.0], [-6.0, 4.0], [-9.0, 6.0]]],
                        device=DEVICE)
    scores, indices = select_forward(queries, keys, 3, "cosine", None, False)
    assert indices.tolist() == [[[0, 2, 3]]]
    assert scores[0, 0, 0] > 0 and scores[0, 0, 1:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("similarity", ["dot", "scaled_dot"])
def test_select_adds_a_general_additive_mask_to_dot_scores(similarity):
    queries, keys, generator = select_inputs(torch.float32, seed=12)
    mask = torch.randint(-4, 3, (2, 9, 70), generator=generator).float().to(DEVICE)
    got = select_forward(queries, keys, 5, similarity, mask, False)
    want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 5, similarity, mask, False)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("k", [1, 9, 64])
def test_select_at_every_k_the_kernel_holds_and_in_bfloat16(k):
    for dtype in (torch.float32, torch.bfloat16):
        queries, keys, _ = select_inputs(dtype, g=1, n=33, m=80, d=3, seed=13)  # three row blocks
        for similarity in ("dot", "gaussian"):
            got = select_forward(queries, keys, k, similarity, None, False)
            want = ops.knn_select.default._op_dk(GENERIC, queries, keys, k, similarity, None, False)
            assert torch.equal(got[1], want[1]), (dtype, similarity)


def test_select_on_random_features_is_optimal_to_rounding():
    """Random float32 features: the two paths' GEMMs round differently, so near-tied candidates
    may be picked apart; each reported score is its own candidate's (float64) and the K-th is the
    generic path's K-th to rounding."""
    generator = torch.Generator().manual_seed(14)
    queries = torch.randn(2, 20, 16, generator=generator).to(DEVICE)
    keys = torch.randn(2, 90, 16, generator=generator).to(DEVICE)
    scores, indices = select_forward(queries, keys, 7, "scaled_dot", None, False)
    exact = torch.einsum("gnd,gmd->gnm", queries.double(), keys.double()) / 4.0
    torch.testing.assert_close(scores.double(), exact.gather(2, indices), rtol=1e-5, atol=1e-5)
    want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 7, "scaled_dot", None, False)[0]
    torch.testing.assert_close(scores[..., -1], want[..., -1], rtol=1e-5, atol=1e-5)


def test_select_writes_every_output_element_once_and_no_guard_byte_changes():
    queries, keys, generator = select_inputs(torch.float32, n=40, seed=15)
    queries, keys = between_nan_guards(queries, keys)
    mask_buffer, mask = guarded((40, 70), torch.float32, float("nan"))
    mask.copy_(torch.where(torch.rand(40, 70, generator=generator) > 0.5, 0.0, float("-inf")))
    canary = 777.0
    score_buffer, scores = guarded((2, 40, 6), torch.float32, canary)
    scores.fill_(float("nan"))
    index_buffer = torch.full((2 * 40 * 6 + 128,), -5, dtype=torch.int64, device=DEVICE)
    indices = index_buffer[64:-64].view(2, 40, 6)
    indices.fill_(-1)
    rows = select.rows_for(8)
    select._select_kernel[(triton.cdiv(40, rows), 2)](queries, keys, mask, scores, indices, 40, 70, 5, 6, 0, 1, 1.0, 0,
                                                      *layouts(queries, keys), SIMILARITY=0, MASK=select.ADDITIVE_MASK,
                                                      ROWS=rows,
                                                      CANDIDATES=select.candidates_for(6, select.ADDITIVE_MASK),
                                                      SLOTS=8, FEATURES=16)
    assert not scores.isnan().any() and (indices >= 0).all()
    assert (score_buffer[:64] == canary).all() and (score_buffer[-64:] == canary).all()
    assert (index_buffer[:64] == -5).all() and (index_buffer[-64:] == -5).all()
    want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, "dot", mask, False)
    assert torch.equal(indices, want[1])


def test_the_select_cuda_kernel_says_why_it_takes_the_generic_path():
    queries, keys, _ = select_inputs(torch.float32, seed=16)
    cuda_select = ops.knn_select.default._op_dk
    want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, "l1", None, True)
    assert torch.equal(select_forward(queries, keys, 6, "l1", None, True)[1], want[1])
    assert reasons(lambda: cuda_select(CUDA, queries.double(), keys.double(), 6, "l1", None, True)) == [
        "knn_select: ATen path: dtype Double (the Triton kernels take float32, bfloat16 and float16)"]
    assert reasons(lambda: cuda_select(CUDA, queries, keys, 65, "l1", None, True)) == [
        "knn_select: ATen path: K, a size or a grid past the select kernels' limits (K <= 64, 32-bit sizes)"]
    with pytest.raises(RuntimeError, match="knn_select"):
        cuda_select(CUDA, queries, keys, 71, "l1", None, True)  # the C++ rule, K <= M


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # numpy inside the interpreter
def test_select_gives_nan_scores_in_rows_that_met_a_nan_or_plus_inf_score_as_the_generic_path():
    """Where values are not read (an accelerator's default), a row that cannot be ranked comes out
    with NaN scores; the other rows are untouched."""
    queries, keys, _ = select_inputs(torch.float32, seed=17)
    queries[0, 3, 1] = float("nan")
    mask = torch.zeros(2, 9, 70, device=DEVICE)
    mask[1, 5, 66] = float("inf")  # in the second tile
    got = select_forward(queries, keys, 6, "dot", mask, False)
    assert got[0][0, 3].isnan().all() and got[0][1, 5].isnan().all()
    assert not got[0][0, :3].isnan().any() and not got[0][1, 6:].isnan().any()
    clean = queries.clone()
    clean[0, 3, 1] = 0
    want = ops.knn_select.default._op_dk(GENERIC, clean, keys, 6, "dot", None, False)
    rows = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
    rows[0, 3] = rows[1, 5] = False
    assert torch.equal(got[1][rows], want[1][rows])


@triton.jit
def _bitonic_probe(x_ptr, top_ptr, ascending_ptr, R: tl.constexpr, W: tl.constexpr, K: tl.constexpr):
    """bitonic.largest, in both orders, of the rows of x [R, W]."""
    r = tl.arange(0, R)
    x = tl.load(x_ptr + r[:, None] * W + tl.arange(0, W)[None, :])
    out = r[:, None] * K + tl.arange(0, K)[None, :]
    tl.store(top_ptr + out, bitonic.largest(x, K, 1))
    tl.store(ascending_ptr + out, bitonic.largest(x, K, 0))


@pytest.mark.parametrize("width,k", [(64, 8), (64, 64), (32, 16), (8, 8), (64, 1), (2, 2)])
def test_bitonic_network_gives_the_k_largest_int64_keys_sorted_even_at_the_extremes(width, k):
    """The network of bitonic.py against torch.topk: distinct keys spread over the whole int64
    range (the pair sums that find a partner wrap around), and repeated least keys (the gate's
    rejected candidates) beside them."""
    generator = torch.Generator().manual_seed(24)
    rows = 16 if width > 2 else 4
    x = torch.randint(-(2**62), 2**62, (rows, width), generator=generator) * 2 + 1
    x[0, : width // 2] = -(2**63)  # rejected candidates: the least key, repeated
    x[1, 0], x[1, -1] = 2**63 - 1, -(2**63) + 1
    top, ascending = (torch.empty(rows, k, dtype=torch.int64) for _ in range(2))
    on_device = [t.to(DEVICE) for t in (x, top, ascending)]
    _bitonic_probe[(1,)](*on_device, R=rows, W=width, K=k)
    top, ascending = (t.cpu() for t in on_device[1:])
    want = x.topk(k, dim=1).values
    assert torch.equal(top, want)
    assert torch.equal(ascending, want.flip(1))


def adversarial_tie_inputs(case):
    """Queries [2,17,4] and keys [2,150,4] (two row blocks, three candidate tiles) on which the
    selection without merge rounds must still give the generic path's indices exactly:
    - "dozens tie at the K-th": keys in {0, 1}, so dozens of candidates share each score;
    - "plus and minus zero": scores of exactly +0 and -0 (orthogonal rows, and -0 * x), which tie;
    - "every candidate equal": one key repeated: the K lowest indices win;
    - "every candidate enters": each key better than the one before, so every candidate of every
      tile passes the gate and evicts a member of the set;
    - "late entries": the best candidates last, after the set has settled on worse ones."""
    generator = torch.Generator().manual_seed(21)
    queries = torch.randint(-2, 3, (2, 17, 4), generator=generator).float()
    if case == "dozens tie at the K-th":
        keys = torch.randint(0, 2, (2, 150, 4), generator=generator).float()
    elif case == "plus and minus zero":
        queries = torch.zeros(2, 17, 4)
        queries[..., 0] = torch.randint(1, 3, (2, 17), generator=generator).float()
        keys = torch.zeros(2, 150, 4)
        keys[:, ::3, 1] = 1.0  # orthogonal: the product is +0
        keys[:, 1::3, 0] = -0.0  # -0 * positive: -0
        keys[:, 2::3, 0] = -1.0  # below both
    elif case == "every candidate equal":
        keys = torch.ones(2, 150, 4)
    elif case == "every candidate enters":
        queries = queries.abs() + 1
        keys = torch.arange(150.0).repeat(2, 4, 1).transpose(1, 2).contiguous()
    else:  # late entries
        queries = queries.abs() + 1
        keys = torch.randint(0, 3, (2, 150, 4), generator=generator).float()
        keys[:, 130:] += 5
    return queries.to(DEVICE), keys.to(DEVICE)


TIE_CASES = ["dozens tie at the K-th", "plus and minus zero", "every candidate equal", "every candidate enters",
             "late entries"]


@pytest.mark.parametrize("case", TIE_CASES)
def test_select_without_merge_rounds_keeps_the_tie_rule_on_adversarial_ties(case):
    """Both running top-K sets of select.py (held a row per thread at K <= THREAD_SLOTS: the ordered
    keys and the order of insertion; shared by a row's threads above: the packed keys, the threshold
    gate and the rounds): exact ties go to the lower index at every width, in both slot orders, with
    and without a mask (a masked candidate ranks after every unmasked one, lower index first)."""
    queries, keys = adversarial_tie_inputs(case)
    generator = torch.Generator().manual_seed(22)
    masks = [None, (torch.rand(2, 17, 150, generator=generator) > 0.5).to(DEVICE)]
    for k in (1, 8, 13, 64):
        for mask in masks:
            for similarity, index_order in (("dot", False), ("l1", True)):
                got = select_forward(queries, keys, k, similarity, mask, index_order)
                want = ops.knn_select.default._op_dk(GENERIC, queries, keys, k, similarity, mask, index_order)
                assert torch.equal(got[1], want[1]), (case, k, mask is not None, similarity)
                assert torch.equal(got[0], want[0]) if similarity == "dot" else True


def test_select_both_sets_serve_tiles_that_rows_enter_many_times_never_and_a_few_times():
    """A first tile every row enters, a second that no row enters (every score 0, below the sets'),
    a third that a few rows enter a few times: the set held per thread (K <= 16) and the shared set's
    gate and rounds (K = 32) give the generic path's indices and scores."""
    generator = torch.Generator().manual_seed(23)
    queries = torch.randint(-3, 4, (1, 32, 6), generator=generator).float()
    keys = torch.randint(-3, 4, (1, 200, 6), generator=generator).float()
    keys[0, 64:128] *= 0  # the second tile: every score 0 (below the set's) — no row enters
    keys[0, 128:133] = queries[0, :5].repeat(1, 1) * 4  # the third: a few rows enter a few times
    for k in (4, 8, 16, 32):
        got = select_forward(queries.to(DEVICE), keys.to(DEVICE), k, "dot", None, False)
        want = ops.knn_select.default._op_dk(GENERIC, queries.to(DEVICE), keys.to(DEVICE), k, "dot", None, False)
        assert torch.equal(got[1], want[1]), k
        assert torch.equal(got[0], want[0]), k


def test_the_set_held_per_thread_moves_tied_members_down_in_index_order():
    """select.py's _insert: equal keys fill the slots lowest index first; a later, larger key goes
    above them and each tied member moves down one slot, so the one that drops out is the highest
    index, whether the newcomer is in the same tile or a later one; a second newcomer of the same key
    goes below the first. 35 rows: the second program's rows past N read nothing."""
    queries = torch.ones(1, 35, 4)
    keys = torch.zeros(1, 40, 4)  # every score 0 ...
    keys[0, 9, 0] = -1.0          # ... but one below the rest,
    keys[0, 12, 0] = 1.0          # one above it in the first tile,
    keys[0, 20, 0] = 1.0          # its equal in the second,
    keys[0, 35, 0] = 2.0          # and the best last
    for k, want in ((8, [35, 12, 20, 0, 1, 2, 3, 4]), (16, [35, 12, 20, 0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 14])):
        got = select_forward(queries.to(DEVICE), keys.to(DEVICE), k, "dot", None, False)
        assert (got[1].cpu() == torch.tensor(want)).all(), (k, got[1][0, 0])
        generic = ops.knn_select.default._op_dk(GENERIC, queries.to(DEVICE), keys.to(DEVICE), k, "dot", None, False)
        assert torch.equal(got[1], generic[1]) and torch.equal(got[0], generic[0])


def one_float_past_a_16_byte_boundary(t):
    """A contiguous copy of t (float32) whose data starts 4 bytes past a 16-byte boundary."""
    buffer = torch.empty(t.numel() + 4, dtype=t.dtype, device=t.device)
    start = next(i for i in range(4) if (buffer.data_ptr() + 4 * i) % 16 == 4)
    placed = buffer[start:start + t.numel()].view(t.shape)
    placed.copy_(t)
    return placed


@pytest.mark.parametrize("similarity", ["dot", "scaled_dot", "cosine"])
def test_aligned_whole_chunk_rows_load_as_vectors_and_give_the_bits_of_the_masked_loads(similarity):
    """select._dot_keys and row_chunks.py: rows that start on 16-byte boundaries and hold whole
    chunks (D = 16, 32 features; C = 16 value channels) load as unmasked vectors, the rows and
    candidates past N and M reading row 0; the same values 4 bytes past a boundary take the masked
    loads. On integer-valued features full of ties, N and M not multiples of the 32 rows and 16
    candidates of a program, with each mask kind and short rows: the two give the same bits (select;
    the fused attention forward, whose aggregation holds a row's slots as columns at K <= 8 and not
    at 13, in both slot orders), and the generic path's indices."""
    for d, k in ((16, 8), (32, 13)):
        queries, keys, generator = select_inputs(torch.float32, g=2, n=37, m=70, d=d, seed=70 + d)
        values, kernel, bias = attention_operands(torch.float32, queries, keys, generator, c=16, k=k)
        shifted = [one_float_past_a_16_byte_boundary(t) for t in (queries, keys, values)]
        assert all(t.data_ptr() % 16 == 0 for t in (queries, keys, values))
        assert all(t.data_ptr() % 16 == 4 for t in shifted)
        for name, mask in select_masks(2, 37, 70, generator).items():
            got = [select_forward(q, kk, k, similarity, mask, False) for q, kk in ((queries, keys), shifted[:2])]
            assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1]), (d, name)
            want = ops.knn_select.default._op_dk(GENERIC, queries, keys, k, similarity, mask, False)
            assert torch.equal(got[0][1], want[1]), (d, name)
            torch.testing.assert_close(got[0][0], want[0], rtol=1e-5, atol=0)
        mask = select_masks(2, 37, 70, generator)["bool [G,N,M] with short rows"]
        for index_order in (False, True):
            fused = [attention_forward(q, kk, v, kernel, bias, k, similarity, mask, index_order, "softmax", 0.5)
                     for q, kk, v in ((queries, keys, values), shifted)]
            assert all(torch.equal(a, b) for a, b in zip(*fused)), (d, index_order)
            args = (queries, keys, values, kernel, bias, k, similarity, mask, index_order, "softmax", 0.5)
            assert_attention_equal(fused[0], generic_attention(*args), torch.float32, f"D = {d} {index_order}")


@pytest.mark.parametrize("k", [1, 8, 13])
def test_the_two_selection_designs_give_the_same_indices_and_scores(k):
    """select.design: the set held a row per thread (what the launchers take at K <= THREAD_SLOTS) and
    the set shared by a row's threads (SHARED_SET, which scripts/gpu_bench.py times beside it), on
    integer-valued inputs full of exact ties, with and without a bool mask: bit for bit, both kernels
    (select and the fused attention forward), as each launches in gpu_bench."""
    queries, keys, generator = select_inputs(torch.float32, g=2, n=37, m=150, d=5, seed=66)
    mask = (torch.rand(37, 150, generator=generator) > 0.4).to(DEVICE)
    values = torch.randn(2, 150, 12, generator=generator).to(DEVICE)
    taps = torch.randn(12, k, generator=generator).to(DEVICE)
    slots = select.slots_for(k)
    for mask_kind, mask_in in ((select.NO_MASK, queries), (select.BOOL_MASK, mask)):
        results = []
        for shared_set in (False, True):
            blocks, _ = select.design(slots, mask_kind, shared_set)
            grid = (triton.cdiv(37, blocks["ROWS"]), 2)
            scores, indices = torch.empty(2, 37, k, device=DEVICE), torch.empty(2, 37, k, dtype=torch.int64, device=DEVICE)
            select._select_kernel[grid](queries, keys, mask_in, scores, indices, 37, 150, 5, k, 0, 1, 1.0, 0,
                                        *layouts(queries, keys), SIMILARITY=0, MASK=mask_kind, SLOTS=slots, FEATURES=16,
                                        **blocks)
            outputs = [torch.empty(2, 37, size, device=DEVICE) for size in (12, k, k)]
            chosen = torch.empty(2, 37, k, dtype=torch.int64, device=DEVICE)
            attention._attention_kernel[grid](queries, keys, values, taps, values, mask_in, outputs[0], outputs[1], chosen,
                                              outputs[2], 37, 150, 5, 12, k, 0, 1, 1.0,
                                              attention.RHO_CODES["softmax"], 1.0, 0, 0, 0,
                                              *layouts(queries, keys, values, outputs[0]), SIMILARITY=0,
                                              MASK=mask_kind, SLOTS=slots, FEATURES=16,
                                              CHANNELS=attention.forward_channels(slots, shared_set), **blocks)
            results.append((scores, indices, chosen, *outputs))
        for name, a, b in zip(("scores", "indices", "attention indices", "output", "attention scores", "weights"),
                              *results):
            assert torch.equal(a, b), (name, k, mask_kind)
        want = ops.knn_select.default._op_dk(GENERIC, queries, keys, k, "dot",
                                             None if mask_kind == select.NO_MASK else mask, False)
        assert torch.equal(results[0][1], want[1]) and torch.equal(results[0][0], want[0])


def test_gpu_bench_launches_both_selection_designs(monkeypatch):
    """scripts/gpu_bench.py's comparison of the two designs, its launches run here (its timer replaced:
    CUDA events need a GPU), so that a GPU session does not spend device time on a broken launch. Its
    inputs are Gaussian: here numpy's float32 matmul (the interpreter's tl.dot) rounds scores apart
    between the designs' tile shapes (in 41 of these 80 rows), so bitwise agreement is the test
    above's, on integers; the indices agree."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "scripts/gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []
    monkeypatch.setattr(bench, "timed", lambda fn: (calls.append(fn()), 0.0))
    row = bench.selection_designs(2, 40, 16, 8, torch.device(DEVICE))
    assert len(calls) == 4
    assert {"select_per_thread_ms", "select_shared_ms", "attention_per_thread_ms", "attention_shared_ms"} <= row.keys()
    assert row["index_rows_apart"] == 0 and 0 <= row["rows_apart"] <= 80


def select_backward_inputs(dtype, similarity, seed, m=20, integer=False):
    """Queries [2,9,5], keys [2,m,5] and a bool mask with a row of fewer valid candidates than K = 6
    (masked slots, score -inf), the generic path's selection, and an incoming gradient. Small
    values for the distances, whose scores exp(-distance) would otherwise vanish."""
    generator = torch.Generator().manual_seed(seed)
    if integer:
        queries = torch.randint(-3, 4, (2, 9, 5), generator=generator).to(DEVICE, dtype)
        keys = torch.randint(-3, 4, (2, m, 5), generator=generator).to(DEVICE, dtype)
    else:
        scale = 0.3 if similarity in ("gaussian", "chebyshev", "l1") else 1.0
        queries = (torch.randn(2, 9, 5, generator=generator) * scale).to(DEVICE, dtype)
        keys = (torch.randn(2, m, 5, generator=generator) * scale).to(DEVICE, dtype)
    mask = torch.rand(2, 9, m, generator=generator) > 0.2
    mask[1, 2, :] = False
    mask[1, 2, 3:5] = True
    scores, indices = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, similarity, mask.to(DEVICE), False)
    grad_scores = torch.randn(2, 9, 6, generator=generator).to(DEVICE, dtype)
    return grad_scores, queries, keys, indices, scores


def generic_select_backward(*args):
    return ops.knn_select_backward.default._op_dk(GENERIC, *args)


@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_select_backward_equals_the_generic_path_and_masked_slots_get_nothing(similarity, dtype):
    """Every similarity (the dot products through the aggregation kernels with a kernel of ones,
    the others through the pair-gradient kernels); masked slots pass no gradient."""
    args = select_backward_inputs(dtype, similarity, seed=18)
    got = select_backward(*args, similarity)
    want = generic_select_backward(*args, similarity)
    tolerance = TOLERANCE[dtype]
    for name, a, b in zip(("queries", "keys"), got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=tolerance, atol=tolerance,
                                   msg=lambda m, name=name: f"{similarity} {name}: {m}")


def test_select_backward_of_chebyshev_takes_the_first_feature_of_largest_difference():
    """Integer features: |q - k| ties between features in many pairs (exact in float32); as the C++
    policy, only the first of them carries the gradient: the same features get a gradient on both
    paths, of the same value to rounding."""
    args = select_backward_inputs(torch.float32, "chebyshev", seed=23, integer=True)
    got = select_backward(*args, "chebyshev")
    want = generic_select_backward(*args, "chebyshev")
    for a, b in zip(got, want):
        assert torch.equal(a != 0, b != 0)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("similarity", ["cosine", "l1"])
def test_select_backward_is_bitwise_repeatable(similarity):
    args = select_backward_inputs(torch.float32, similarity, seed=24)
    first = select_backward(*args, similarity)
    second = select_backward(*args, similarity)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_pair_gradient_kernels_write_every_element_once_and_no_guard_byte_changes():
    """The query and key gradients of the pair-gradient kernels start as NaN inside canary guards;
    inputs sit between NaN guards."""
    from convnn._triton import pair_gradients

    grad_scores, queries, keys, indices, scores = select_backward_inputs(torch.float32, "gaussian", seed=25)
    queries, keys = between_nan_guards(queries, keys)
    live = grad_scores.masked_fill(scores == float("-inf"), 0)
    coefficients = torch.empty(2 * 9 * 6, pair_gradients.COEFFICIENTS, device=DEVICE)
    arg = torch.empty(2 * 9 * 6, dtype=torch.int32, device=DEVICE)
    blocks = dict(SIMILARITY=3, FEATURES=pair_gradients.FEATURES, ACC=tl.float32)
    row_blocks = triton.cdiv(18, pair_gradients.ROWS)
    pair_gradients._pair_coefficients_kernel[(row_blocks, 6)](queries, keys, indices, live, coefficients, arg, 18, 9, 20, 5, 6,
                                                     1e-8, ROWS=pair_gradients.ROWS, **blocks)
    canary = 4321.0
    query_buffer, grad_queries = guarded((2, 9, 5), torch.float32, canary)
    grad_queries.fill_(float("nan"))
    pair_gradients._query_gradient_kernel[(row_blocks, 1)](queries, keys, indices, coefficients, arg, grad_queries,
                                                  18, 9, 20, 5, 6, ROWS=pair_gradients.ROWS, **blocks)
    key_buffer, grad_keys = guarded((2, 20, 5), torch.float32, canary)
    grad_keys.fill_(float("nan"))
    order, run_start = inverse_index(indices, 20)
    pair_gradients._key_gradient_kernel[(40, 1)](queries, keys, coefficients, arg, order, run_start, grad_keys, 5, 6,
                                                 **blocks)
    for buffer, gradient in ((query_buffer, grad_queries), (key_buffer, grad_keys)):
        assert not gradient.isnan().any()
        assert (buffer[:64] == canary).all() and (buffer[-64:] == canary).all()
    want = generic_select_backward(grad_scores, queries, keys, indices, scores, "gaussian")
    torch.testing.assert_close(grad_queries, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_keys, want[1], rtol=1e-5, atol=1e-6)


def test_the_select_backward_cuda_kernel_covers_every_similarity():
    """The dot products through the aggregation kernels, the others through the pair-gradient ones."""
    queries, keys, _ = select_inputs(torch.float32, m=20, seed=19)
    for similarity in ("scaled_dot", "cosine", "l1"):
        scores, indices = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, similarity, None, False)
        select_backward(torch.ones_like(scores), queries, keys, indices, scores, similarity)  # the first-call check
        with launches_recorded() as launched:
            got = select_backward(torch.ones_like(scores), queries, keys, indices, scores, similarity)
        want = generic_select_backward(torch.ones_like(scores), queries, keys, indices, scores, similarity)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        expected = (["forward float32", "d values float32"] if similarity == "scaled_dot" else
                    [f"select backward {kind} {similarity}" for kind in ("coefficients", "d queries", "d keys")])
        assert launched == expected, similarity


# The paper's identities (docs/operator.md) through the kernels: each composes the Triton select, rho
# and the Triton aggregation, as knn_attention's CUDA composition does
# (src/ops/composite/knn_attention_composed.cpp), and compares with what the identity says it equals.


def grid_coordinates(rows, columns, offset=0):
    """[rows*columns, 2] float32 (row, column) coordinates of a grid, raster order."""
    r, c = torch.meshgrid(torch.arange(rows) + offset, torch.arange(columns) + offset, indexing="ij")
    return torch.stack([r, c], -1).reshape(-1, 2).float()


@pytest.mark.parametrize("radius", [1, 3, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_identity_convolution_recovery_through_the_kernels(radius, kind):
    """Spatial coordinates only, chebyshev, K = R^2, index order, uniform rho: the K nearest of each
    pixel in the zero-padded grid are its R x R window in raster order, so the aggregation with the
    convolution's weights as kernel is conv2d with 'same' padding (depthwise: groups = C), and its
    gradients are the convolution's."""
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(40 + radius)
    b, c, h, w, pad = 2, 3, 5, 6, radius // 2
    x = torch.randn(b, c, h, w, generator=generator, dtype=torch.float64)
    standard = kind == "standard"
    weight = torch.randn(4 if standard else c, c if standard else 1, radius, radius, generator=generator,
                         dtype=torch.float64)
    bias = torch.randn(weight.shape[0], generator=generator, dtype=torch.float64)
    padded = F.pad(x, (pad, pad, pad, pad))
    values = padded.flatten(2).transpose(1, 2).contiguous()  # [B, (H+2p)(W+2p), C]
    keys = grid_coordinates(h + 2 * pad, w + 2 * pad).expand(b, -1, -1).contiguous()
    queries = grid_coordinates(h, w, offset=pad).expand(b, -1, -1).contiguous()
    k = radius * radius
    scores, indices = select_forward(queries.to(DEVICE), keys.to(DEVICE), k, "chebyshev", None, True)
    weights = torch.ones(b, h * w, k, device=DEVICE)  # uniform: every valid slot 1
    kernel = weight.reshape(weight.shape[0], c, k) if standard else weight.reshape(c, k)
    # The kernels in float32 against the float64 convolution: float32 rounding of K * C terms.
    as_float = dict(device=DEVICE, dtype=torch.float32)
    output = aggregate_forward(values.to(**as_float), weights, indices, kernel.to(**as_float), bias.to(**as_float))
    padded.requires_grad_(True)
    weight.requires_grad_(True)
    expected = F.conv2d(padded, weight, bias, groups=1 if standard else c)
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(output.cpu().double(), expected.detach().flatten(2).transpose(1, 2), **close)
    grad_output = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    expected.backward(grad_output)
    grad_values, _, grad_kernel, grad_bias = aggregate_backward(
        grad_output.flatten(2).transpose(1, 2).contiguous().to(**as_float), values.to(**as_float), weights, indices,
        kernel.to(**as_float), [True, False, True, True])
    torch.testing.assert_close(grad_values.cpu().double(), padded.grad.flatten(2).transpose(1, 2), **close)
    torch.testing.assert_close(grad_kernel.cpu().double(), weight.grad.reshape(kernel.shape), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad_bias.cpu().double(), grad_output.sum((0, 2, 3)), rtol=1e-5, atol=1e-4)


def attention_inputs(seed, g=3, n=20, d=8):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(g, n, d, generator=generator).to(DEVICE) for _ in range(3))


def aggregate_with_softmax(queries, keys, values, k):
    """Triton select (scaled_dot), softmax rho, Triton aggregation with a depthwise kernel of ones."""
    scores, indices = select_forward(queries, keys, k, "scaled_dot", None, False)
    weights = torch.softmax(scores, dim=-1)
    ones = torch.ones(values.shape[2], k, device=DEVICE)
    return aggregate_forward(values, weights.contiguous(), indices, ones, None)


def test_identity_attention_when_k_equals_n_through_the_kernels():
    """K = N, scaled_dot, softmax rho, a kernel of ones: softmax(Q K^T / sqrt(d)) V."""
    queries, keys, values = attention_inputs(41)
    output = aggregate_with_softmax(queries, keys, values, k=20)
    expected = torch.softmax(queries @ keys.transpose(1, 2) / 8 ** 0.5, dim=-1) @ values
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


def test_identity_kvt_top_k_attention_through_the_kernels():
    """K < N: softmax over each query's K largest scores only (KVT's k-NN attention)."""
    queries, keys, values = attention_inputs(42)
    output = aggregate_with_softmax(queries, keys, values, k=5)
    scores = queries @ keys.transpose(1, 2) / 8 ** 0.5
    kth = scores.topk(5, dim=-1).values[..., -1:]
    expected = torch.softmax(scores.masked_fill(scores < kth, float("-inf")), dim=-1) @ values
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


# knn_attention's fused forward (python/convnn/_triton/attention.py): select, rho and a depthwise
# aggregation in one kernel, against the device-generic knn_attention.
RHOS = ["uniform", "mean", "softmax"]


def generic_attention(*args):
    return ops.knn_attention.default._op_dk(GENERIC, *args)


def assert_attention_equal(got, want, dtype, what):
    """Indices exactly; the rest to float32 rounding (Triton's exp is not the C++ one), or one
    unit in the last place of half precision (a weight rounded the other way)."""
    assert torch.equal(got[2], want[2]), f"{what}: indices"
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for name, a, b in zip(("output", "scores", "weights"), (got[0], got[1], got[3]), (want[0], want[1], want[3])):
        assert a.dtype == b.dtype, f"{what}: {name} dtype"
        torch.testing.assert_close(a.double(), b.double(), rtol=tolerance, atol=tolerance, equal_nan=True,
                                   msg=lambda m: f"{what}: {name}: {m}")


def attention_operands(dtype, queries, keys, generator, c=6, k=6):
    g, m = keys.shape[:2]
    values = torch.randn(g, m, c, generator=generator).to(DEVICE, dtype)
    kernel = torch.randn(c, k, generator=generator).to(DEVICE, dtype)
    bias = torch.randn(c, generator=generator).to(DEVICE, dtype)
    return values, kernel, bias


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_fused_attention_equals_the_generic_path_with_every_mask_order_and_bias(similarity, rho):
    """float32 and bfloat16 on integer-valued features (D = 4: scaled_dot divides by 2, so every
    score is exact in both), masks with rows of fewer valid candidates than K and a row with none,
    both slot orders. The bias is added after the aggregation, apart from the selection and the
    order: each mask runs once with it and once without, by slot order (the interpreter's time is
    per launch; every pair of them was half of this file's)."""
    for dtype in (torch.float32, torch.bfloat16):
        queries, keys, generator = select_inputs(dtype, d=4)
        values, kernel, bias = attention_operands(dtype, queries, keys, generator)
        for name, mask in select_masks(2, 9, 70, generator).items():
            mask = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
            for index_order, b in ((False, None), (True, bias)):
                args = (queries, keys, values, kernel, b, 6, similarity, mask, index_order, rho, 0.7)
                assert_attention_equal(attention_forward(*args), generic_attention(*args), dtype,
                                       f"{similarity} {rho} {dtype} {name} index_order={index_order} "
                                       f"bias={b is not None}")


@pytest.mark.parametrize("k", [1, 9, 64])
def test_fused_attention_at_every_k_the_kernel_holds_and_in_float16(k):
    """Three row blocks, two candidate tiles, more channels than one aggregation step."""
    for dtype in (torch.float32, torch.float16):
        queries, keys, generator = select_inputs(dtype, g=1, n=33, m=80, d=4, seed=50)
        values, kernel, bias = attention_operands(dtype, queries, keys, generator, c=40, k=k)
        for similarity, rho in (("scaled_dot", "softmax"), ("gaussian", "mean")):
            args = (queries, keys, values, kernel, bias, k, similarity, None, True, rho, 1.5)
            assert_attention_equal(attention_forward(*args), generic_attention(*args), dtype,
                                   f"K={k} {dtype} {similarity}")


def test_fused_attention_on_random_features_equals_the_generic_path():
    """Random float32 features, no ties: the same neighbours, weights and output to rounding."""
    generator = torch.Generator().manual_seed(51)
    queries, keys = (torch.randn(2, 20, 16, generator=generator).to(DEVICE) for _ in range(2))
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator, c=8, k=7)
    args = (queries, keys, values, kernel, bias, 7, "cosine", None, False, "softmax", 0.1)
    assert_attention_equal(attention_forward(*args), generic_attention(*args), torch.float32, "cosine")


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # numpy inside the interpreter
def test_fused_attention_gives_nan_rows_where_a_score_is_nan_or_plus_inf_and_leaves_the_others():
    queries, keys, generator = select_inputs(torch.float32, d=4, seed=52)
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator)
    queries[0, 3, 1] = float("nan")
    mask = torch.zeros(2, 9, 70, device=DEVICE)
    mask[1, 5, 66] = float("inf")
    got = attention_forward(queries, keys, values, kernel, bias, 6, "dot", mask, False, "softmax", 1.0)
    for t in (got[0], got[1], got[3]):
        assert t[0, 3].isnan().all() and t[1, 5].isnan().all()
        assert not t[0, :3].isnan().any() and not t[1, 6:].isnan().any()
    # The generic path on a CPU tensor reads the values and raises: compare the other rows with a clean call.
    clean_queries, clean_mask = queries.nan_to_num(0.0), mask.clamp_max(0.0)
    want = generic_attention(clean_queries, keys, values, kernel, bias, 6, "dot", clean_mask, False, "softmax", 1.0)
    rows = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
    rows[0, 3] = rows[1, 5] = False
    assert torch.equal(got[2][rows], want[2][rows])
    torch.testing.assert_close(got[0][rows], want[0][rows], rtol=1e-5, atol=1e-5)


def test_fused_attention_writes_every_output_element_once_and_no_guard_byte_changes():
    """Three row blocks, two channel steps; inputs between NaN guards, outputs NaN-filled inside
    canary guards; index order and bias on (the scattered stores and the bias load)."""
    queries, keys, generator = select_inputs(torch.float32, n=40, d=4, seed=53)
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator, c=40, k=6)
    mask = torch.where(torch.rand(40, 70, generator=generator) > 0.5, 0.0, float("-inf")).to(DEVICE)
    queries, keys, values, kernel, bias, mask = between_nan_guards(queries, keys, values, kernel, bias, mask)
    canary = 777.0
    buffers, outputs = zip(*(guarded(shape, torch.float32, canary) for shape in ((2, 40, 40), (2, 40, 6), (2, 40, 6))))
    for t in outputs:
        t.fill_(float("nan"))
    index_buffer = torch.full((2 * 40 * 6 + 128,), -5, dtype=torch.int64, device=DEVICE)
    indices = index_buffer[64:-64].view(2, 40, 6)
    indices.fill_(-1)
    output, scores, weights = outputs
    rows = select.rows_for(8)
    attention._attention_kernel[(triton.cdiv(40, rows), 2)](
        queries, keys, values, kernel, bias, mask, output, scores, indices, weights,
        40, 70, 4, 40, 6, 0, 1, 1.0, attention.RHO_CODES["softmax"], 1.0, 1, 1, 0,
        *layouts(queries, keys, values, output), SIMILARITY=0, MASK=select.ADDITIVE_MASK, ROWS=rows,
        CANDIDATES=select.candidates_for(6, select.ADDITIVE_MASK),
        SLOTS=8, FEATURES=16, CHANNELS=attention.forward_channels(8))
    for t in outputs:
        assert not t.isnan().any()
    assert (indices >= 0).all()
    for buffer in buffers:
        assert (buffer[:64] == canary).all() and (buffer[-64:] == canary).all()
    assert (index_buffer[:64] == -5).all() and (index_buffer[-64:] == -5).all()
    want = generic_attention(queries, keys, values, kernel, bias, 6, "dot", mask, True, "softmax", 1.0)
    assert_attention_equal((output, scores, indices, weights), want, torch.float32, "guarded")


class _HostConversions(TorchDispatchMode):
    """The dtypes that ATen converts tensors to outside the kernels' launches (the interpreter's own
    copies while a kernel runs are not the launcher's)."""

    def __init__(self):
        super().__init__()
        self.targets, self.launching = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.aten._to_copy and not self.launching:
            self.targets.append(kwargs.get("dtype"))
        return func(*args, **kwargs)


@contextlib.contextmanager
def host_conversions(monkeypatch):
    """The dtypes ATen converts tensors to inside the block, outside the kernels' launches."""
    conversions = _HostConversions()
    launch = register.run

    def run(*arguments):
        conversions.launching.append(1)
        try:
            launch(*arguments)
        finally:
            conversions.launching.pop()

    monkeypatch.setattr(register, "run", run)
    with conversions:
        yield conversions.targets


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_outputs_are_written_by_the_kernels_without_a_float32_copy(dtype, monkeypatch):
    """issue 38 §1: the fused attention kernel writes its output, scores and weights (and the select
    kernel its scores) in bfloat16/float16 directly, and reads their inputs as they are (a kernel
    per dtype of select.INPUT_DTYPES): the launchers convert nothing, before or after, and the
    results are the generic path's."""
    queries, keys, generator = select_inputs(dtype, d=4)
    values, kernel, bias = attention_operands(dtype, queries, keys, generator)
    arguments = (queries, keys, values, kernel, bias, 6, "scaled_dot", None, True, "softmax", 1.0)
    attention_forward(*arguments)  # the first-call checks, before counting
    select_forward(queries, keys, 6, "l1", None, False)
    with host_conversions(monkeypatch) as conversions:
        got = attention_forward(*arguments)
        selected = select_forward(queries, keys, 6, "l1", None, False)
    assert conversions == [], f"the launchers converted tensors to {conversions}"
    assert all(t.dtype == dtype for t in (got[0], got[1], got[3], selected[0]))
    assert_attention_equal(got, generic_attention(*arguments), dtype, "half precision read in registers")
    want = ops.knn_select.default._op_dk(GENERIC, queries, keys, 6, "l1", None, False)
    assert torch.equal(selected[1], want[1])
    torch.testing.assert_close(selected[0], want[0], rtol=1e-2, atol=1e-2)  # Triton's exp against the C++ one


def test_a_rho_code_no_branch_knows_gives_nan_weights_not_another_rhos():
    """rho is a runtime argument of the fused kernel: a code past RHO_CODES (which the C++ launcher's
    switch cannot send) takes no rho's arithmetic but NaN weights, which every check catches."""
    queries, keys, generator = select_inputs(torch.float32, n=16, d=4, seed=56)
    values, kernel, _ = attention_operands(torch.float32, queries, keys, generator, c=8, k=6)
    output, scores, weights = (torch.empty(2, 16, size, device=DEVICE) for size in (8, 6, 6))
    indices = torch.empty(2, 16, 6, dtype=torch.int64, device=DEVICE)
    attention._attention_kernel[(triton.cdiv(16, select.rows_for(8)), 2)](
        queries, keys, values, kernel, values, queries, output, scores, indices, weights,
        16, 70, 4, 8, 6, 0, 1, 1.0, len(attention.RHO_CODES), 1.0, 0, 0, 0,
        *layouts(queries, keys, values, output), SIMILARITY=0, MASK=select.NO_MASK, ROWS=select.rows_for(8),
        CANDIDATES=select.candidates_for(6, select.NO_MASK),
        SLOTS=8, FEATURES=16, CHANNELS=attention.forward_channels(8))
    assert weights.isnan().all()


# The composed forward's rho and aggregation in one kernel (attention._rho_aggregate_kernel), after a
# select of its own: against the generic knn_attention on the same scores and indices.
def rho_aggregate(scores, indices, values, kernel, bias, rho, temperature):
    return through_kernels(ops.knn_attention_rho_aggregate_device_fused.default, scores, indices, values, kernel,
                           bias, rho, temperature)


@pytest.mark.parametrize("rho", RHOS)
def test_rho_aggregate_gives_the_generic_weights_and_output_and_the_aggregations_bits(rho):
    """On the generic select's scores and indices (integer features, masks with short rows and a row
    with no valid candidate, both slot orders): the generic knn_attention's weights and output to the
    rounding of Triton's exp against ATen's, and the output knn_aggregate's kernel gives on the
    kernel's own weights, bit for bit (the same products in the same order). float32, bfloat16 and
    float16; with a bias in one slot order, without in the other."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        queries, keys, generator = select_inputs(dtype, d=4, seed=60)
        values, kernel, bias = attention_operands(dtype, queries, keys, generator)
        for name, mask in select_masks(2, 9, 70, generator).items():
            mask = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
            for index_order, b in ((False, None), (True, bias)):
                what = f"{rho} {dtype} {name} index_order={index_order}"
                want = generic_attention(queries, keys, values, kernel, b, 6, "scaled_dot", mask, index_order, rho,
                                         0.7)
                output, weights = rho_aggregate(want[1], want[2], values, kernel, b, rho, 0.7)
                assert_attention_equal((output, want[1], want[2], weights), want, dtype, what)
                assert torch.equal(output, aggregate_forward(values, weights, want[2], kernel, b)), what


@pytest.mark.parametrize("k", [1, 9, 64])
def test_rho_aggregate_at_every_k_the_kernel_holds(k):
    """Two row blocks, five steps of a thread's 8 value channels (40), slots summed as columns
    (K <= 8) or one at a time (wider)."""
    queries, keys, generator = select_inputs(torch.float32, g=2, n=33, m=80, d=4, seed=61)
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator, c=40, k=k)
    want = generic_attention(queries, keys, values, kernel, bias, k, "dot", None, False, "softmax", 1.5)
    output, weights = rho_aggregate(want[1], want[2], values, kernel, bias, "softmax", 1.5)
    assert_attention_equal((output, want[1], want[2], weights), want, torch.float32, f"K={k}")
    assert torch.equal(output, aggregate_forward(values, weights, want[2], kernel, bias)), f"K={k}"


@pytest.mark.parametrize("rho", RHOS)
def test_rho_aggregate_gives_nan_rows_where_the_select_could_not_rank_and_reads_nothing_there(rho):
    """A row of NaN scores (the select's unrankable row) with indices far past the candidates: its
    weights and output are NaN and its indices are not read; every other row is the clean call's bit
    for bit."""
    queries, keys, generator = select_inputs(torch.float32, d=4, seed=62)
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator)
    _, scores, indices, _ = generic_attention(queries, keys, values, kernel, bias, 6, "dot", None, False, rho, 1.0)
    clean = rho_aggregate(scores, indices, values, kernel, bias, rho, 1.0)
    scores, indices = scores.clone(), indices.clone()
    scores[1, 4] = float("nan")
    indices[1, 4] = 1 << 40
    got = rho_aggregate(scores, indices, values, kernel, bias, rho, 1.0)
    others = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
    others[1, 4] = False
    for name, a, b in (("output", got[0], clean[0]), ("weights", got[1], clean[1])):
        assert a[1, 4].isnan().all(), name
        assert torch.equal(a[others], b[others]), name


def test_rho_aggregate_answers_nothing_where_the_kernel_does_not_apply_and_refuses_bad_inputs(monkeypatch):
    """A standard kernel [C',C,K], float64, K above the widest running top-K and
    CONVNN_CUDA_KERNELS=generic: no tensors (the composition runs rho and knn_aggregate), the path log
    saying why; inputs the op's rules refuse raise naming the argument."""
    queries, keys, generator = select_inputs(torch.float32, d=4, seed=63)
    values, kernel, _ = attention_operands(torch.float32, queries, keys, generator)
    _, scores, indices, _ = generic_attention(queries, keys, values, kernel, None, 6, "dot", None, False, "mean", 1.0)
    fused = ops.knn_attention_rho_aggregate_device_fused.default._op_dk
    standard = torch.randn(4, 6, 6, generator=generator).to(DEVICE)
    with convnn.cuda_paths() as paths:
        assert fused(CUDA, scores, indices, values, standard, None, "mean", 1.0) == []
        assert fused(CUDA, scores.double(), indices, values.double(), kernel.double(), None, "mean", 1.0) == []
    assert paths[0].startswith("knn_attention (rho and aggregation): ATen path: a standard kernel"), paths
    wide = torch.zeros(2, 9, 65, dtype=torch.long, device=DEVICE)
    assert fused(CUDA, torch.zeros(2, 9, 65, device=DEVICE), wide, values, torch.randn(6, 65).to(DEVICE), None,
                 "uniform", 1.0) == []
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    assert fused(CUDA, scores, indices, values, kernel, None, "mean", 1.0) == []
    monkeypatch.delenv("CONVNN_CUDA_KERNELS")
    with pytest.raises(RuntimeError, match=r"knn_attention_rho_aggregate_device_fused: scores and indices must have "
                                           r"the same shape"):
        fused(CUDA, scores[:, :5], indices, values, kernel, None, "mean", 1.0)
    with pytest.raises(RuntimeError, match="knn_attention_rho_aggregate_device_fused: rho"):
        fused(CUDA, scores, indices, values, kernel, None, "max", 1.0)
    with pytest.raises(RuntimeError, match="knn_attention_rho_aggregate_device_fused: temperature"):
        fused(CUDA, scores, indices, values, kernel, None, "softmax", 0.0)


def test_identity_attention_when_k_equals_n_through_the_fused_kernel():
    queries, keys, values = attention_inputs(54)
    ones = torch.ones(values.shape[2], 20, device=DEVICE)
    output = attention_forward(queries, keys, values, ones, None, 20, "scaled_dot", None, False,
                                         "softmax", 1.0)[0]
    expected = torch.softmax(queries @ keys.transpose(1, 2) / 8 ** 0.5, dim=-1) @ values
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("radius", [1, 3, 5])
def test_identity_depthwise_convolution_recovery_through_the_fused_kernel(radius):
    """Coordinates only, chebyshev, K = R^2, index order, uniform rho, the depthwise convolution's
    weights as kernel: conv2d with 'same' padding and groups = C, in float32."""
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(60 + radius)
    b, c, h, w, pad = 2, 3, 5, 6, radius // 2
    x = torch.randn(b, c, h, w, generator=generator)
    weight = torch.randn(c, 1, radius, radius, generator=generator)
    bias = torch.randn(c, generator=generator)
    padded = F.pad(x, (pad, pad, pad, pad))
    values = padded.flatten(2).transpose(1, 2).contiguous()
    keys = grid_coordinates(h + 2 * pad, w + 2 * pad).expand(b, -1, -1).contiguous()
    queries = grid_coordinates(h, w, offset=pad).expand(b, -1, -1).contiguous()
    k = radius * radius
    output = attention_forward(queries.to(DEVICE), keys.to(DEVICE), values.to(DEVICE),
                                         weight.reshape(c, k).to(DEVICE), bias.to(DEVICE), k, "chebyshev", None,
                                         True, "uniform", 1.0)[0]
    expected = F.conv2d(padded, weight, bias, groups=c).flatten(2).transpose(1, 2)
    torch.testing.assert_close(output.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_the_rho_codes_are_the_cpp_rho_names():
    assert list(attention.RHO_CODES) == list(ops.rho_names())
    assert list(attention.RHO_CODES.values()) == list(range(len(attention.RHO_CODES)))


def test_the_similarity_codes_are_the_cpp_similarity_names_in_enum_order():
    """The kernels' codes (similarities.py) are the C++ enum's order, which the C++ launchers name
    their embedded kernels by; pair_gradients serves the four that are not plain dot products."""
    assert similarities.NAMES == tuple(ops.similarity_names())
    assert select.SIMILARITY_CODES == {name: code for code, name in enumerate(ops.similarity_names())}
    assert set(pair_gradients.SIMILARITY_CODES) == set(similarities.NAMES) - {"dot", "scaled_dot"}


def test_an_unknown_similarity_code_is_refused_when_the_kernel_is_built():
    """A code that no similarity has (a seventh similarity added to the C++ enum but not to the
    kernels) fails the kernel's compilation instead of taking another similarity's arithmetic."""
    queries, keys, _ = select_inputs(torch.float32, n=3, m=10)
    scores = torch.empty(2, 3, 2, device=DEVICE)
    indices = torch.empty(2, 3, 2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(Exception, match="unknown similarity code 6"):
        select._select_kernel[(1, 2)](queries, keys, queries, scores, indices, 3, 10, 5, 2, 0, 1, 1.0, 0,
                                      *layouts(queries, keys), SIMILARITY=len(similarities.NAMES), MASK=select.NO_MASK,
                                      ROWS=select.rows_for(select.slots_for(2)),
                                      CANDIDATES=select.candidates_for(2, select.NO_MASK), SLOTS=select.slots_for(2),
                                      FEATURES=16)


def test_the_fused_attention_answers_nothing_where_the_kernel_does_not_apply_and_says_why(monkeypatch):
    """knn_attention_device_fused's CUDA kernel (what the C++ CUDA knn_attention asks first): the fused
    kernel's four outputs where it applies; an empty list (the C++ side composes then) for float64,
    a standard kernel, K above 64 and the generic switch, each with its reason; the C++ shape rules
    with the C++ message."""
    queries, keys, generator = select_inputs(torch.float32, d=4, seed=55)
    values, kernel, bias = attention_operands(torch.float32, queries, keys, generator)
    args = (queries, keys, values, kernel, bias, 6, "l1", None, True, "mean", 1.0)
    got = attention_forward(*args)
    assert len(got) == 4
    assert_attention_equal(got, generic_attention(*args), torch.float32, "registered")
    as_double = tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args)
    standard = torch.randn(4, 6, 6, generator=generator).to(DEVICE)
    wide = attention_operands(torch.float32, queries, keys, generator, k=65)[1]
    fused = ops.knn_attention_device_fused.default._op_dk
    for call_args, why in ((as_double, "dtype Double (the Triton kernels take float32, bfloat16 and float16)"),
                           ((*args[:3], standard, None, *args[5:]), "a standard kernel [C',C,K] (the fused forward "
                                                                    "takes a depthwise [C,K]; the core ops compose)"),
                           ((*args[:3], wide, None, 65, *args[6:]), "K, a size or a grid past the fused kernel's "
                                                                    "limits (K <= 64, 32-bit sizes)")):
        answers = []
        assert reasons(lambda: answers.append(fused(CUDA, *call_args))) == [f"knn_attention: ATen path: {why}"]
        assert answers == [[]]
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    assert fused(CUDA, *args) == []
    monkeypatch.delenv("CONVNN_CUDA_KERNELS")
    with pytest.raises(RuntimeError, match="knn_attention"):
        fused(CUDA, *args[:3], kernel[:, :5], *args[4:])


@pytest.mark.parametrize("similarity", ["scaled_dot", "cosine", "l1"])
def test_fused_softmax_scores_gradient_gives_the_generic_backwards_query_and_key_gradients(similarity):
    """The backward's fused step (the aggregation's weights gradient and the softmax-rho backward in
    one kernel), fed to the generic select backward, gives the generic knn_attention_backward's
    query and key gradients: float32 to rounding, bfloat16 to a few units in the last place of the
    largest gradient (the generic path rounds its weights gradient differently, and sums cancel)."""
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        queries, keys, generator = select_inputs(dtype, d=4, seed=56)
        values, kernel, _ = attention_operands(dtype, queries, keys, generator, c=40, k=6)
        mask = select_masks(2, 9, 70, generator)["bool [G,N,M] with short rows"]
        _, scores, indices, weights = generic_attention(queries, keys, values, kernel, None, 6, similarity, mask,
                                                        False, "softmax", 0.7)
        grad_output = torch.randn(2, 9, 40, generator=generator).to(DEVICE, dtype)
        grad_scores = softmax_scores_gradient(grad_output, values, weights, indices, kernel, 0.7)
        assert grad_scores.dtype == dtype
        got = ops.knn_select_backward.default._op_dk(GENERIC, grad_scores, queries, keys, indices, scores, similarity)
        want = ops.knn_attention_backward.default._op_dk(GENERIC, grad_output, queries, keys, values, kernel, scores,
                                                         indices, weights, similarity, "softmax", 0.7,
                                                         [True, True, False, False, False])
        for name, a, b in zip(("queries", "keys"), got, want[:2]):
            scale = float(b.double().abs().max()) if dtype == torch.bfloat16 else 1.0
            torch.testing.assert_close(a.double(), b.double(), rtol=tolerance, atol=tolerance * scale,
                                       msg=lambda m: f"{similarity} {dtype} d {name}: {m}")


def test_fused_softmax_scores_gradient_writes_every_element_once_and_no_guard_byte_changes():
    queries, keys, generator = select_inputs(torch.float32, n=40, d=4, seed=57)
    values, kernel, _ = attention_operands(torch.float32, queries, keys, generator, c=40, k=6)
    _, _, indices, weights = generic_attention(queries, keys, values, kernel, None, 6, "dot", None, False, "softmax", 1.0)
    grad_output = torch.randn(2, 40, 40, generator=generator).to(DEVICE)
    grad_output, values, kernel, weights = between_nan_guards(grad_output, values, kernel, weights)
    canary = 777.0
    buffer, grad_scores = guarded((2, 40, 6), torch.float32, canary)
    grad_scores.fill_(float("nan"))
    attention._softmax_scores_gradient_kernel[(5,)](
        grad_output, values, kernel, indices, weights, grad_scores, 80, 40, 70, 40, 6, 1.0,
        *layouts(grad_output, values), ROWS=select.ROWS, SLOTS=8, CHANNELS=attention.CHANNELS)
    assert not grad_scores.isnan().any()
    assert (buffer[:64] == canary).all() and (buffer[-64:] == canary).all()
    torch.testing.assert_close(grad_scores, softmax_scores_gradient(grad_output, values, weights, indices,
                                                                              kernel, 1.0))


def test_the_fused_scores_gradient_answers_nothing_where_the_kernel_does_not_apply(monkeypatch):
    queries, keys, generator = select_inputs(torch.float32, d=4, seed=58)
    values, kernel, _ = attention_operands(torch.float32, queries, keys, generator)
    _, _, indices, weights = generic_attention(queries, keys, values, kernel, None, 6, "dot", None, False, "softmax", 1.0)
    grad_output = torch.randn(2, 9, 6, generator=generator).to(DEVICE)
    got = softmax_scores_gradient(grad_output, values, weights, indices, kernel, 1.0)
    assert got.shape == weights.shape
    fused = ops.knn_attention_softmax_scores_gradient_device_fused.default._op_dk
    standard = torch.randn(4, 6, 6, generator=generator).to(DEVICE)
    assert fused(CUDA, grad_output.double(), values.double(), weights.double(), indices, kernel.double(), 1.0) == []
    assert fused(CUDA, grad_output[..., :4], values, weights, indices, standard, 1.0) == []
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    assert fused(CUDA, grad_output, values, weights, indices, kernel, 1.0) == []
    monkeypatch.delenv("CONVNN_CUDA_KERNELS")
    with pytest.raises(RuntimeError, match="knn_aggregate_backward"):
        fused(CUDA, grad_output, values, weights, indices, kernel[:, :5], 1.0)


# knn_attention's backward in two kernels and one sort (python/convnn/_triton/attention_backward.py):
# softmax rho, a depthwise kernel, dot and scaled_dot, against the generic knn_attention_backward.
BACKWARD_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}


def two_kernel_backward_case(dtype, similarity, seed, n=9, m=70, d=5, c=40, k=6, mask="bool [G,N,M] with short rows"):
    """The backward's tensor arguments after the generic forward: integer features (every score exact,
    many ties) and, at 9 x 70, a mask with a row of no valid candidate and one of fewer than K."""
    queries, keys, generator = select_inputs(dtype, n=n, m=m, d=d, seed=seed)
    values, kernel, _ = attention_operands(dtype, queries, keys, generator, c=c, k=k)
    masks = select_masks(2, n, m, generator) if (n, m) == (9, 70) else {}  # the masks are drawn for 9 x 70
    _, scores, indices, weights = generic_attention(queries, keys, values, kernel, None, k, similarity, masks.get(mask),
                                                    False, "softmax", 0.7)
    grad_output = torch.randn(2, n, c, generator=generator).to(DEVICE, dtype)
    return (grad_output, queries, keys, values, kernel, scores, indices, weights)


def assert_gradients_equal(got, want, dtype, what):
    """float32 to rounding; half precision to a few units in the last place of the largest gradient
    (the generic path rounds its weights gradient at another point, and sums cancel)."""
    tolerance = BACKWARD_TOLERANCE[dtype]
    for name, a, b in zip(("queries", "keys", "values", "kernel", "bias"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: d {name} is {a.dtype} {tuple(a.shape)}"
        scale = max(1.0, float(b.double().abs().max()))
        torch.testing.assert_close(a.double(), b.double(), rtol=tolerance, atol=tolerance * scale, equal_nan=True,
                                   msg=lambda m: f"{what}: d {name}: {m}")


@pytest.mark.parametrize("similarity", list(attention_backward.SIMILARITY_SCALED))
@pytest.mark.parametrize("dtype", list(BACKWARD_TOLERANCE))
def test_two_kernel_backward_gives_the_generic_backwards_five_gradients_with_every_mask(similarity, dtype):
    """40 value channels (two steps of the row kernel), masked slots (score -inf: no query or key
    gradient), a row with no valid candidate (every weight 0) and one with fewer than K."""
    for mask in ("none", "bool [G,N,M] with short rows", "additive 0/-inf [N,M]"):
        args = two_kernel_backward_case(dtype, similarity, seed=61, mask=mask)
        got = two_kernel_backward(*args, similarity, 0.7)
        want = generic_attention_backward(*args, similarity, "softmax", 0.7, [True] * 5)
        assert_gradients_equal(got, want, dtype, f"{similarity} {dtype} mask {mask}")


def generic_attention_backward(*args):
    return ops.knn_attention_backward.default._op_dk(GENERIC, *args)


@pytest.mark.parametrize("k", [1, 9, 64])
def test_two_kernel_backward_at_every_k_the_kernels_hold(k):
    """Three blocks of query rows (the kernel's gradient summed over them), 70 feature and channel
    widths (two column-kernel parts each, the second short), K from 1 to the widest running top-K."""
    args = two_kernel_backward_case(torch.float32, "scaled_dot", seed=62, n=40, m=max(k, 30), d=70, c=70, k=k)
    got = two_kernel_backward(*args, "scaled_dot", 1.3)
    want = generic_attention_backward(*args, "scaled_dot", "softmax", 1.3, [True] * 5)
    assert_gradients_equal(got, want, torch.float32, f"K={k}")


def test_two_kernel_backward_on_aligned_whole_chunk_rows_gives_the_bits_of_the_masked_loads():
    """row_chunks.py: with C = D = 32 (whole chunks of the row kernel's 8 and the column kernel's 16)
    on 16-byte boundaries both kernels take their vector-load bodies; the same values 4 bytes past a
    boundary take the masked ones. K = 8 and 32 (vector bodies) and 64 (the row kernel has none):
    the five gradients bitwise equal, and the generic backward's to rounding."""
    for k in (8, 32, 64):
        args = two_kernel_backward_case(torch.float32, "scaled_dot", seed=65, n=40, m=max(k, 30), d=32, c=32, k=k)
        shifted = [one_float_past_a_16_byte_boundary(t) if t.is_floating_point() else t for t in args]
        assert all(t.data_ptr() % 16 == 0 for t in args[:4]) and all(t.data_ptr() % 16 == 4 for t in shifted[:4])
        got = two_kernel_backward(*args, "scaled_dot", 1.3)
        assert all(torch.equal(a, b) for a, b in zip(got, two_kernel_backward(*shifted, "scaled_dot", 1.3))), k
        want = generic_attention_backward(*args, "scaled_dot", "softmax", 1.3, [True] * 5)
        assert_gradients_equal(got, want, torch.float32, f"K={k}")


def test_two_kernel_backward_is_bitwise_repeatable_and_a_hub_row_sums_in_slot_order():
    """Every query chooses key 0 (a hub row read by every slot 0): two passes bitwise equal."""
    args = list(two_kernel_backward_case(torch.float32, "dot", seed=63, n=40, m=30, d=6, c=8, k=4))
    args[6] = args[6].clone()
    args[6][..., 0] = 0
    args[6][..., 1:] = torch.arange(1, 4).expand_as(args[6][..., 1:])
    first = two_kernel_backward(*args, "dot", 1.0)
    second = two_kernel_backward(*args, "dot", 1.0)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    want = generic_attention_backward(*args, "dot", "softmax", 1.0, [True] * 5)
    assert_gradients_equal(first, want, torch.float32, "hub row")


def test_two_kernel_backward_gives_nan_gradients_where_the_generic_backward_does():
    """A row the forward could not rank (NaN scores and weights): its query gradient is NaN, and the
    key and value rows it chose get NaN, on both paths; the other rows are untouched."""
    args = list(two_kernel_backward_case(torch.float32, "scaled_dot", seed=64, mask="none"))
    for position in (5, 7):  # scores, weights
        args[position] = args[position].clone()
        args[position][1, 3] = float("nan")
    got = two_kernel_backward(*args, "scaled_dot", 0.7)
    want = generic_attention_backward(*args, "scaled_dot", "softmax", 0.7, [True] * 5)
    assert got[0][1, 3].isnan().all() and not got[0][0].isnan().any()
    for a, b in zip(got, want):
        assert torch.equal(a.isnan(), b.isnan())
    assert_gradients_equal(got, want, torch.float32, "NaN row")


def test_two_kernel_backward_writes_every_element_once_and_no_guard_byte_changes():
    args = two_kernel_backward_case(torch.float32, "scaled_dot", seed=65, n=40, m=30, d=70, c=70, k=6)
    grad_output, queries, keys, values, kernel, scores, indices, weights = args
    g, n, d = queries.shape
    m, c, k = keys.shape[1], values.shape[2], indices.shape[2]
    placed = between_nan_guards(grad_output, queries, keys, values, kernel, kernel.t().contiguous(), scores, weights)
    dy, q, keys_in, values_in, taps, taps_by_slot, s, w = placed
    canary = 777.0
    outputs = {}
    row_blocks = triton.cdiv(g * n, attention_backward.ROW_ROWS)
    for name, shape in (("live", (g, n, k)), ("d queries", (g, n, d)), ("partial", (row_blocks, c, k)),
                        ("d keys", (g, m, d)), ("d values", (g, m, c))):
        buffer, view = guarded(shape, torch.float32, canary)
        view.fill_(float("nan"))
        outputs[name] = (buffer, view)
    root = float(torch.tensor(float(d)).sqrt())
    attention_backward._rows_kernel[(row_blocks,)](
        dy, values_in, taps, indices, w, s, keys_in, outputs["live"][1], outputs["d queries"][1],
        outputs["partial"][1], g * n, n, m, c, d, k, 0.7, root,
        *layouts(dy, keys_in, values_in, outputs["d queries"][1]), SCALED=True,
        ROWS=attention_backward.ROW_ROWS, SLOTS=8, CHANNELS=attention_backward.ROW_CHANNELS)
    order, run_start = inverse_index(indices, m)
    value_parts = triton.cdiv(c, attention_backward.COLUMN_WIDTH)
    attention_backward._columns_kernel[(triton.cdiv(g * m, attention_backward.COLUMN_ROWS),
                                        value_parts + triton.cdiv(d, attention_backward.COLUMN_WIDTH))](
        dy, q, w, taps_by_slot, outputs["live"][1], order, run_start, busiest_first(run_start),
        outputs["d values"][1], outputs["d keys"][1],
        g * m, c, d, k, value_parts, n, m, *layouts(dy, q, outputs["d values"][1], outputs["d keys"][1]),
        ROWS=attention_backward.COLUMN_ROWS,
        WIDTH=attention_backward.COLUMN_WIDTH)
    for name, (buffer, view) in outputs.items():
        assert not view.isnan().any(), f"{name}: an element not written (or a guard read)"
        assert (buffer[:64] == canary).all() and (buffer[-64:] == canary).all(), f"{name}: a guard byte changed"
    want = generic_attention_backward(*args, "scaled_dot", "softmax", 0.7, [True] * 5)
    got = (outputs["d queries"][1], outputs["d keys"][1], outputs["d values"][1], outputs["partial"][1].sum(0),
           want[4])
    assert_gradients_equal(got, want, torch.float32, "guarded")


def test_the_two_kernel_backward_answers_nothing_where_the_kernels_do_not_apply(monkeypatch):
    args = two_kernel_backward_case(torch.float32, "scaled_dot", seed=66, mask="none")
    got = two_kernel_backward(*args, "scaled_dot", 0.7)
    assert len(got) == 5
    assert_gradients_equal(got, generic_attention_backward(*args, "scaled_dot", "softmax", 0.7, [True] * 5),
                           torch.float32, "registered")
    fused = ops.knn_attention_backward_device_fused.default._op_dk
    grad_output, queries, keys, values, kernel, scores, indices, weights = args
    standard = torch.randn(40, 40, 6, device=DEVICE)
    # Each covered elsewhere by composition: another similarity or rho, a standard kernel, float64.
    assert fused(CUDA, *args, "cosine", "softmax", 0.7) == []
    assert fused(CUDA, *args, "scaled_dot", "mean", 0.7) == []
    assert fused(CUDA, grad_output, queries, keys, values, standard, scores, indices, weights, "scaled_dot", "softmax",
                 0.7) == []
    assert fused(CUDA, *(t.double() if t.is_floating_point() else t for t in args), "scaled_dot", "softmax", 0.7) == []
    monkeypatch.setenv("CONVNN_CUDA_KERNELS", "generic")
    assert fused(CUDA, *args, "scaled_dot", "softmax", 0.7) == []
    monkeypatch.delenv("CONVNN_CUDA_KERNELS")
    with pytest.raises(RuntimeError, match="knn_attention_backward"):
        fused(CUDA, grad_output[..., :5], *args[1:], "scaled_dot", "softmax", 0.7)


def launch_two_kernel_backward(args, dtype, slots):
    """Both kernels of the two-kernel backward launched directly on args (scaled_dot, temperature 0.7),
    the three gradients written in `dtype` (the op's, which the row kernel rounds to where the
    composed steps round): (live, d queries, partial, d keys, d values)."""
    grad_output, queries, keys, values, kernel, scores, indices, weights = args
    g, n, d = queries.shape
    m, c, k = keys.shape[1], values.shape[2], indices.shape[2]
    row_blocks = triton.cdiv(g * n, attention_backward.ROW_ROWS)
    live = torch.empty(g, n, k, device=DEVICE)
    partial = torch.empty(row_blocks, c, k, device=DEVICE)
    grad_queries, grad_keys, grad_values = (torch.empty(t.shape, dtype=dtype, device=DEVICE)
                                            for t in (queries, keys, values))
    root = float(torch.tensor(float(d)).sqrt())
    attention_backward._rows_kernel[(row_blocks,)](
        grad_output, values, kernel, indices, weights, scores, keys, live, grad_queries, partial, g * n, n, m, c, d, k,
        0.7, root, *layouts(grad_output, keys, values, grad_queries), SCALED=True, ROWS=attention_backward.ROW_ROWS,
        SLOTS=slots,
        CHANNELS=attention_backward.ROW_CHANNELS)
    order, run_start = inverse_index(indices, m)
    value_parts = triton.cdiv(c, attention_backward.COLUMN_WIDTH)
    attention_backward._columns_kernel[(triton.cdiv(g * m, attention_backward.COLUMN_ROWS),
                                        value_parts + triton.cdiv(d, attention_backward.COLUMN_WIDTH))](
        grad_output, queries, weights, kernel.t().contiguous(), live, order, run_start, busiest_first(run_start),
        grad_values, grad_keys, g * m, c, d, k, value_parts, n, m,
        *layouts(grad_output, queries, grad_values, grad_keys),
        ROWS=attention_backward.COLUMN_ROWS,
        WIDTH=attention_backward.COLUMN_WIDTH)
    return live, grad_queries, partial, grad_keys, grad_values


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_kernel_backward_reads_half_precision_with_the_bits_of_float32_copies(dtype):
    """issue 38 §1: the backward's kernels read half-precision inputs in registers and write the
    gradients in the op's dtype (the kernels compiled for it). Converting to float32 is exact, so
    they give the bits that the same kernels give on float32 copies of the inputs with the
    gradients still written in (and rounded to) the op's dtype: the float32 copies the launcher made
    before. Both row-kernel bodies (K <= 8, slots as columns; K = 40, a slot per step) and both load
    kinds (D = 5, masked loads; D = C = 32, vector loads)."""
    for n, m, d, c, k in ((9, 70, 5, 40, 6), (40, 48, 32, 32, 40)):
        mask = "bool [G,N,M] with short rows" if (n, m) == (9, 70) else "none"
        args = two_kernel_backward_case(dtype, "scaled_dot", seed=67, n=n, m=m, d=d, c=c, k=k, mask=mask)
        as_float32 = [t.float() if t.is_floating_point() else t for t in args]
        slots = select.slots_for(k)
        half = launch_two_kernel_backward(args, dtype, slots)
        single = launch_two_kernel_backward(as_float32, dtype, slots)
        for name, a, b in zip(("live", "d queries", "partial", "d keys", "d values"), half, single):
            assert torch.equal(a, b), f"{dtype} K={k}: {name} differs from the float32 copies' bits"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_backward_kernels_take_the_ops_dtype_without_a_conversion_pass(dtype, monkeypatch):
    """The launchers pass the half-precision tensors as they are, to kernels compiled for them (the
    Python route checks each pointer's dtype against specialisations.py's signature, which the
    embedded images are compiled for): no conversion before or after, but for the kernel's gradient
    (float32 partial sums of the row blocks, summed, then in the kernel's dtype)."""
    args = two_kernel_backward_case(dtype, "scaled_dot", seed=68, mask="none")
    grad_output, queries, keys, values, kernel, scores, indices, weights = args
    two_kernel_backward(*args, "scaled_dot", 0.7)  # the first-call checks, before counting
    softmax_scores_gradient(grad_output, values, weights, indices, kernel, 0.7)
    with host_conversions(monkeypatch) as conversions, launches_recorded() as keys_launched:
        got = two_kernel_backward(*args, "scaled_dot", 0.7)
        grad_scores = softmax_scores_gradient(grad_output, values, weights, indices, kernel, 0.7)
    floating = [target for target in conversions if target.is_floating_point]  # not the sorts' int32 keys
    assert floating == [dtype], f"the launchers converted tensors to {floating}"
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    assert keys_launched == [f"attention backward rows scaled_dot K<=8 {name}", f"attention backward columns {name}",
                             f"attention softmax scores gradient K<=8 {name}"]
    assert grad_scores.dtype == dtype and all(t.dtype == dtype for t in got)
    assert_gradients_equal(got, generic_attention_backward(*args, "scaled_dot", "softmax", 0.7, [True] * 5), dtype,
                           "half precision read in registers")


def test_a_launch_whose_tensor_is_not_of_the_compiled_pointer_type_is_refused():
    """The Python route's check of what the embedded images assume: a float32 tensor where the
    bfloat16 kernel takes a bfloat16 pointer is an error naming the kernel and the argument."""
    args = two_kernel_backward_case(torch.bfloat16, "scaled_dot", seed=69, mask="none")
    grad_output, queries, keys, values, kernel, scores, indices, weights = args
    g, n, _ = weights.shape
    key = "attention softmax scores gradient K<=8 bfloat16"
    kernel_fn, signature, _, _ = register.specialisation(key)
    arguments = [grad_output.float(), values, kernel, indices, weights, torch.empty_like(weights), g * n, n,
                 values.shape[1], values.shape[2], weights.shape[2], 0.7]
    with pytest.raises(RuntimeError, match=r"'attention softmax scores gradient K<=8 bfloat16' passes grad_output_ptr "
                                           r"as torch.float32, where the compiled kernel takes \*bf16"):
        register._check_pointer_types(key, kernel_fn, signature, arguments)


@triton.jit
def _converted_to_bfloat16(x_ptr, y_ptr, z_ptr, B: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, B))
    tl.store(y_ptr + tl.arange(0, B), x.to(tl.bfloat16))
    tl.store(z_ptr + tl.arange(0, B), x)  # converted by the store


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's conversion (on a GPU the hardware's)")
def test_the_interpreter_rounds_float32_to_bfloat16_to_nearest_even_as_a_gpu_does():
    """triton_interpreter.py: Triton 3.6's interpreter truncates float32 -> bfloat16 (still: else
    the fix can go) where a GPU rounds to nearest even as PyTorch does; with the fix a kernel's
    conversion and store give PyTorch's bits at ties, carries into the exponent, overflow to
    infinity, subnormals, zeros, infinities and NaN."""
    ulp = 2.0 ** -7
    values = torch.tensor([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2 ** -20, 2 - ulp / 4, 1.3394, -0.8584,
                           3.3895313892515355e38, float.fromhex("0x1.fffffep127"), 1e-40, -1e-39, 0.0, -0.0,
                           float("inf"), float("-inf"), float("nan"), 0.61621])
    want = values.to(torch.bfloat16)
    own = triton_interpreter.interpreters_own_bfloat16(values.numpy())
    assert not np.array_equal(own, want.view(torch.int16).numpy().view(np.uint16)), "it rounds now: drop the fix"
    converted, stored = torch.empty_like(want), torch.empty_like(want)
    _converted_to_bfloat16[(1,)](values, converted, stored, B=values.numel())
    for got in (converted, stored):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))


def launch_top_k_kernels(queries, keys, values, taps, bias, mask, k, similarity, dtype_code):
    """The select kernel and the fused attention kernel launched directly (softmax rho, slots by
    score), their outputs written in the dtype that dtype_code names: (scores, indices, output,
    attention scores, attention indices, weights)."""
    g, n, d = queries.shape
    m, c = keys.shape[1], values.shape[2]
    out_dtype = {code: dtype for dtype, code in attention.DTYPE_CODES.items()}[dtype_code]
    mask_kind = select.NO_MASK if mask is None else select.BOOL_MASK
    slots = select.slots_for(k)
    blocks, options = select.design(slots, mask_kind)
    grid = (triton.cdiv(n, blocks["ROWS"]), g)
    constant = float(torch.tensor(float(d)).sqrt()) if similarity == "scaled_dot" else 1e-8
    code = select.SIMILARITY_CODES[similarity]
    mask_in = queries if mask is None else mask
    scores = torch.empty(g, n, k, device=DEVICE, dtype=out_dtype)
    indices = torch.empty(g, n, k, dtype=torch.int64, device=DEVICE)
    select._select_kernel[grid](queries, keys, mask_in, scores, indices, n, m, d, k, 0, 1, constant, dtype_code,
                                *layouts(queries, keys), SIMILARITY=code, MASK=mask_kind, SLOTS=slots, FEATURES=16,
                                **blocks)
    output, attention_scores, weights = (torch.empty(g, n, size, device=DEVICE, dtype=out_dtype) for size in (c, k, k))
    chosen = torch.empty(g, n, k, dtype=torch.int64, device=DEVICE)
    attention._attention_kernel[grid](queries, keys, values, taps, bias, mask_in, output, attention_scores, chosen,
                                      weights, n, m, d, c, k, 0, 1, constant, attention.RHO_CODES["softmax"], 0.7, 0, 1,
                                      dtype_code, *layouts(queries, keys, values, output), SIMILARITY=code,
                                      MASK=mask_kind, SLOTS=slots, FEATURES=16,
                                      CHANNELS=attention.forward_channels(slots),
                                      **blocks)
    return scores, indices, output, attention_scores, chosen, weights


@pytest.mark.parametrize("similarity", SIMILARITIES)
def test_half_precision_inputs_read_by_the_top_k_kernels_give_the_bits_of_float32_copies(similarity):
    """issue 38 §1: the select and fused attention kernels compiled for half-precision inputs
    (select.INPUT_DTYPES) convert queries, keys, values, kernel and bias to float32 in registers,
    exactly, so they give the bits the float32 kernels give on float32 copies (the op's dtype code
    the same): the copies the launcher made before. Masked loads (D = 5, a bool mask), and for the dot
    products whole-chunk vector loads (D = 16); K = 6 (the set held per thread, the slots as columns)
    and 20 (the shared set, a slot per step); bfloat16 in every case, float16 in the first."""
    cases = [(5, 6, True), (5, 20, False)] + ([(16, 6, False), (16, 20, True)] if similarity in ("dot", "scaled_dot")
                                              else [])
    cases = [(torch.bfloat16, *case) for case in cases] + [(torch.float16, *cases[0])]
    for dtype, d, k, masked in cases:
        code = attention.DTYPE_CODES[dtype]
        queries, keys, generator = select_inputs(torch.float32, n=9, m=70, d=d, seed=71)
        queries, keys = queries / 3 + 0.01 * torch.randn(queries.shape, generator=generator).to(DEVICE), keys / 3
        values, taps, bias = attention_operands(torch.float32, queries, keys, generator, c=16, k=k)
        half = [t.to(dtype) for t in (queries, keys, values, taps, bias)]
        mask = select_masks(2, 9, 70, generator)["bool [G,N,M] with short rows"][0] if masked else None
        got = launch_top_k_kernels(*half, mask, k, similarity, code)
        want = launch_top_k_kernels(*(t.float() for t in half), mask, k, similarity, code)
        for name, a, b in zip(("scores", "indices", "output", "attention scores", "attention indices", "weights"),
                              got, want):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()]), \
                f"{similarity} {dtype} D={d} K={k} mask={masked}: {name}"


class _LaunchedTensors:
    """The tensor arguments of every kernel launched inside the block, by argument name."""

    def __init__(self, monkeypatch):
        self.launches = []
        launch = register.run

        def run(kernel, grid, arguments, constexprs, options):
            self.launches.append((kernel.fn.__name__, dict(zip(kernel.arg_names, arguments))))
            launch(kernel, grid, arguments, constexprs, options)

        monkeypatch.setattr(register, "run", run)

    def of(self, kernel):
        """The last launch's (the call's own: the first-call check of a set of kernels launches first)."""
        return [named for name, named in self.launches if name == kernel][-1]


def head_split(qkv, heads):
    """[B, H, N, d] query, key and value views of one [B, N, 3*H*d] projection, as a layer makes them."""
    return tuple(part.unflatten(2, (heads, -1)).transpose(1, 2) for part in qkv.split(qkv.shape[2] // 3, -1))


def folded(x):
    return x.flatten(0, 1).contiguous()


def same_bits(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


@pytest.mark.parametrize("dtype,d,k,masked", [(torch.float32, 16, 6, False), (torch.float32, 5, 20, True),
                                              (torch.bfloat16, 16, 6, True), (torch.float16, 16, 20, False)],
                         ids=["float32 vector loads K=6", "float32 D=5 K=20 mask", "bfloat16 mask", "float16 K=20"])
def test_head_dims_are_read_in_place_and_give_the_folded_calls_bits(monkeypatch, dtype, d, k, masked):
    """issue 38 §1: [B, H, N, d] views of one [B, N, 3*H*d] projection (the layer's heads, no fold copy)
    go to the fused forward and the two-kernel backward as they are: the launches' query, key, value
    and incoming-gradient pointers are the projection's and the gradient's own storage, the output
    and the three gradients are written [B, N, H, *], and every result has exactly the bits of the same kernels on the
    contiguous [B*H, N, d] folds (d bias, ATen's sum of the incoming gradient,
    to rounding). Strides that are multiples of 16 take the vector loads (D = 16), the
    others the masked ones (D = 5); the set per thread (K = 6) and the shared one (K = 20); a [B, H, N,
    M] mask."""
    b, h, n = 2, 3, 23
    generator = torch.Generator().manual_seed(81)
    qkv = torch.randint(-3, 4, (b, n, 3 * h * d), generator=generator).to(DEVICE, dtype)
    q, kk, v = head_split(qkv, h)
    kernel = torch.randn(d, k, generator=generator).to(DEVICE, dtype)
    mask = torch.rand(b, h, n, n, generator=generator).to(DEVICE) < 0.8 if masked else None
    args = (kernel, None, k, "scaled_dot", mask, False, "softmax", 0.7)
    folded_args = (kernel, None, k, "scaled_dot", None if mask is None else folded(mask), False, "softmax", 0.7)
    launched = _LaunchedTensors(monkeypatch)
    forward = attention_forward(q, kk, v, *args)
    pointers = launched.of("_attention_kernel")
    want = attention_forward(folded(q), folded(kk), folded(v), *folded_args)
    storage = qkv.untyped_storage().data_ptr()
    for name in ("q_ptr", "k_ptr", "v_ptr"):
        assert pointers[name].untyped_storage().data_ptr() == storage, f"{name} was copied"
    assert pointers["output_ptr"].data_ptr() == forward[0].data_ptr()
    assert forward[0].transpose(1, 2).is_contiguous()
    for name, a, w in zip(("output", "scores", "indices", "weights"), forward, want):
        assert a.shape[:2] == (b, h) and same_bits(a, w.unflatten(0, (b, h))), f"forward {name}"

    grad_output = torch.randn(b, n, h, d, generator=generator).to(DEVICE, dtype).transpose(1, 2)
    saved = forward[1:]
    launched.launches.clear()
    got = two_kernel_backward(grad_output, q, kk, v, kernel, *saved, "scaled_dot", 0.7)
    rows, columns = launched.of("_rows_kernel"), launched.of("_columns_kernel")
    for name, named, tensor in (("grad_output_ptr", rows, grad_output), ("keys_ptr", rows, qkv),
                                ("values_ptr", rows, qkv), ("grad_output_ptr", columns, grad_output),
                                ("queries_ptr", columns, qkv)):
        assert named[name].untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr(), f"{name} was copied"
    want = two_kernel_backward(folded(grad_output), folded(q), folded(kk), folded(v), kernel,
                               *(folded(t) for t in saved), "scaled_dot", 0.7)
    for name, a, w in zip(("queries", "keys", "values"), got, want):
        assert a.shape == (b, h, n, d) and a.transpose(1, 2).is_contiguous(), f"d {name} is not stored [B, N, H, d]"
        assert same_bits(a, w.unflatten(0, (b, h))), f"d {name}"
    assert same_bits(got[3], want[3]), "d kernel"
    # d bias is ATen's sum of the incoming gradient, whose order of additions follows the layout.
    torch.testing.assert_close(got[4], want[4])


def test_select_reads_strided_queries_and_keys_in_place(monkeypatch):
    """issue 38 §1: knn_select's kernel takes [G, N, D] queries and keys of any strides but the
    features' (here slices of [N, G, 3D] tensors) without a copy, with the contiguous call's bits."""
    generator = torch.Generator().manual_seed(82)
    rows = torch.randint(-3, 4, (40, 2, 48), generator=generator).to(DEVICE, torch.float32)
    queries, keys = rows[..., :16].transpose(0, 1), rows[..., 16:32].transpose(0, 1)
    launched = _LaunchedTensors(monkeypatch)
    got = select_forward(queries, keys, 6, "dot", None, False)
    for name in ("q_ptr", "k_ptr"):
        argument = launched.of("_select_kernel")[name]
        assert argument.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr(), f"{name} was copied"
    want = select_forward(queries.contiguous(), keys.contiguous(), 6, "dot", None, False)
    assert all(torch.equal(a, w) for a, w in zip(got, want))
