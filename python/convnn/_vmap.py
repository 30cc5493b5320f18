"""torch.vmap batching rules for the core ops.

The ops already work on a batch of G independent slices, so a vmapped call folds the vmapped
dimension into G and makes one call: the samples' slices are independent, exactly as the loop over
samples would treat them (bitwise: each slice is computed alone). Without a rule PyTorch would run
the op once per sample, with a performance warning. Where a sample-specific kernel or bias is
vmapped over (an ensemble), the slices would need different kernels, so that case loops over the
samples, as PyTorch's fallback does. The rules only move dimensions; every rule of the operator
stays in the C++ op they call.

torch.func.grad, jacrev, jacfwd and hessian do not come here: under them the ops run as ATen
compositions (src/ops/autograd/aten_autograd.h), which vmap batches op by op.
"""
import torch

_ops = torch.ops.convnn


def _batch_first(x, dim, batch_size):
    """x with the vmapped dimension first, expanded to batch_size where x is not vmapped."""
    if x is None:
        return None
    if dim is None:
        return x.unsqueeze(0).expand(batch_size, *x.shape)
    return x.movedim(dim, 0)


def _fold(x):
    """[B, G, ...] -> [B*G, ...]"""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _unfold(x, batch_size):
    return x.reshape(batch_size, x.shape[0] // batch_size, *x.shape[1:])


def _fold_mask(mask, dim, batch_size, slices):
    """A mask of [N,M] or one per slice ([G,N,M], or [B,H,N,M] with heads as a dimension) per sample,
    as the folded call takes it; `slices` is the queries' per-sample slice dims ([G] or [B,H])."""
    if mask is None or (dim is None and mask.dim() == 2):
        return mask  # one [N,M] mask for every slice of every sample
    mask = _batch_first(mask, dim, batch_size)
    if len(slices) == 2 and mask.dim() == 5 and mask.shape[1] != slices[0]:
        # A sample's [1,H,N,M] or [1,1,N,M] broadcasts over its batch (head_dims.cpp's fold_mask); folded,
        # the samples' batches are one, over which it would not.
        mask = mask.expand(batch_size, slices[0], *mask.shape[2:])
    if mask.dim() == 3:  # [B,N,M]: one per sample, the same for its slices
        mask = mask.view(batch_size, *(1,) * len(slices), *mask.shape[1:]).expand(batch_size, *slices,
                                                                                    *mask.shape[1:])
    return _fold(mask)


def _per_sample(op, info, in_dims, args):
    """The op once per sample, the results stacked: for a vmapped kernel or bias."""
    results = []
    for i in range(info.batch_size):
        sample = [a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]
        results.append(op(*sample))
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results)), (0,) * len(results[0])
    return torch.stack(results), 0


def _select_rule(info, in_dims, queries, keys, k, similarity, mask, index_order):
    q_dim, k_dim, _, _, mask_dim, _ = in_dims
    b = info.batch_size
    q, kk = _batch_first(queries, q_dim, b), _batch_first(keys, k_dim, b)
    scores, indices = _ops.knn_select(_fold(q), _fold(kk), k, similarity,
                                      _fold_mask(mask, mask_dim, b, q.shape[1:-2]), index_order)
    return (_unfold(scores, b), _unfold(indices, b)), (0, 0)


def _aggregate_rule(info, in_dims, values, weights, indices, kernel, bias):
    if in_dims[3] is not None or in_dims[4] is not None:
        return _per_sample(_ops.knn_aggregate, info, in_dims, (values, weights, indices, kernel, bias))
    b = info.batch_size
    folded = [_fold(_batch_first(t, d, b)) for t, d in zip((values, weights, indices), in_dims[:3])]
    return _unfold(_ops.knn_aggregate(*folded, kernel, bias), b), 0


def _attention_rule(info, in_dims, queries, keys, values, kernel, bias, k, similarity, mask,
                    index_order, rho, temperature):
    args = (queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature)
    if in_dims[3] is not None or in_dims[4] is not None:
        return _per_sample(_ops.knn_attention, info, in_dims, args)
    b = info.batch_size
    q, kk, v = (_batch_first(t, d, b) for t, d in zip((queries, keys, values), in_dims[:3]))
    outputs = _ops.knn_attention(_fold(q), _fold(kk), _fold(v), kernel, bias, k, similarity,
                                 _fold_mask(mask, in_dims[7], b, q.shape[1:-2]), index_order, rho,
                                 temperature)
    return tuple(_unfold(t, b) for t in outputs), (0, 0, 0, 0)


def register():
    torch.library.register_vmap("convnn::knn_select", _select_rule)
    torch.library.register_vmap("convnn::knn_aggregate", _aggregate_rule)
    torch.library.register_vmap("convnn::knn_attention", _attention_rule)
