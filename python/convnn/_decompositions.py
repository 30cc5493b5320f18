"""The core ops (knn_select, knn_aggregate, knn_attention) as ATen ops, for exporters that cannot run
convnn's kernels: registered in torch._decomp's table, which torch.onnx.export (dynamo=True) reads,
so a ConvNN model exports to a graph of standard ONNX operators (README, "Deploying with ONNX").
Eager execution, torch.compile (Inductor: registered below) and torch.export keep the ops themselves.

The maths is docs/operator.md's, restated here in ATen ops because an exporter traces Python: the
C++ reference composition (src/ops/reference) reads sizes as integers, which a dynamic batch makes
symbolic. python/tests/test_onnx.py holds the exported graphs, run by onnxruntime, to the C++ ops:
- the K best candidates by a top-k over the ranking keys, whose ties ONNX's TopK breaks toward the
  lower index, the rule of every convnn path; masked (-inf) candidates fill short rows lowest index
  first in the same way;
- no value checks: the exported graph cannot raise, so NaN or +inf features give unspecified
  indices there instead of the ops' error (the ops raise while the model is exported from finite
  example inputs).
"""
import math

import torch
import torch._decomp

from . import _after_import

_ops = torch.ops.convnn
_NEG_INF = float("-inf")
_DISTANCES = ("gaussian", "chebyshev", "l1")


def _known(kind, name, names):
    if name not in names:
        raise ValueError(f"convnn export: {kind} must be one of {', '.join(names)}, got '{name}'")


def _inverse_norms(x):
    """1 / max(|x|, eps) along the last dim, kept: cosine's factors (eps: the library's kCosineEps)."""
    return torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True).clamp_min(_ops.cosine_eps()).reciprocal()


def _ranking_keys(queries, keys, similarity):
    """[G, N, M] ranking keys: the score, or minus the distance (from exact pairwise differences)."""
    _known("similarity", similarity, tuple(_ops.similarity_names()))
    if similarity in ("dot", "scaled_dot", "cosine"):
        scores = torch.bmm(queries, keys.transpose(1, 2))
        if similarity == "cosine":  # (q.k * (1/|q|)) * (1/|k|), the order of every path
            return scores * _inverse_norms(queries) * _inverse_norms(keys).transpose(1, 2)
        return scores / math.sqrt(queries.shape[2]) if similarity == "scaled_dot" else scores
    differences = queries.unsqueeze(2) - keys.unsqueeze(1)  # [G, N, M, D]
    if similarity == "gaussian":
        distance = differences.square().sum(-1)
    elif similarity == "chebyshev":
        distance = differences.abs().amax(-1)
    else:
        assert similarity == "l1", similarity
        distance = differences.abs().sum(-1)
    return -distance


def _mask_of_every_slice(mask, slices):
    """A [G',N,M] mask whose slices serve G/G' query slices each (docs/operator.md, "Masks") as one
    slice per query slice; merged as _knn_attention_by_head's fold merges, for the same reason."""
    if mask.shape[0] == slices:  # one per slice (and an empty mask of no slices)
        return mask
    repeats = slices // mask.shape[0]
    repeated = mask.unsqueeze(1).expand(mask.shape[0], repeats, *mask.shape[1:]).contiguous()
    return repeated.as_strided((slices, *mask.shape[1:]), repeated.stride()[1:])


def _masked(ranking_keys, mask):
    if mask is None:
        return ranking_keys
    if mask.dim() == 3 and ranking_keys.dim() == 3:
        mask = _mask_of_every_slice(mask, ranking_keys.shape[0])
    if mask.dtype == torch.bool:
        return ranking_keys.masked_fill(~mask, _NEG_INF)
    return ranking_keys + mask.to(ranking_keys.dtype)


def _select(queries, keys, k, similarity, mask, index_order):
    top_keys, indices = torch.topk(_masked(_ranking_keys(queries, keys, similarity), mask), k, dim=-1)
    if index_order:  # the same K candidates by ascending index
        indices, order = torch.sort(indices, dim=-1)
        top_keys = top_keys.gather(-1, order)
    if similarity in _DISTANCES:  # exp(-distance); a masked slot stays -inf
        top_keys = top_keys.exp().masked_fill(top_keys == _NEG_INF, _NEG_INF)
    return top_keys, indices


