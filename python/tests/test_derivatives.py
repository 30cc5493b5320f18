"""Every derivative of the ConvNN ops is right, to every order and through every entry point.

The selected indices are piecewise constant in the inputs, so every derivative holds the selection
fixed (as torch.topk's and torch.sort's do); the inputs are random float64, far from ties at the
finite-difference step. First order goes through the fused kernels (or the device-generic path:
ctest runs this file again with CONVNN_CPU_KERNELS=generic); create_graph=True, torch.func and
forward-mode AD go through ATen's autograd of the reference composition
(src/ops/autograd/aten_autograd.h). Each result is compared with an independent one: finite
differences (gradcheck, gradgradcheck), scaled_dot_product_attention (the attention identity), the
ordinary backward, or a Python loop.
"""
import itertools

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd import gradcheck, gradgradcheck

import convnn  # noqa: F401  (registers torch.ops.convnn)
from convnn.nn import BranchingConv2d, ConvNN1d, ConvNN2d, ConvNNAttention

ops = torch.ops.convnn
F64 = torch.float64
G, N, M, D, C, K = 2, 4, 5, 3, 2, 3


def randn(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=F64, requires_grad=requires_grad)


def masks():
    """None, a bool [N,M] mask, and an additive [G,N,M] mask whose row 0 keeps fewer than K."""
    allowed = torch.ones(N, M, dtype=torch.bool)
    allowed[1, :2] = False
    additive = torch.zeros(G, N, M, dtype=F64)
    additive[0, 0, 2:] = float("-inf")  # two valid candidates for K = 3: a short row
    return {"no_mask": None, "bool_nm": allowed, "additive_gnm": additive}


SIMILARITIES = list(ops.similarity_names())
RHOS = list(ops.rho_names())
MASKS = masks()


@pytest.mark.parametrize("similarity", SIMILARITIES)
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("index_order", [False, True])
def test_gradgradcheck_knn_select(similarity, mask_name, index_order):
    torch.manual_seed(11)
    q, k = randn(G, N, D), randn(G, M, D)
    def scores(q, k):
        return ops.knn_select(q, k, K, similarity, MASKS[mask_name], index_order)[0]
    # Masked slots are -inf: compare the finite ones (the -inf are constants).
    finite = torch.isfinite(scores(q, k).detach())
    assert gradgradcheck(lambda q, k: scores(q, k)[finite], (q, k))


@pytest.mark.parametrize("kernel_kind", ["depthwise", "standard"])
def test_gradgradcheck_knn_aggregate_values_weights_kernel_and_bias(kernel_kind):
    torch.manual_seed(12)
    values, weights = randn(G, M, C), randn(G, N, K)
    indices = torch.randint(0, M, (G, N, K))
    indices[0, 0, :] = 1  # a row gathered more than once
    kernel = randn(C, K) if kernel_kind == "depthwise" else randn(C + 1, C, K)
    bias = randn(kernel.shape[0])
    assert gradgradcheck(lambda v, w, ker, b: ops.knn_aggregate(v, w, indices, ker, b),
                         (values, weights, kernel, bias))


@pytest.mark.parametrize("similarity,rho", list(itertools.product(SIMILARITIES, RHOS)))
@pytest.mark.parametrize("kernel_kind", ["depthwise", "standard"])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("index_order", [False, True])
def test_gradgradcheck_knn_attention(similarity, rho, kernel_kind, mask_name, index_order):
    torch.manual_seed(13)
    q, k, v = randn(G, N, D), randn(G, M, D), randn(G, M, C)
    kernel = randn(C, K) if kernel_kind == "depthwise" else randn(C + 1, C, K)
    bias = randn(kernel.shape[0])
    def output(q, k, v, ker, b):
        return ops.knn_attention(q, k, v, ker, b, K, similarity, MASKS[mask_name], index_order, rho, 0.7)[0]
    assert gradgradcheck(output, (q, k, v, kernel, bias))


def attention_identity_inputs():
    """K = N, scaled_dot, softmax, depthwise ones: softmax(QK^T/sqrt(d))V."""
    torch.manual_seed(14)
    q, k, v = (torch.randn(G, M, D, dtype=F64) for _ in range(3))
    return q, k, v, torch.ones(D, M, dtype=F64)


def knn_loss(q, k, v, ones):
    return ops.knn_attention(q, k, v, ones, None, M, "scaled_dot", None, False, "softmax", 1.0)[0].pow(2).sum()


