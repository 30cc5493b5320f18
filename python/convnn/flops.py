"""FLOP formulas of the convnn ops for torch.utils.flop_counter.FlopCounterMode, registered when
convnn is imported. The counting rules are the C++ ones of docs/flops.md
(torch.ops.convnn.knn_call_flops, the same ops::knn_call_cost that `convnn info` reports), so
FlopCounterMode and `convnn info` agree. Only the forward ops have rules; their backward ops
count 0, as docs/flops.md counts inference.

knn_aggregate alone cannot tell uniform weights from others, so it is charged the weighting that
docs/flops.md skips for uniform rho; the layers call the fused knn_attention, which knows rho.
"""
import math

import torch
from torch.utils.flop_counter import register_flop_formula

_ops = torch.ops.convnn


def _aggregate_sizes(values_shape, kernel_shape):
    """(channels, out_channels, depthwise) per slice: kernel [C, K] is depthwise, [C', C, K] standard."""
    channels = values_shape[2]
    depthwise = len(kernel_shape) == 2
    return channels, channels if depthwise else kernel_shape[0], depthwise


@register_flop_formula(_ops.knn_select)
def _knn_select_flops(queries, keys, k, similarity, mask=None, index_order=False, *args, out_shape=None, **kwargs):
    g, n, d = queries
    return _ops.knn_call_flops("knn_select", g, n, keys[1], d, 0, 0, True, False, k, similarity, "uniform", 1.0)


@register_flop_formula(_ops.knn_aggregate)
def _knn_aggregate_flops(values, weights, indices, kernel, bias=None, *args, out_shape=None, **kwargs):
    g, n, k = weights
    channels, out_channels, depthwise = _aggregate_sizes(values, kernel)
    return _ops.knn_call_flops("knn_aggregate", g, n, values[1], 0, channels, out_channels, depthwise,
                               bias is not None, k, "dot", "softmax", 1.0)


@register_flop_formula(_ops.knn_attention)
def _knn_attention_flops(queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature,
                         *args, out_shape=None, **kwargs):
    *slices, n, d = queries  # [G,N,D], or [B,H,N,D] with heads as a dimension
    g = math.prod(slices)
    channels, out_channels, depthwise = _aggregate_sizes(values[-3:], kernel)
    return _ops.knn_call_flops("knn_attention", g, n, keys[-2], d, channels, out_channels, depthwise,
                               bias is not None, k, similarity, rho, temperature)
