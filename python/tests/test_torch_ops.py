"""Python users load libconvnn.so with torch.ops.load_library and get both ops with autograd."""
import os
import pathlib

import pytest
import torch

LIBRARY = os.environ.get(
    "CONVNN_LIBRARY",
    str(pathlib.Path(__file__).resolve().parents[2] / "build" / "lib" / "libconvnn.so"),
)
torch.ops.load_library(LIBRARY)
ops = torch.ops.convnn


def test_the_ops_are_registered():
    assert hasattr(ops, "knn_select")
    assert hasattr(ops, "knn_aggregate")
    assert hasattr(ops, "knn_attention")


def test_fused_attention_equals_sdpa_and_has_gradients():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    kernel = torch.ones(4, 9, dtype=torch.float64)
    out, scores, indices, weights = ops.knn_attention(
        q, k, v, kernel, None, 9, "scaled_dot", None, False, "softmax", 1.0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max().item() < 1e-12
    assert torch.autograd.gradcheck(
        lambda q, k, v: ops.knn_attention(q, k, v, kernel[:, :3], None, 3, "scaled_dot", None,
                                          False, "softmax", 0.5)[0], (q, k, v))


def test_attention_identity_matches_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 12, 8, dtype=torch.float64) for _ in range(3))
    scores, indices = ops.knn_select(q, k, 12, "scaled_dot", None, False)
    out = ops.knn_aggregate(v, torch.softmax(scores, -1), indices,
                            torch.ones(8, 12, dtype=torch.float64), None)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max().item() < 1e-12


def test_gradcheck_select_every_similarity():
    torch.manual_seed(1)
    for similarity in ["dot", "scaled_dot", "cosine", "gaussian", "chebyshev"]:
        q = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda q, k: ops.knn_select(q, k, 3, similarity, None, False)[0], (q, k)), similarity


def test_gradcheck_aggregate_depthwise_and_standard():
    torch.manual_seed(2)
    values = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    indices = torch.randint(0, 7, (2, 5, 4))
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    depthwise = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    standard = torch.randn(3, 3, 4, dtype=torch.float64, requires_grad=True)
    for kernel in (depthwise, standard):
        assert torch.autograd.gradcheck(
            lambda v, w, ker, b: ops.knn_aggregate(v, w, indices, ker, b),
            (values, weights, kernel, bias))


def test_bad_input_raises_a_clear_error():
    q = torch.randn(2, 5, 3)
    with pytest.raises(RuntimeError, match=r"k must be in \[1, M\] where M = 5"):
        ops.knn_select(q, q, 6, "dot", None, False)
    with pytest.raises(RuntimeError, match="similarity must be one of"):
        ops.knn_select(q, q, 2, "euclid", None, False)
