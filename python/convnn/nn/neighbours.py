"""What the ConvNN layers select: the Neighbours that each layer's forward_with_neighbours and
record_neighbours (modules.py) return (the C++ struct convnn::nn::Neighbours, field for field; its
rules, on_token_grid and view, are the C++ ones, called through the dispatcher). The layers use
these types; nothing here uses the layers."""
import typing

import torch

_ops = torch.ops.convnn


class NeighbourView(typing.NamedTuple):
    """What a picture of one query shows (C++ convnn::nn::NeighbourView)."""

    row: int
    """The query's row among the Neighbours' queries (Q)."""
    query: typing.Tuple[int, ...]
    """The query's coordinates in the layer's input grid."""
    neighbours: torch.Tensor
    """int64 [H, K, D]: its neighbours' coordinates (outside [0, size): padding; -1 on every axis:
    a prefix token such as a ViT's class token)."""
    weights: torch.Tensor
    """[H, K]: their rho weights."""
    window: torch.Tensor
    """int64 [R^D, D]: the window of the convolution the layer generalises (R the least odd side
    with R^D >= K), with the layer's dilation; [0, D] for attention."""


class Neighbours(typing.NamedTuple):
    """One forward's selection of a ConvNN layer. The tensors are [B, H, Q, K] (no B for an input
    without a batch dimension), detached: H the heads, Q the queries in output order (row-major
    over the output grid), K the slots in the layer's slot order."""

    indices: torch.Tensor
    """int64. A spatial layer: each neighbour's row-major flat index in the zero-padded input
    grid; ConvNNAttention: its token index."""
    scores: torch.Tensor
    """Each neighbour's similarity to its query (rho's input); -inf: a masked slot."""
    weights: torch.Tensor
    """rho's weights, which the aggregation used."""
    positions: typing.Optional[torch.Tensor]
    """int64 [B, H, Q, K, D]: each neighbour's coordinates in the layer's input (None for attention
    tokens until on_token_grid places them)."""
    query_positions: typing.Optional[torch.Tensor]
    """int64 [Q, D]: each query's coordinates in the input (stride x its output position)."""
    input_sizes: typing.Tuple[int, ...]
    query_grid: typing.Tuple[int, ...]
    stride: typing.Tuple[int, ...]
    dilation: typing.Tuple[int, ...]
    padding: int
    k: int
    has_window: bool

    @classmethod
    def _from_op(cls, fields):
        """From the ops' tuple of the C++ fields (an undefined tensor arrives as None)."""
        fields = list(fields)
        for i in (5, 6, 7, 8):
            fields[i] = tuple(fields[i])
        return cls(*fields)

    def on_token_grid(self, grid: typing.Sequence[int], prefix_tokens: int = 0) -> "Neighbours":
        """An attention layer's neighbours with its tokens on a grid, as a ViT's patches: the first
        `prefix_tokens` tokens (the class token) are off the grid (-1 on every axis), the others
        row-major on `grid`; the prefix tokens' query rows are dropped."""
        return Neighbours._from_op(_ops.neighbours_on_token_grid(self.indices, self.scores, self.weights, self.k,
                                                                 list(grid), prefix_tokens))

    def view(self, point: typing.Sequence[float], sample: int = 0) -> NeighbourView:
        """The query nearest `point` (one fraction of the input in [0, 1] per axis) in `sample`: its
        coordinates, its neighbours' coordinates and weights, and the convolution's window."""
        if self.positions is None:
            raise ValueError("Neighbours.view: these neighbours are not on a grid (an attention layer's: place "
                             "its tokens with on_token_grid(grid, prefix_tokens) first)")
        row, query, neighbours, weights, window = _ops.neighbour_view(
            self.positions, self.weights, list(self.input_sizes), list(self.query_grid), list(self.stride),
            list(self.dilation), self.k, self.has_window, [float(p) for p in point], sample)
        return NeighbourView(row, tuple(query), neighbours, weights, window)
