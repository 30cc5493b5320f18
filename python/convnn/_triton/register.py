"""The Triton kernels as the CUDA kernels of the core ops, registered from Python (issue 25 §3's
Python route): on a CUDA tensor, torch.ops.convnn.knn_select runs python/convnn/_triton/select.py
(K up to 64), its backward the pair-gradient kernels (pair_gradients.py) or, for dot products, the
aggregation kernels, knn_attention the fused kernel of attention.py (through
convnn::knn_attention_device_fused, which the C++ CUDA knn_attention asks first), and knn_aggregate and
knn_aggregate_backward run python/convnn/_triton/aggregate.py where it applies (float32, bfloat16 or float16; every tensor on
the values' device; depthwise and standard kernels) and the device-generic path (the op's
CompositeExplicitAutograd kernel, src/ops/generic) everywhere else, so no legal input is refused.
The op's C++ shape rules run first, through its Meta kernel on meta copies, with the C++ messages.

A safety net where the code meets a real GPU (the kernels are tested under Triton's CPU
interpreter here, and have never run on a GPU in this project's CI): the first call on each CUDA
device and dtype checks the fused forward and backward against the generic path on a small random
input; a disagreement turns the fused kernels off for that device, with one warning naming the
kernel. CONVNN_CUDA_KERNELS=generic turns them off by choice.
"""
import os
import warnings

import torch

_ops = torch.ops.convnn
_GENERIC = torch._C.DispatchKey.CompositeExplicitAutograd  # the device-generic kernels
_META = torch._C.DispatchKey.Meta
_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Per (device, dtype): True when the fused kernels passed their first-call check, False when they
# failed it. What the tests reset.
verified = {}


def generic(op, *args):
    """The op's device-generic kernel, whatever kernel the device has (a private PyTorch entry: the
    dispatcher's call of one dispatch key's kernel)."""
    return op._op_dk(_GENERIC, *args)


def check_shapes(op, *args):
    """The op's C++ shape, dtype and option rules, through its Meta kernel on meta copies."""
    op._op_dk(_META, *[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])


def fused_kernels_chosen():
    choice = os.environ.get("CONVNN_CUDA_KERNELS", "fused")
    if choice not in ("fused", "generic"):
        raise ValueError(f"CONVNN_CUDA_KERNELS must be 'fused' or 'generic', got '{choice}'")
    return choice == "fused"


def _fused_applies(values, tensors):
    return (fused_kernels_chosen() and values.dtype in _FUSED_DTYPES
            and all(t is None or t.device == values.device for t in tensors)
            and _device_verified(values.device, values.dtype))


def _device_verified(device, dtype):
    key = (str(device), dtype)
    if key not in verified:
        try:
            failure = first_call_check(device, dtype)
        except Exception as error:  # a kernel that does not compile or launch on this device
            failure = f"knn_aggregate ({type(error).__name__}: {error})"
        verified[key] = failure is None
        if failure is not None:
            warnings.warn(f"convnn: the fused Triton kernel {failure} disagrees with the generic path on "
                          f"{device} ({dtype}); convnn uses the generic path there from now on")
    return verified[key]


