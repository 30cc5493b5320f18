"""knn_attention with heads as a dimension ([B,H,N,D], src/ops/op_signatures.h): what ConvNNAttention
hands the op (head-split views of its projection, no fold copy), and the Python-side rules of that
layout: torch.vmap, the FLOP formula and the exporters' decomposition give what the [B*H,N,D] call
gives."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import convnn
from convnn import _decompositions
from convnn.nn import ConvNNAttention

ops = torch.ops.convnn
B, H, N, D, K = 2, 3, 7, 4, 3


class _AttentionCalls(TorchDispatchMode):
    """Records the arguments of every convnn::knn_attention call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is ops.knn_attention.default:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


def _heads(seed, dtype=torch.float64, b=B):
    """[B,H,N,D] query, key and value views of one [B,N,3*H*D] projection, as a layer makes them."""
    qkv = torch.randn(b, N, 3 * H * D, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return tuple(part.unflatten(2, (H, D)).transpose(1, 2) for part in qkv.split(H * D, -1))


def _folded(x):
    return x.flatten(0, 1).contiguous()


def test_on_cuda_the_layer_hands_the_op_views_of_its_projection_and_reads_its_output_as_a_view():
    """Where the op's kernels read heads in place (CUDA: ops.knn_attention_reads_head_dims_in_place),
    ConvNNAttention gives it [B,H,N,d] views of its projection and reads the [B,N,H,C] output as
    [B,N,H*C], without a copy either way. Fake CUDA tensors (no GPU here) carry the layouts the Meta
    kernels declare for them (autograd's engine needs a device to run a backward on them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda = torch.device("cuda", 0)
        layer = ConvNNAttention(H * D, H, K, device=cuda)
        x = torch.randn(B, N, H * D, device=cuda)
        assert ops.knn_attention_reads_head_dims_in_place(x)
        with _AttentionCalls() as recorded:
            y = layer(x)
        (queries, keys, values, *_), = recorded.calls
        assert queries.shape == keys.shape == values.shape == (B, H, N, D)
        # One storage for the three: the projection's output, read in place (no [B*H,N,d] copy).
        assert queries.untyped_storage() is keys.untyped_storage() is values.untyped_storage()
        assert not queries.is_contiguous()
        assert y.shape == x.shape


def test_on_the_cpu_the_layer_folds_its_heads_once_and_gives_what_the_op_gives_on_head_dims():
    """The CPU's kernels take [B*H,N,d] slices: the layer folds its heads itself (autograd saves the
    folds) and gives exactly what knn_attention gives on the [B,H,N,d] views of its projection."""
    layer = ConvNNAttention(H * D, H, K).double().eval()
    x = torch.randn(B, N, H * D, dtype=torch.float64)
    assert not ops.knn_attention_reads_head_dims_in_place(x)
    with torch.no_grad(), _AttentionCalls() as recorded:
        y = layer(x)
    (queries, *_), = recorded.calls
    assert queries.shape == (B * H, N, D)
    with torch.no_grad():
        q, k, v = (projection(x).unflatten(2, (H, D)).transpose(1, 2)
                   for projection in (layer.query_projection, layer.key_projection, layer.value_projection))
        out = ops.knn_attention(q, k, v, layer.kernel, None, K, "scaled_dot", None, False, "softmax", 1.0)[0]
        assert out.transpose(1, 2).is_contiguous()
        expected = layer.output_projection(out.transpose(1, 2).flatten(2))
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_vmap_over_head_dims_is_the_loop_over_samples():
    """Each vmapped sample a [B,H,N,D] call, its mask [N,M], or [1,H,N,M] and [1,1,N,M] broadcast over
    its B = 2 (which the folded call must not broadcast over every sample's batch)."""
    q, k, v = (t.unflatten(0, (2, 2)) for t in _heads(1, b=4))  # [2 samples, B 2, H, N, D]
    kernel = torch.randn(D, K, dtype=torch.float64)
    causal = torch.ones(2, N, N, dtype=torch.bool).tril()  # one [N,M] mask per sample
    per_head = torch.rand(2, 1, H, N, N, generator=torch.Generator().manual_seed(5)) < 0.6

    def attention(q, k, v, mask):
        return ops.knn_attention(q, k, v, kernel, None, K, "dot", mask, False, "softmax", 1.0)

    for mask in (causal, per_head, per_head[:, :, :1]):
        batched = torch.vmap(attention)(q, k, v, mask)
        for sample in range(2):
            looped = attention(q[sample], k[sample], v[sample], mask[sample])
            for got, want in zip(batched, looped):
                assert torch.equal(got[sample], want)


def test_the_flop_formula_counts_the_folded_call():
    q, k, v = _heads(2)
    kernel = torch.randn(D, K, dtype=torch.float64)

    def count(*inputs):
        with FlopCounterMode(display=False) as counter:
            ops.knn_attention(*inputs, kernel, None, K, "scaled_dot", None, False, "softmax", 1.0)
        return counter.get_total_flops()

    assert count(q, k, v) == count(_folded(q), _folded(k), _folded(v)) > 0


@pytest.mark.parametrize("mask_kind", ["none", "shared", "per_slice", "per_head", "shared_4d"])
def test_the_exporters_decomposition_gives_the_ops_results_and_layouts(mask_kind):
    q, k, v = _heads(3)
    kernel = torch.randn(D, K, dtype=torch.float64)
    masks = torch.rand(B, H, N, N, generator=torch.Generator().manual_seed(4)) < 0.6
    mask = {"none": None, "shared": torch.ones(N, N, dtype=torch.bool).tril(), "per_slice": masks,
            "per_head": masks[:1], "shared_4d": masks[:1, :1]}[mask_kind]
    args = (q, k, v, kernel, None, K, "l1", mask, False, "softmax", 1.0)
    decomposed, native = _decompositions._knn_attention(*args), ops.knn_attention(*args)
    for got, want in zip(decomposed, native):
        assert got.shape == want.shape and got.stride() == want.stride()
    # Masked slots of short rows: eager torch.topk picks among their -inf ties arbitrarily (ONNX's
    # TopK takes the lower index, test_onnx.py), so the ranked candidates are compared as sets here.
    def ranked(scores, indices):
        return torch.zeros(B, H, N, N, dtype=torch.bool).scatter(-1, indices, scores != float("-inf"))

    assert torch.equal(ranked(decomposed[1], decomposed[2]), ranked(native[1], native[2]))
    torch.testing.assert_close(decomposed[0], native[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(decomposed[3], native[3], rtol=0, atol=1e-12)
