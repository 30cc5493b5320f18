"""FlopCounterMode counts the convnn ops by the rules of docs/flops.md, through formulas that call
the C++ rules (the ones `convnn info` reports)."""
import torch
from torch.utils.flop_counter import FlopCounterMode

import convnn  # noqa: F401  (registers the formulas)
from convnn.nn import ConvNN1d, ConvNNAttention


def convnn_flops(module, x):
    with FlopCounterMode(display=False) as counter:
        module(x)
    counts = counter.get_flop_counts()["Global"]
    return {str(op): n for op, n in counts.items() if "convnn" in str(op)}


def test_attention_counts_the_docs_rules():
    # B = 2 images, N = M = 10 tokens, H = 3 heads of d = 8 (C = 24), K = 5, scaled_dot, softmax,
    # depthwise: the op sees G = B*H = 6 slices, D = C = 6*8 = 48 in total.
    attention = ConvNNAttention(24, 3, 5)
    n, k, g, total = 10, 5, 6, 48
    similarity = 2 * n * n * total + g * n * n  # N M D MACs, the 1/sqrt(d) scale H N M
    rho = 4 * g * n * k                         # softmax, temperature 1
    weighting = n * k * total
    aggregation = 2 * n * k * total             # depthwise: N K C MACs
    counts = convnn_flops(attention, torch.randn(2, n, 24))
    assert counts == {"convnn.knn_attention": similarity + rho + weighting + aggregation}


def test_unfused_ops_count_select_and_aggregate():
    # ConvNN1d, cosine, uniform, standard aggregation 4 -> 6 channels, K = 3, L = 7, no padding,
    # composed (fused=false): knn_select, then knn_aggregate of all-ones weights (charged the
    # weighting, which the fused op would skip for uniform rho).
    layer = ConvNN1d(4, 6, 3, fused=False)
    n, c, c_out, k = 7, 4, 6, 3
    cosine = 2 * (n * n * c + 2 * n * c) + 2 * n * (1 + c)  # N M D + (N+M) D MACs; (N+M)(H+D)
    aggregate = n * k * c + 2 * n * k * c * c_out
    counts = convnn_flops(layer, torch.randn(1, 4, n))
    assert counts == {"convnn.knn_select": cosine, "convnn.knn_aggregate": aggregate}
    fused = convnn_flops(ConvNN1d(4, 6, 3), torch.randn(1, 4, n))
    assert fused == {"convnn.knn_attention": cosine + 2 * n * k * c * c_out}