def first_call_check(device, dtype):
    """The name of the first fused kernel whose results differ from the generic path's on a small
    random input on `device`, or None when all agree."""
    from . import aggregate

    generator = torch.Generator().manual_seed(0)
    g, n, m, c, k = 2, 7, 9, 5, 3

    def draw(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    values, weights = draw(g, m, c), draw(g, n, k)
    indices = torch.randint(0, m, (g, n, k), generator=generator).to(device)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    for kind, kernel in (("depthwise", draw(c, k)), ("standard", draw(c + 2, c, k))):
        bias, grad_output = draw(kernel.shape[0]), draw(g, n, kernel.shape[0])
        fused = aggregate.aggregate_forward(values, weights, indices, kernel, bias)
        expected = generic(_ops.knn_aggregate.default, values, weights, indices, kernel, bias)
        if not torch.allclose(fused.float(), expected.float(), **tolerance):
            return f"knn_aggregate ({kind}, forward)"
        mask = [True, True, True, True]
        fused = aggregate.aggregate_backward(grad_output, values, weights, indices, kernel, mask)
        expected = generic(_ops.knn_aggregate_backward.default, grad_output, values, weights, indices, kernel, mask)
        for name, got, want in zip(("values", "weights", "kernel", "bias"), fused, expected):
            if not torch.allclose(got.float(), want.float(), **tolerance):
                return f"knn_aggregate_backward ({kind}, d {name})"
    return _select_check(device, dtype) or _attention_check(device, dtype)  # the select backward runs on the aggregation


def _select_check(device, dtype):
    """knn_select on integer-valued features (every score exact, ties included): the same indices
    and scores as the generic path, for a dot product and a distance, with a bool mask."""
    from . import select

    generator = torch.Generator().manual_seed(1)
    queries = torch.randint(-3, 4, (2, 9, 5), generator=generator).to(device=device, dtype=dtype)
    keys = torch.randint(-3, 4, (2, 70, 5), generator=generator).to(device=device, dtype=dtype)
    mask = (torch.rand(9, 70, generator=generator) > 0.3).to(device)
    score_rtol = 1e-5 if dtype == torch.float32 else 1e-2
    for similarity in ("dot", "l1"):
        scores, indices = select.select_forward(queries, keys, 6, similarity, mask, False)
        want_scores, want_indices = generic(_ops.knn_select.default, queries, keys, 6, similarity, mask, False)
        # Indices exactly; scores to rounding (exp(-distance) is Triton's exp, not the C++ one).
        if not (torch.equal(indices, want_indices)
                and torch.allclose(scores.float(), want_scores.float(), rtol=score_rtol, atol=0)):
            return f"knn_select ({similarity})"
    # The backward: a dot product (the aggregation kernels), cosine (the pair-gradient kernels' linear
    # terms) and chebyshev (their sign term on one feature), on a third of the keys.
    keys = keys[:, :24].contiguous()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for similarity in ("scaled_dot", "cosine", "chebyshev"):
        scores, indices = generic(_ops.knn_select.default, queries, keys, 6, similarity, mask[:, :24], False)
        grad_scores = torch.randn(scores.shape, generator=generator).to(device=device, dtype=dtype)
        fused = select.select_backward(grad_scores, queries, keys, indices, scores, similarity)
        expected = generic(_ops.knn_select_backward.default, grad_scores, queries, keys, indices, scores, similarity)
        if not all(torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance)
                   for a, b in zip(fused, expected)):
            return f"knn_select_backward ({similarity})"
    return None