def _rho_weights(scores, rho, temperature):
    _known("rho", rho, tuple(_ops.rho_names()))
    valid = scores != _NEG_INF
    if rho == "uniform":
        return valid.to(scores.dtype)
    if rho == "mean":
        ones = valid.to(scores.dtype)
        return ones / ones.sum(-1, keepdim=True).clamp_min(1.0)
    assert rho == "softmax", rho
    # In float32 for half precision, the largest valid score subtracted first; masked slots weigh 0
    # and a row without a valid slot all 0 (src/ops/reference/rho_forms.cpp).
    accumulated = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    largest = accumulated.amax(-1, keepdim=True)
    z = ((accumulated - largest) / temperature).masked_fill(~valid, _NEG_INF)
    z = z.masked_fill(~valid.any(-1, keepdim=True), 0.0)
    return torch.softmax(z, -1).masked_fill(~valid, 0.0).to(scores.dtype)


def _aggregate(values, weights, indices, kernel, bias):
    """y[g, i] = sum_k w[g, i, k] * W[.., k] v[g, I[g, i, k]] (+ bias): depthwise W [C, K], standard
    [C', C, K]."""
    g, m, c = values.shape
    offsets = indices + (torch.arange(g, device=indices.device) * m).view(-1, 1, 1)
    neighbours = values.reshape(-1, c).index_select(0, offsets.reshape(-1)).view(*indices.shape, c)
    weighted = neighbours * weights.unsqueeze(-1)  # [G, N, K, C]
    if kernel.dim() == 2:
        output = (weighted * kernel.t()).sum(2)
    else:
        output = torch.einsum("gnkc,ock->gno", weighted, kernel)
    return output if bias is None else output + bias


@torch._decomp.register_decomposition(_ops.knn_select.default)
def _knn_select(queries, keys, k, similarity, mask=None, index_order=False):
    return _select(queries, keys, k, similarity, mask, index_order)


@torch._decomp.register_decomposition(_ops.knn_aggregate.default)
def _knn_aggregate(values, weights, indices, kernel, bias=None):
    return _aggregate(values, weights, indices, kernel, bias)


@torch._decomp.register_decomposition(_ops.knn_attention.default)
def _knn_attention(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature):
    if queries.dim() == 4:  # heads as a dimension: the [B*H,N,D] slices, then the op's output layouts
        return _knn_attention_by_head(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho,
                                      temperature)
    scores, indices = _select(queries, keys, k, similarity, mask, index_order)
    weights = _rho_weights(scores, rho, temperature)
    return _aggregate(values, weights, indices, kernel, bias), scores, indices, weights


def _knn_attention_by_head(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature):
    """[B,H,N,D] inputs (src/ops/op_signatures.h, "Heads as a dimension"): scores, indices and weights
    [B,H,N,K], the output [B,H,N,C] stored as [B,N,H,C]."""
    batch, heads = queries.shape[:2]

    def fold(x):  # [B,H,rows,width] -> [B*H,rows,width]; a shared [N,M] mask stays as it is
        # As src/ops/merge_leading_dims.h, which says why not flatten, reshape or view: under tracing
        # a merged dim's stride is a Min of symbolic strides, on which the next view guards.
        if x is None or x.dim() == 2:
            return x
        x = x.contiguous()
        return x.as_strided((x.shape[0] * x.shape[1], *x.shape[2:]), x.stride()[1:])

    if mask is not None and mask.dim() == 4 and mask.shape[0] != batch:
        # [1,H,N,M] or [1,1,N,M], broadcast over the samples as the op broadcasts it (head_dims.cpp's fold_mask)
        mask = mask.expand(batch, *mask.shape[1:])
    output, *selection = _knn_attention(fold(queries), fold(keys), fold(values), kernel, bias, k, similarity,
                                        fold(mask), index_order, rho, temperature)
    output = output.unflatten(0, (batch, heads)).transpose(1, 2).contiguous().transpose(1, 2)
    return (output, *(t.unflatten(0, (batch, heads)) for t in selection))


def _inductor_runs_the_ops(lowering):
    """Inductor calls the ops' own kernels, as its implicit fallback for a custom op does, but
    registered before it lowers a graph: the implicit path refuses every op that has a decomposition
    in torch._decomp's table (the ones above, which are for exporters) whenever the environment sets
    CI, as GitHub Actions and most CI services do, so torch.compile of a ConvNN model failed there
    with "make_fallback(convnn.knn_attention.default): a decomposition exists"."""
    from torch._library.utils import get_layout_constraint_tag

    for op in (_ops.knn_select.default, _ops.knn_aggregate.default, _ops.knn_attention.default):
        if op not in lowering.lowerings:
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)


_after_import.call_after_import("torch._inductor.lowering", _inductor_runs_the_ops)
