"""What the layers select, from Python: forward_with_neighbours and record_neighbours return the C++
layer's Neighbours (the indices and weights it aggregated), recording leaves nothing behind, and
the default forward is unchanged."""
import pytest
import torch

import convnn
from convnn.nn import BranchingConv2d, ConvNN1d, ConvNN2d, ConvNNAttention, record_neighbours


def aggregated_from(x, padding, neighbours, kernel):
    """ConvNN2d's output [B, C', H*W] recomputed from the input, the returned indices and weights."""
    padded = torch.nn.functional.pad(x, [padding] * 4)
    b, c = x.shape[:2]
    heads, queries, k = neighbours.indices.shape[1:]
    tokens = padded.flatten(2).view(b, heads, c // heads, 1, -1).expand(-1, -1, -1, queries, -1)
    gathered = tokens.gather(-1, neighbours.indices.unsqueeze(2).expand(-1, -1, c // heads, -1, -1))
    weighted = gathered * neighbours.weights.unsqueeze(2)
    return torch.einsum("bhcqk,ock->bhoq", weighted, kernel).reshape(b, -1, queries)


def test_forward_with_neighbours_returns_what_the_layer_aggregated():
    torch.manual_seed(0)
    layer = ConvNN2d(4, 6, 5, padding=1, num_candidates=20, dtype=torch.float64).eval()
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64)
    y, n = layer.forward_with_neighbours(x)
    assert torch.equal(y, layer(x))
    assert n.indices.shape == (2, 1, 42, 5) and n.positions.shape == (2, 1, 42, 5, 2)
    assert n.input_sizes == (7, 6) and n.query_grid == (7, 6) and n.padding == 1 and n.k == 5 and n.has_window
    torch.testing.assert_close(aggregated_from(x, 1, n, layer.kernel), y.flatten(2), rtol=0, atol=1e-12)
    assert not n.indices.requires_grad and not n.weights.requires_grad


def test_strided_neighbours_keep_the_stride_lattice_and_one_sample_drops_the_batch():
    torch.manual_seed(1)
    layer = ConvNN2d(3, 3, 9, padding=1, stride=2, similarity="chebyshev", coordinates=True, alpha=0.0,
                     slot_order="index")
    image = torch.randn(3, 5, 6)
    y, n = layer.forward_with_neighbours(image)
    # An unbatched input's neighbours have no batch dimension: [H, Q, K].
    assert y.shape == (3, 3, 3) and n.indices.shape == (1, 9, 9) and n.positions.shape == (1, 9, 9, 2)
    assert n.query_positions.tolist()[:4] == [[0, 0], [0, 2], [0, 4], [2, 0]]
    batched = layer.forward_with_neighbours(image.unsqueeze(0))[1]
    view = batched.view([0.5, 0.5])
    assert view.query == (2, 2)
    assert torch.equal(view.neighbours[0], view.window), "the convolution case selects the 3x3 window"


def test_record_neighbours_keeps_each_layer_that_ran_and_leaves_nothing_behind():
    torch.manual_seed(2)
    model = torch.nn.Sequential(ConvNN2d(3, 4, 9, padding=1), torch.nn.ReLU(), BranchingConv2d(4, 4),
                                BranchingConv2d(4, 4, lambda_=0.0)).eval()
    x = torch.randn(2, 3, 6, 5)
    plain = model(x)
    with record_neighbours(model) as recorded:
        out = model(x)
        _, inner = model[0].forward_with_neighbours(x)
    assert torch.equal(out, plain)
    assert list(recorded) == ["0", "2"], "a branching layer without a ConvNN branch selects nothing"
    assert torch.equal(recorded["0"].indices, inner.indices)
    assert all("_neighbour_sink" not in layer.__dict__ for layer in model)
    with pytest.raises(RuntimeError):
        with record_neighbours(model):
            model(torch.randn(2, 5, 6, 5))
    assert all("_neighbour_sink" not in layer.__dict__ for layer in model)
    with pytest.raises(ValueError, match="with lambda_=0 there is no ConvNN branch"):
        model[3].forward_with_neighbours(x)


def test_attention_neighbours_per_head_and_on_the_patch_grid():
    torch.manual_seed(3)
    attention = ConvNNAttention(8, 2, 3).eval()
    x = torch.randn(2, 7, 8)
    y, n = attention.forward_with_neighbours(x, attn_mask=torch.ones(7, 7, dtype=torch.bool))
    assert torch.equal(y, attention(x, attn_mask=torch.ones(7, 7, dtype=torch.bool)))
    assert n.indices.shape == (2, 2, 7, 3) and n.positions is None and not n.has_window
    torch.testing.assert_close(n.weights.sum(-1), torch.ones(2, 2, 7))
    grid = n.on_token_grid([2, 3], prefix_tokens=1)
    assert grid.positions.shape == (2, 2, 6, 3, 2) and grid.input_sizes == (2, 3)
    cls = grid.indices == 0
    assert (grid.positions[cls] == -1).all()
    with pytest.raises(ValueError, match="not on a grid"):
        n.view([0.5, 0.5])
    with pytest.raises(RuntimeError, match=r"on_token_grid: the layer has 7 tokens, but prefix_tokens \+ the grid's"):
        n.on_token_grid([2, 2], 1)
    with pytest.raises(RuntimeError, match=r"point must be fractions of the input in \[0, 1\]"):
        grid.view([0.5, 2.0])


def test_a_layer_compiles_after_recording():
    torch.manual_seed(4)
    layer = ConvNN1d(3, 3, 3, padding=1)
    x = torch.randn(2, 3, 8)
    with record_neighbours(layer):
        layer(x)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


def test_the_window_and_point_rules_are_the_libraries():
    assert convnn.ops.window_side(9, 2) == 3 and convnn.ops.window_side(10, 2) == 5
    assert convnn.ops.picture_points([28, 28], [], 2) == [0.25, 0.25, 0.25, 0.75, 0.75, 0.25, 0.75, 0.75]
    assert convnn.ops.picture_points([28, 14], [13, 0], 3) == [13.5 / 28, 0.5 / 14]
    background = convnn.ops.picture_background(torch.arange(16.0).view(1, 4, 4), [2, 2])
    assert background.tolist() == [[0.0, 1 / 5], [4 / 5, 1.0]]