def _attention_check(device, dtype):
    """The fused knn_attention on integer-valued features (D = 4: every score exact): the same
    indices as the generic path, the rest to rounding, with softmax and index order."""
    from . import attention

    generator = torch.Generator().manual_seed(2)
    queries = torch.randint(-3, 4, (2, 9, 4), generator=generator).to(device=device, dtype=dtype)
    keys = torch.randint(-3, 4, (2, 70, 4), generator=generator).to(device=device, dtype=dtype)
    values = torch.randn(2, 70, 5, generator=generator).to(device=device, dtype=dtype)
    kernel, bias = (torch.randn(*shape, generator=generator).to(device=device, dtype=dtype) for shape in ((5, 6), (5,)))
    mask = (torch.rand(9, 70, generator=generator) > 0.3).to(device)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for similarity in ("scaled_dot", "l1"):
        args = (queries, keys, values, kernel, bias, 6, similarity, mask, True, "softmax", 0.5)
        fused = attention.attention_forward(*args)
        expected = generic(_ops.knn_attention.default, *args)
        if not (torch.equal(fused[2], expected[2]) and
                all(torch.allclose(a.float(), b.float(), rtol=tolerance, atol=tolerance)
                    for a, b in zip(fused[:2] + fused[3:], expected[:2] + expected[3:]))):
            return f"knn_attention ({similarity})"
    # The backward's fused step, through the generic select backward: the generic backward's query gradient.
    grad_output = torch.randn(expected[0].shape, generator=generator).to(device=device, dtype=dtype)
    _, scores, indices, weights = expected
    grad_scores = attention.softmax_scores_gradient(grad_output, values, weights, indices, kernel, 0.5)
    fused = generic(_ops.knn_select_backward.default, grad_scores, queries, keys, indices, scores, "l1")[0]
    want = generic(_ops.knn_attention_backward.default, grad_output, queries, keys, values, kernel, scores, indices,
                   weights, "l1", "softmax", 0.5, [True, False, False, False, False])[0]
    if not torch.allclose(fused.float(), want.float(), rtol=tolerance, atol=tolerance):
        return "knn_attention_backward (softmax scores gradient)"
    # The two-kernel backward (attention_backward.py) on the scaled_dot forward: all five gradients.
    from . import attention_backward

    _, scores, indices, weights = generic(_ops.knn_attention.default, queries, keys, values, kernel, bias, 6,
                                          "scaled_dot", mask, True, "softmax", 0.5)
    args = (grad_output, queries, keys, values, kernel, scores, indices, weights)
    fused = attention_backward.attention_backward(*args, "scaled_dot", 0.5)
    want = generic(_ops.knn_attention_backward.default, *args, "scaled_dot", "softmax", 0.5, [True] * 5)
    for name, got, expected in zip(("queries", "keys", "values", "kernel", "bias"), fused, want):
        if not torch.allclose(got.float(), expected.float(), rtol=tolerance, atol=tolerance):
            return f"knn_attention_backward (two kernels, d {name})"
    return None


def device_value_checks():
    """Whether the ops read values on accelerators too (CONVNN_DEVICE_VALUE_CHECKS=1, the debug
    switch of src/ops/checks.cpp): then an unrankable score raises, which only the generic path
    can do; the Triton kernel gives the default's NaN rows."""
    return os.environ.get("CONVNN_DEVICE_VALUE_CHECKS") == "1"


def knn_select(queries, keys, k, similarity, mask, index_order):
    from . import select

    if not (_fused_applies(queries, (keys, mask)) and select.applies(queries, keys, k, similarity)
            and not device_value_checks()):
        return generic(_ops.knn_select.default, queries, keys, k, similarity, mask, index_order)
    check_shapes(_ops.knn_select.default, queries, keys, k, similarity, mask, index_order)
    return select.select_forward(queries.contiguous(), keys.contiguous(), k, similarity,
                                 None if mask is None else mask.contiguous(), index_order)


def knn_select_backward(grad_scores, queries, keys, indices, scores, similarity):
    from . import select

    if not (similarity in select.SIMILARITY_CODES and _fused_applies(queries, (grad_scores, keys, indices, scores))):
        return generic(_ops.knn_select_backward.default, grad_scores, queries, keys, indices, scores, similarity)
    check_shapes(_ops.knn_select_backward.default, grad_scores, queries, keys, indices, scores, similarity)
    return select.select_backward(grad_scores.contiguous(), queries.contiguous(), keys.contiguous(),
                                  indices.contiguous(), scores.contiguous(), similarity)


def knn_attention_device_fused(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature):
    """convnn::knn_attention_device_fused on CUDA: the fused kernel's (output, scores, indices,
    weights), or [] where it does not apply; the C++ CUDA knn_attention then composes the core ops."""
    from . import attention

    if not (_fused_applies(queries, (keys, values, kernel, bias, mask))
            and attention.applies(queries, keys, values, kernel, k, similarity, rho) and not device_value_checks()):
        return []
    check_shapes(_ops.knn_attention.default, queries, keys, values, kernel, bias, k, similarity, mask, index_order,
                 rho, temperature)
    return list(attention.attention_forward(
        queries.contiguous(), keys.contiguous(), values.contiguous(), kernel.contiguous(),
        None if bias is None else bias.contiguous(), k, similarity, None if mask is None else mask.contiguous(),
        index_order, rho, temperature))