def sdpa_loss(q, k, v, ones):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v).pow(2).sum()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attention_hessian_equals_scaled_dot_product_attentions(dtype):
    q, k, v, ones = (t.to(dtype) for t in attention_identity_inputs())
    tolerance = 1e-10 if dtype == torch.float64 else 2e-4
    expected = torch.autograd.functional.hessian(lambda q: sdpa_loss(q, k, v, ones), q)
    assert expected.abs().sum() > 1.0
    through_autograd = torch.autograd.functional.hessian(lambda q: knn_loss(q, k, v, ones), q)
    through_func = torch.func.hessian(lambda q: knn_loss(q, k, v, ones))(q)
    torch.testing.assert_close(through_autograd, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(through_func, expected, rtol=tolerance, atol=tolerance)


def test_second_derivative_with_respect_to_keys_values_and_the_gradient():
    """Every input of the backward, the incoming gradient included, carries the second order."""
    q, k, v, ones = attention_identity_inputs()
    inputs = (q, k, v)
    expected = torch.autograd.functional.hessian(lambda q, k, v: sdpa_loss(q, k, v, ones), inputs)
    actual = torch.autograd.functional.hessian(lambda q, k, v: knn_loss(q, k, v, ones), inputs)
    for row_actual, row_expected in zip(actual, expected):
        for a, e in zip(row_actual, row_expected):
            torch.testing.assert_close(a, e, rtol=0, atol=1e-10)
    direction = torch.randn(G, M, D, dtype=F64)
    _, hvp_actual = torch.autograd.functional.hvp(lambda q: knn_loss(q, k, v, ones), q, direction)
    _, hvp_expected = torch.autograd.functional.hvp(lambda q: sdpa_loss(q, k, v, ones), q, direction)
    torch.testing.assert_close(hvp_actual, hvp_expected, rtol=0, atol=1e-10)


def test_forward_mode_equals_the_jacobian_times_the_tangent():
    torch.manual_seed(15)
    for similarity, rho in itertools.product(SIMILARITIES, RHOS):
        q, k, v = randn(G, N, D, requires_grad=False), randn(G, M, D, requires_grad=False), randn(G, M, C, requires_grad=False)
        kernel = randn(C, K, requires_grad=False)
        tangents = [torch.randn_like(t) for t in (q, k, v, kernel)]
        def output(q, k, v, ker):
            return ops.knn_attention(q, k, v, ker, None, K, similarity, None, False, rho, 0.7)[0]
        jacobians = torch.autograd.functional.jacobian(output, (q, k, v, kernel))
        expected = sum((j.flatten(output(q, k, v, kernel).dim()) @ t.flatten()) for j, t in zip(jacobians, tangents))
        with fwAD.dual_level():
            duals = [fwAD.make_dual(t, dt) for t, dt in zip((q, k, v, kernel), tangents)]
            tangent = fwAD.unpack_dual(output(*duals)).tangent
        torch.testing.assert_close(tangent, expected, rtol=0, atol=1e-10, msg=f"{similarity} {rho}")
        _, jvp = torch.func.jvp(output, (q, k, v, kernel), tuple(tangents))
        torch.testing.assert_close(jvp, expected, rtol=0, atol=1e-10, msg=f"{similarity} {rho}")


def test_func_transforms_on_the_ops_equal_autograds_results():
    torch.manual_seed(16)
    q, k, v = randn(G, N, D, requires_grad=False), randn(G, M, D, requires_grad=False), randn(G, M, C, requires_grad=False)
    kernel = randn(C + 1, C, K, requires_grad=False)
    def output(q, k, v, ker):
        return ops.knn_attention(q, k, v, ker, None, K, "gaussian", MASKS["bool_nm"], True, "softmax", 0.7)[0]
    def loss(q, k, v, ker):
        return output(q, k, v, ker).pow(2).sum()
    inputs = (q, k, v, kernel)
    expected_grads = torch.autograd.grad(loss(*[t.requires_grad_() for t in inputs]), inputs)
    inputs = tuple(t.detach() for t in inputs)
    grads = torch.func.grad(loss, argnums=(0, 1, 2, 3))(*inputs)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    out, vjp_fn = torch.func.vjp(output, *inputs)
    for got, want in zip(vjp_fn(2 * out), expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    expected_jacobian = torch.autograd.functional.jacobian(lambda q: output(q, k, v, kernel), q)
    torch.testing.assert_close(torch.func.jacrev(output)(*inputs), expected_jacobian, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.func.jacfwd(output)(*inputs), expected_jacobian, rtol=0, atol=1e-10)


def loop_over_samples(fn, args, in_dims):
    """fn once per sample, each output stacked: what torch.vmap must equal."""
    batch = next(a.shape[d] for a, d in zip(args, in_dims) if d is not None)
    results = [fn(*[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]) for i in range(batch)]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results))
    return torch.stack(results)


@pytest.fixture
def without_vmap_fallback():
    """PyTorch's per-sample fallback for ops without a batching rule turned off: such an op raises."""
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(True)


