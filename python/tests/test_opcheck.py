"""torch.library.opcheck on every convnn op: schema, autograd registration, fake tensors (the Meta
kernels) and AOT dispatch with dynamic shapes, in float32 and float64 with requires_grad on."""

import pytest
import torch

import convnn  # noqa: F401  (registers torch.ops.convnn)
ops = torch.ops.convnn

TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
DTYPES = (torch.float32, torch.float64)
G, N, M, D, C, K = 2, 7, 9, 5, 4, 3


def tensor(*shape, dtype, grad=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_(grad)


def select_cases(dtype):
    q, k = tensor(G, N, D, dtype=dtype, seed=1), tensor(G, M, D, dtype=dtype, seed=2)
    causal = torch.ones(N, M, dtype=torch.bool).tril()
    return [
        (q, k, K, "scaled_dot", None, False),
        (q, k, K, "l1", causal, True),
        (q, k, K, "cosine", torch.zeros(G, N, M, dtype=dtype), False),
        # One mask slice for both query slices (docs/operator.md, "Masks": G' dividing G).
        (q, k, K, "dot", torch.rand(1, N, M, generator=torch.Generator().manual_seed(3)) < 0.6, False),
    ]


def selection(dtype):
    q, k = tensor(G, N, D, dtype=dtype, seed=1), tensor(G, M, D, dtype=dtype, seed=2)
    scores, indices = ops.knn_select(q.detach(), k.detach(), K, "dot", None, False)
    return scores, indices


def aggregate_cases(dtype):
    values = tensor(G, M, C, dtype=dtype, seed=3)
    scores, indices = selection(dtype)
    weights = torch.softmax(scores, -1).requires_grad_(True)
    return [
        (values, weights, indices, tensor(C, K, dtype=dtype, seed=4), None),
        (values, weights, indices, tensor(6, C, K, dtype=dtype, seed=5), tensor(6, dtype=dtype, seed=6)),
    ]


def attention_cases(dtype):
    q, k = tensor(G, N, D, dtype=dtype, seed=1), tensor(G, M, D, dtype=dtype, seed=2)
    values = tensor(G, M, C, dtype=dtype, seed=3)
    return [
        (q, k, values, tensor(C, K, dtype=dtype, seed=4), None, K, "scaled_dot", None, False, "softmax", 0.7),
        (q, k, values, tensor(6, C, K, dtype=dtype, seed=5), tensor(6, dtype=dtype, seed=6), K, "gaussian",
         None, True, "mean", 1.0),
        (q, k, values, tensor(C, K, dtype=dtype, seed=4), None, K, "dot",
         torch.rand(1, N, M, generator=torch.Generator().manual_seed(3)) < 0.6, False, "softmax", 1.0),
    ] + head_dim_cases(dtype)


def head_dim_cases(dtype):
    """[B,H,N,D] inputs as a layer makes them: head-split views of one [B,N,3*H*D] projection (and a
    [B,H,N,M] mask, and the [B,1,N,M], [1,H,N,M] and [1,1,N,M] ones that broadcast to it); the output's
    [B,N,H,C] storage is what the fake tensors must declare."""
    b, h = 2, 3
    qkv = tensor(b, N, 3 * h * D, dtype=dtype, seed=7)
    q, k, v = (part.unflatten(2, (h, D)).transpose(1, 2) for part in qkv.split(h * D, -1))
    mask = torch.rand(b, h, N, N, generator=torch.Generator().manual_seed(8)) < 0.7
    return [
        (q, k, v, tensor(D, K, dtype=dtype, seed=9), None, K, "scaled_dot", None, False, "softmax", 0.7),
        (q, k, v, tensor(6, D, K, dtype=dtype, seed=10), tensor(6, dtype=dtype, seed=11), K, "l1", mask, True,
         "softmax", 1.0),
        (q, k, v, tensor(D, K, dtype=dtype, seed=9), None, K, "dot", mask[:, :1], False, "softmax", 1.0),
        (q, k, v, tensor(D, K, dtype=dtype, seed=9), None, K, "dot", mask[:1], False, "softmax", 1.0),
        (q, k, v, tensor(D, K, dtype=dtype, seed=9), None, K, "dot", mask[:1, :1], False, "softmax", 1.0),
    ]


def backward_cases(dtype):
    """The _backward ops on their own, with the saved tensors a forward produced."""
    q, k = tensor(G, N, D, dtype=dtype, seed=1, grad=False), tensor(G, M, D, dtype=dtype, seed=2, grad=False)
    values = tensor(G, M, C, dtype=dtype, seed=3, grad=False)
    kernel = tensor(C, K, dtype=dtype, seed=4, grad=False)
    scores, indices = ops.knn_select(q, k, K, "dot", None, False)
    weights = torch.softmax(scores, -1)
    out, a_scores, a_indices, a_weights = ops.knn_attention(
        q, k, values, kernel, None, K, "dot", None, False, "softmax", 1.0)
    q4, k4, v4 = (t.unflatten(0, (1, G)) for t in (q, k, values))
    out4, *saved4 = ops.knn_attention(q4, k4, v4, kernel, None, K, "dot", None, False, "softmax", 1.0)
    return {
        "knn_select_backward": [(torch.ones_like(scores), q, k, indices, scores, "dot")],
        "knn_aggregate_backward": [(torch.ones(G, N, C, dtype=dtype), values, weights, indices, kernel,
                                    [True, True, True, False])],
        "knn_attention_backward": [(torch.ones_like(out), q, k, values, kernel, a_scores, a_indices, a_weights,
                                    "dot", "softmax", 1.0, [True, True, True, True, False]),
                                   (torch.ones_like(out4), q4, k4, v4,
                                    kernel, *saved4, "dot", "softmax", 1.0, [True, True, True, True, False])],
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("test", TESTS)
@pytest.mark.parametrize("op_name,cases", [
    ("knn_select", select_cases), ("knn_aggregate", aggregate_cases), ("knn_attention", attention_cases)])
def test_forward_ops_pass_opcheck(op_name, cases, test, dtype):
    for args in cases(dtype):
        torch.library.opcheck(getattr(ops, op_name).default, args, test_utils=(test,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("test", TESTS)
@pytest.mark.parametrize("op_name", ["knn_select_backward", "knn_aggregate_backward", "knn_attention_backward"])
def test_backward_ops_pass_opcheck(op_name, test, dtype):
    for args in backward_cases(dtype)[op_name]:
        torch.library.opcheck(getattr(ops, op_name).default, args, test_utils=(test,))


def test_the_name_lists_come_from_the_library():
    # The lists the ops expose are the ones the ops check names against: every listed name is
    # accepted, and an unknown name is refused with exactly that list (no test restates it).
    q = torch.randn(1, 4, 3)
    values, kernel = torch.randn(1, 4, 3), torch.ones(3, 2)
    for similarity in ops.similarity_names():
        ops.knn_select(q, q, 2, similarity, None, False)
    for rho in ops.rho_names():
        ops.knn_attention(q, q, values, kernel, None, 2, "dot", None, False, rho, 1.0)
    with pytest.raises(RuntimeError) as similarity_error:
        ops.knn_select(q, q, 2, "not-a-similarity", None, False)
    assert f"one of {', '.join(ops.similarity_names())};" in str(similarity_error.value)
    with pytest.raises(RuntimeError) as rho_error:
        ops.knn_attention(q, q, values, kernel, None, 2, "dot", None, False, "not-a-rho", 1.0)
    assert f"one of {', '.join(ops.rho_names())};" in str(rho_error.value)


def test_cuda_autocast_has_kernels_even_without_a_gpu():
    for name in ("knn_select", "knn_aggregate", "knn_attention"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"convnn::{name}", "AutocastCUDA"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"convnn::{name}", "AutocastCPU"), name


def test_fake_cuda_tensors_get_shapes_dtypes_and_the_device_without_a_gpu():
    """FakeTensorMode makes CUDA tensors on a machine without a GPU (the wheel is CUDA-enabled):
    the Meta kernels then give every op's outputs on the inputs' device, forward and backward,
    which is what torch.compile traces for a GPU model."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False):
        cuda = torch.device("cuda", 0)
        q = torch.empty(G, N, D, device=cuda)
        k = torch.empty(G, M, D, device=cuda)
        values = torch.empty(G, M, C, device=cuda, dtype=torch.bfloat16)
        kernel = torch.empty(6, C, K, device=cuda, dtype=torch.bfloat16)
        causal = torch.ones(N, M, dtype=torch.bool, device=cuda).tril()
        scores, indices = ops.knn_select(q, k, K, "cosine", causal, False)
        assert scores.shape == (G, N, K) and scores.device == cuda and indices.dtype == torch.int64
        weights = torch.empty(G, N, K, device=cuda, dtype=torch.bfloat16)
        out = ops.knn_aggregate(values, weights, indices, kernel, None)
        assert out.shape == (G, N, 6) and out.dtype == torch.bfloat16 and out.device == cuda
        out, a_scores, a_indices, a_weights = ops.knn_attention(
            q, k, k, torch.empty(D, K, device=cuda), None, K, "l1", None, True, "softmax", 0.5)
        assert out.shape == (G, N, D) and a_indices.shape == (G, N, K) and out.device == cuda
        grads = ops.knn_attention_backward(torch.empty_like(out), q, k, k, torch.empty(D, K, device=cuda),
                                           a_scores, a_indices, a_weights, "l1", "softmax", 0.5,
                                           [True, True, True, True, False])
        assert [g.shape if g is not None else None for g in grads] == [q.shape, k.shape, k.shape, (D, K), None]
        assert all(g.device == cuda for g in grads if g is not None)


def layer_cases(dtype):
    """layer_forward of each layer, and the functional forms, on a layer's own tensors."""
    from convnn.nn import BranchingConv2d, ConvNN1d, ConvNN2d, ConvNNAttention

    torch.manual_seed(0)
    layers = [
        (ConvNN1d(3, 4, 3, padding=1), (2, 3, 6)),
        (ConvNN2d(3, 4, 9, padding=1, rho="softmax", similarity="dot"), (2, 3, 4, 4)),
        (ConvNNAttention(8, 2, 3, causal=True), (2, 5, 8)),
        (BranchingConv2d(3, 4, k=9), (2, 3, 4, 4)),
    ]
    cases = []
    for layer, shape in layers:
        layer = layer.to(dtype)
        state = list(layer.named_parameters()) + list(layer.named_buffers())
        x = tensor(*shape, dtype=dtype, seed=7)
        cases.append((torch.ops.convnn.layer_forward.default,
                      (layer._layer, layer._texts, x, [n for n, _ in state], [t for _, t in state], True, None, None)))
    x2d, x1d = tensor(2, 3, 4, 4, dtype=dtype, seed=8), tensor(2, 3, 6, dtype=dtype, seed=9)
    cases.append((torch.ops.convnn.conv_nn2d.default, (x2d, tensor(4, 3, 9, dtype=dtype, seed=10), None,
                                                        ["k=9", "padding=1"], None)))
    cases.append((torch.ops.convnn.conv_nn1d.default, (x1d, tensor(3, 3, dtype=dtype, seed=11), None,
                                                        ["k=3", "padding=1"], None)))
    q, k = tensor(2, 5, 4, dtype=dtype, seed=12), tensor(2, 6, 4, dtype=dtype, seed=13)
    cases.append((torch.ops.convnn.conv_nn.default, (q, k, k, tensor(4, 4, 3, dtype=dtype, seed=14), None,
                                                      ["k=3", "similarity=l1", "rho=softmax"], None, None, None)))
    x = tensor(2, 5, 4, dtype=dtype, seed=15)
    wq, wk, wv = (tensor(4, 4, dtype=dtype, seed=seed) for seed in (16, 17, 18))
    bq, bk, bv = (tensor(4, dtype=dtype, seed=seed) for seed in (19, 20, 21))
    cases.append((torch.ops.convnn.attention_project_qkv.default, (x, wq, bq, wk, bk, wv, bv)))  # one product
    cases.append((torch.ops.convnn.attention_project_qkv.default, (x, wq, None, wk, bk, wv, None)))  # three
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("test", TESTS)
def test_layer_and_functional_ops_pass_opcheck(test, dtype):
    for op, args in layer_cases(dtype):
        torch.library.opcheck(op, args, test_utils=(test,))