def knn_attention_softmax_scores_gradient_device_fused(grad_output, values, weights, indices, kernel, temperature):
    """convnn::knn_attention_softmax_scores_gradient_device_fused on CUDA: [d(scores)] from the fused
    kernel of attention.py, or [] where it does not apply (knn_attention's backward then runs the
    aggregation's weights gradient and the softmax-rho backward). Called by the C++ CUDA
    knn_attention_backward after its checks."""
    from . import attention

    if not (_fused_applies(values, (grad_output, weights, indices, kernel))
            and attention.backward_applies(grad_output, values, weights, kernel)):
        return []
    check_shapes(_ops.knn_aggregate_backward.default, grad_output, values, weights, indices, kernel,
                 [False, True, False, False])
    return [attention.softmax_scores_gradient(grad_output.contiguous(), values.contiguous(), weights.contiguous(),
                                              indices.contiguous(), kernel.contiguous(), temperature)]


def knn_attention_backward_device_fused(grad_output, queries, keys, values, kernel, scores, indices, weights,
                                        similarity, rho, temperature):
    """convnn::knn_attention_backward_device_fused on CUDA: the five gradients from the two kernels of
    attention_backward.py, or [] where they do not apply (the C++ CUDA knn_attention_backward then
    composes). Called by it after its checks; the checks run here too, for a direct call."""
    from . import attention_backward

    if not (_fused_applies(queries, (grad_output, keys, values, kernel, scores, indices, weights))
            and attention_backward.applies(queries, keys, values, kernel, scores, similarity, rho)):
        return []
    check_shapes(_ops.knn_attention_backward.default, grad_output, queries, keys, values, kernel, scores, indices,
                 weights, similarity, rho, temperature, [True] * 5)
    return attention_backward.attention_backward(*(t.contiguous() for t in (grad_output, queries, keys, values, kernel,
                                                                            scores, indices, weights)),
                                                 similarity, temperature)


def knn_aggregate(values, weights, indices, kernel, bias):
    if not _fused_applies(values, (weights, indices, kernel, bias)):
        return generic(_ops.knn_aggregate.default, values, weights, indices, kernel, bias)
    check_shapes(_ops.knn_aggregate.default, values, weights, indices, kernel, bias)
    from . import aggregate

    return aggregate.aggregate_forward(values.contiguous(), weights.contiguous(), indices.contiguous(),
                                       kernel.contiguous(), None if bias is None else bias.contiguous())


def knn_aggregate_backward(grad_output, values, weights, indices, kernel, output_mask):
    if not _fused_applies(values, (grad_output, weights, indices, kernel)):
        return generic(_ops.knn_aggregate_backward.default, grad_output, values, weights, indices, kernel,
                       output_mask)
    check_shapes(_ops.knn_aggregate_backward.default, grad_output, values, weights, indices, kernel, output_mask)
    from . import aggregate

    return aggregate.aggregate_backward(grad_output.contiguous(), values.contiguous(), weights.contiguous(),
                                        indices.contiguous(), kernel.contiguous(), output_mask)


def register():
    """The CUDA kernels of knn_select and its backward, knn_aggregate and its backward, and the fused
    knn_attention forward, softmax scores gradient and two-kernel backward (the three *_device_fused
    ops). Triton compiles on first use."""
    # A libconvnn_ops built with the embedded Triton kernels (src/ops/cuda/triton/, the C++ CUDA
    # build; not the package's own) has CUDA kernels for these ops already: the same kernels, kept.
    for name, kernel in (("knn_select", knn_select), ("knn_select_backward", knn_select_backward),
                         ("knn_aggregate", knn_aggregate), ("knn_aggregate_backward", knn_aggregate_backward),
                         ("knn_attention_device_fused", knn_attention_device_fused),
                         ("knn_attention_softmax_scores_gradient_device_fused",
                          knn_attention_softmax_scores_gradient_device_fused),
                         ("knn_attention_backward_device_fused", knn_attention_backward_device_fused)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"convnn::{name}", "CUDA"):
            torch.library.register_kernel(f"convnn::{name}", "cuda", kernel)