def test_vmap_of_the_ops_equals_a_loop_over_samples_bitwise_without_the_fallback(without_vmap_fallback):
    """The batching rules (python/convnn/_vmap.py) fold the vmapped dimension into the slices: one
    call, no per-sample fallback (which warns), bitwise the loop's results; a vmapped kernel loops."""
    torch.manual_seed(17)
    b = 3
    qs, k = torch.randn(b, G, N, D, dtype=F64), torch.randn(G, M, D, dtype=F64)
    vs = torch.randn(G, M, C, b, dtype=F64)  # vmapped over its last dimension
    kernel, kernels = torch.randn(C, K, dtype=F64), torch.randn(b, C, K, dtype=F64)
    masks = torch.rand(b, N, M) > 0.3  # one [N,M] mask per sample

    def attention(q, v, ker, mask):
        return ops.knn_attention(q, k, v, ker, None, K, "cosine", mask, False, "softmax", 1.0)

    cases = {
        "queries and values": (lambda q, v: attention(q, v, kernel, None), (qs, vs), (0, 3)),
        "queries and a mask per sample": (lambda q, m: attention(q, vs[..., 0], kernel, m), (qs, masks), (0, 0)),
        "queries and a kernel per sample": (lambda q, ker: attention(q, vs[..., 0], ker, None), (qs, kernels), (0, 0)),
        "select": (lambda q: ops.knn_select(q, k, K, "l1", MASKS["bool_nm"], True), (qs,), (0,)),
        "aggregate": (lambda w: ops.knn_aggregate(vs[..., 0], w, torch.arange(K).expand(G, N, K), kernel, None),
                      (torch.randn(b, G, N, K, dtype=F64),), (0,)),
    }
    for name, (fn, args, in_dims) in cases.items():
        got = torch.vmap(fn, in_dims=in_dims)(*args)
        want = loop_over_samples(fn, args, in_dims)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w), name


class TinyAttentionModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = ConvNNAttention(4, 2, 3)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, tokens):
        return self.head(self.attn(tokens).mean(-2))


def test_per_sample_gradients_through_vmap_of_grad_equal_a_loop():
    torch.manual_seed(18)
    model = TinyAttentionModel().double()
    params = {name: p.detach() for name, p in model.named_parameters()}
    samples, targets = torch.randn(5, 6, 4, dtype=F64), torch.randint(0, 3, (5,))
    def sample_loss(params, x, y):
        logits = torch.func.functional_call(model, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(logits, y.unsqueeze(0))
    per_sample = torch.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))(params, samples, targets)
    for i in range(len(samples)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(samples[i:i + 1]), targets[i:i + 1]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, rtol=0, atol=1e-12, msg=name)


LAYERS = {
    "ConvNN1d": (lambda: ConvNN1d(2, 3, 3), (2, 2, 7)),
    "ConvNN2d": (lambda: ConvNN2d(2, 3, 4, padding=1), (2, 2, 4, 5)),
    "BranchingConv2d": (lambda: BranchingConv2d(2, 4, k=4), (2, 2, 4, 4)),
    "ConvNNAttention": (lambda: ConvNNAttention(4, 2, 3, causal=True), (2, 5, 4)),
}


@pytest.mark.parametrize("layer_name", list(LAYERS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_func_grad_through_functional_call_equals_backward_for_every_layer(layer_name, dtype):
    torch.manual_seed(19)
    make, shape = LAYERS[layer_name]
    layer = make().to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    layer(x).pow(2).sum().backward()
    expected = {name: p.grad for name, p in layer.named_parameters()}
    params = {name: p.detach() for name, p in layer.named_parameters()}
    grads = torch.func.grad(lambda p: torch.func.functional_call(layer, p, (x,)).pow(2).sum())(params)
    assert set(grads) == set(expected)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=tolerance, atol=tolerance, msg=name)
        assert expected[name].abs().sum() > 0, name


def test_func_grad_through_a_created_model_equals_backward():
    torch.manual_seed(20)
    model = convnn.models.create_model("vit_tiny", attention="convnn", image_size=8, patch_size=4, depth=1,
                                       k=3, num_classes=3).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=F64)
    model(x).logsumexp(-1).sum().backward()
    params = {name: p.detach() for name, p in model.named_parameters()}
    grads = torch.func.grad(
        lambda p: torch.func.functional_call(model, p, (x,)).logsumexp(-1).sum())(params)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=0, atol=1e-10, msg=name)


