"""FlopCounterMode counts the convnn ops by the rules of docs/flops.md, through formulas that call
the C++ rules (the ones `convnn info` reports)."""
import torch
from torch.utils.flop_counter import FlopCounterMode

import convnn  # noqa: F401  (registers the formulas)
from convnn.nn import ConvNN1d, ConvNN3d, ConvNNAttention


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
    cosine = 2 * (n * n * c + 2 * n * c) + 2 * n * n + 2 * 2 * n  # N M D + (N+M) D MACs; 2 H N M + 2 (N+M) H
    aggregate = n * k * c + 2 * n * k * c * c_out
    counts = convnn_flops(layer, torch.randn(1, 4, n))
    assert counts == {"convnn.knn_select": cosine, "convnn.knn_aggregate": aggregate}
    fused = convnn_flops(ConvNN1d(4, 6, 3), torch.randn(1, 4, n))
    assert fused == {"convnn.knn_attention": cosine + 2 * n * k * c * c_out}


def test_conv_nn3d_counts_the_same_rules_over_the_volumes_voxels():
    # ConvNN3d, chebyshev, uniform, standard aggregation 3 -> 5 channels, K = 4 on a 2x3x4 volume
    # without padding: N = M = 24 voxel tokens; the fused op counts the select step's rule plus the
    # aggregation's N K C C' MACs.
    layer = ConvNN3d(3, 5, 4, similarity="chebyshev")
    n, c, c_out, k = 24, 3, 5, 4
    unfused = convnn_flops(ConvNN3d(3, 5, 4, similarity="chebyshev", fused=False), torch.randn(1, c, 2, 3, 4))
    fused = convnn_flops(layer, torch.randn(1, c, 2, 3, 4))
    assert set(unfused) == {"convnn.knn_select", "convnn.knn_aggregate"}
    # The fused count is the select's plus the aggregation's matrix products (uniform rho: no weighting).
    assert fused == {"convnn.knn_attention": unfused["convnn.knn_select"] + 2 * n * k * c * c_out}
    # The same counts as ConvNN1d on the 24 tokens in a row: the op sees tokens, not their layout.
    line = convnn_flops(ConvNN1d(3, 5, 4, similarity="chebyshev"), torch.randn(1, c, n))
    assert line == fused


def test_a_vit_with_convnn_attention_counts_what_convnn_info_reports():
    """Model-wide: FlopCounterMode's count of the convnn ops equals the operator rows (similarity,
    top-k, rho, aggregation) of `convnn info --layers --json` for the same model. (ResNets with
    padded ConvNN2d layers differ by design: the op computes every padded position as a query,
    and `convnn info` charges only the output positions; docs/flops.md, "Useful work".)"""
    import json
    import subprocess

    from cli_support import BINARY

    options = {"attention": "convnn", "image_size": 32, "patch_size": 4, "depth": 2, "k": 9, "num_classes": 10}
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    info = json.loads(subprocess.check_output([BINARY, "info", "--model", "vit_tiny", *flags, "--layers", "--json"]))
    operator_rows = [row for row in info["layers"] if row["op"] in ("similarity", "topk", "rho", "aggregation")]
    assert len(operator_rows) == 4 * options["depth"]
    model = convnn.models.create_model("vit_tiny", **options).eval()
    with torch.no_grad():
        counts = convnn_flops(model, torch.randn(1, 3, 32, 32))
    assert counts == {"convnn.knn_attention": sum(row["flops"] for row in operator_rows)}