def audit_entry_points():
    """Each way PyTorch offers to ask for the second derivative or a gradient, as a function of a
    loss (q -> scalar) and q, returning the derivative it computes; all must equal SDPA's."""
    direction = torch.randn(G, M, D, dtype=F64, generator=torch.Generator().manual_seed(5))

    def backward(loss, q):
        q = q.clone().requires_grad_()
        loss(q).backward()
        return q.grad

    def first_derivative(loss, q):
        q = q.clone().requires_grad_()
        return torch.autograd.grad(loss(q), q)[0]

    def grad_of_grad(loss, q, allow_unused):
        q = q.clone().requires_grad_()
        (g,) = torch.autograd.grad(loss(q), q, create_graph=True)
        return torch.autograd.grad((g * direction).sum(), q, allow_unused=allow_unused)[0]

    return {
        "backward": backward,
        "autograd.grad": first_derivative,
        "grad of grad": lambda loss, q: grad_of_grad(loss, q, allow_unused=False),
        "grad of grad, allow_unused": lambda loss, q: grad_of_grad(loss, q, allow_unused=True),
        "functional.jacobian": lambda loss, q: torch.autograd.functional.jacobian(loss, q),
        "functional.hessian": lambda loss, q: torch.autograd.functional.hessian(loss, q),
        "functional.hvp": lambda loss, q: torch.autograd.functional.hvp(loss, q, direction)[1],
        "functional.vhp": lambda loss, q: torch.autograd.functional.vhp(loss, q, direction)[1],
        "func.grad": lambda loss, q: torch.func.grad(loss)(q),
        "func.vjp": lambda loss, q: torch.func.vjp(loss, q)[1](torch.ones((), dtype=F64))[0],
        "func.jacrev": lambda loss, q: torch.func.jacrev(loss)(q),
        "func.jacfwd": lambda loss, q: torch.func.jacfwd(loss)(q),
        "func.hessian": lambda loss, q: torch.func.hessian(loss)(q),
        "vmap of func.grad": lambda loss, q: torch.vmap(torch.func.grad(loss))(q.unsqueeze(0))[0],
    }


@pytest.mark.parametrize("entry_point", list(audit_entry_points()))
def test_audit_every_entry_point_gives_the_true_nonzero_derivative(entry_point):
    q, k, v, ones = attention_identity_inputs()
    compute = audit_entry_points()[entry_point]
    expected = compute(lambda q: sdpa_loss(q, k, v, ones), q)
    actual = compute(lambda q: knn_loss(q, k, v, ones), q)
    assert actual is not None, entry_point
    assert expected.abs().sum() > 1e-3, entry_point
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-10, msg=entry_point)


def test_compiled_double_backward_is_refused_by_aot_autograd_not_zero():
    """torch.compile's AOTAutograd has no double backward (for any op): differentiating a gradient
    that a compiled region made with create_graph=True raises PyTorch's error, never zeros."""
    q, k, v, ones = attention_identity_inputs()
    compiled = torch.compile(lambda q: knn_loss(q, k, v, ones), backend="aot_eager")
    q = q.clone().requires_grad_()
    (g,) = torch.autograd.grad(compiled(q), q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        torch.autograd.grad(g.pow(2).sum(), q)



def test_vmap_over_stacked_module_states_is_an_ensemble(without_vmap_fallback):
    """torch.func.stack_module_state + vmap(functional_call): each member's output (to rounding:
    vmap batches the members' projections into one matrix product)."""
    torch.manual_seed(21)
    members = [ConvNNAttention(4, 2, 3).double() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(members)
    x = torch.randn(2, 5, 4, dtype=F64)
    base = ConvNNAttention(4, 2, 3).double().to("meta")
    outputs = torch.vmap(lambda p, b: torch.func.functional_call(base, (p, b), (x,)))(params, buffers)
    for i, member in enumerate(members):
        torch.testing.assert_close(outputs[i], member(x), rtol=0, atol=1e-12, msg=str(i))


def test_double_backward_through_a_ddp_wrapped_layer_equals_the_plain_layers(tmp_path):
    """DistributedDataParallel (one gloo process): a gradient penalty's second derivative with
    respect to the input flows through the wrapped layer as through the plain one."""
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(22)
        layer = ConvNNAttention(4, 2, 3).double()
        wrapped = torch.nn.parallel.DistributedDataParallel(layer)
        x = torch.randn(2, 5, 4, dtype=F64, requires_grad=True)

        def penalty_gradient(module):
            (g,) = torch.autograd.grad(module(x).pow(2).sum(), x, create_graph=True)
            return torch.autograd.grad(g.pow(2).sum(), x)[0]

        expected = penalty_gradient(layer)
        assert expected.abs().sum() > 1e-3
        torch.testing.assert_close(penalty_gradient(wrapped), expected, rtol=0, atol=1e-12)
    finally:
        dist.destroy_process_group()
