"""Pictures of what the ConvNN layers select, for notebooks: the pictures of ``convnn viz`` drawn
with matplotlib (``pip install convnn[viz]``).

For a few query positions of an image, each ConvNN layer's picture shows, per query, the K
neighbours it selected (per head) on the image at that layer's resolution, beside the window of
the convolution it generalises; a ViT's ConvNN attention shows the patches each head selected.
Which query, which cells and which window are the C++ library's rules (convnn/nn/neighbours.h),
the same ones ``convnn viz`` draws with.
"""
import typing

import torch

from .nn.modules import record_neighbours
from .nn.neighbours import NeighbourView, Neighbours

_ops = torch.ops.convnn

# The colours of `convnn viz` (C++ convnn::nn::PictureColours): neighbours, query, window, padding.
NEIGHBOUR_COLOUR, QUERY_COLOUR, WINDOW_COLOUR, PADDING_COLOUR = _ops.picture_colours()


class LayerPicture(typing.NamedTuple):
    """What one layer's picture shows."""

    name: str
    """The layer's module path."""
    neighbours: Neighbours
    """Its neighbours on a grid (an attention layer's tokens placed on the patch grid)."""
    background: torch.Tensor
    """[H, W] in [0, 1]: the image in grey at the layer's resolution."""
    points: typing.List[typing.Tuple[float, ...]]
    """The points asked for, as fractions of the image."""
    views: typing.List[NeighbourView]
    """Per point: the query nearest it, its neighbours and the convolution's window."""


def _token_grid(model, image_sizes):
    """A ViT's patch grid and prefix tokens: timm's patch_embed.grid_size and num_prefix_tokens, or
    convnn's patch_size."""
    patch_embed = getattr(model, "patch_embed", None)
    grid = getattr(patch_embed, "grid_size", None)
    if grid is None and getattr(model, "patch_size", None):
        grid = tuple(size // model.patch_size for size in image_sizes)
    if grid is None:
        return None
    return tuple(grid), int(getattr(model, "num_prefix_tokens", 0))


def neighbour_pictures(model: torch.nn.Module, image: torch.Tensor,
                       queries: typing.Optional[typing.Sequence[typing.Sequence[int]]] = None, grid: int = 3,
                       layers: typing.Optional[typing.Sequence[str]] = None) -> typing.List[LayerPicture]:
    """Runs `model` (in eval mode, without gradients) on one `image` [C, H, W] (as the model takes
    it: normalised) and returns, per 2-D ConvNN layer and ViT ConvNN attention layer (or those
    named in `layers`), what its picture shows: for the query pixels (y, x) of `queries`, or the
    centres of a grid x grid lattice, the query nearest each, its neighbours and the window."""
    if image.dim() != 3:
        raise ValueError(f"neighbour_pictures: image must be one image [C, H, W], got shape {tuple(image.shape)}")
    image_sizes = list(image.shape[1:])
    pixels = [int(c) for query in (queries or []) for c in query]
    flat = _ops.picture_points(image_sizes, pixels, grid)
    points = [tuple(flat[i:i + 2]) for i in range(0, len(flat), 2)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), record_neighbours(model) as recorded:
            model(image.unsqueeze(0))
    finally:
        model.train(was_training)
    unknown = sorted(set(layers or []) - set(recorded))
    if unknown:
        raise ValueError(f"neighbour_pictures: no ConvNN layer named {', '.join(unknown)} ran; the layers are "
                         f"{', '.join(recorded) or 'none'}")
    pictures = []
    for name, neighbours in recorded.items():
        if layers is not None and name not in layers:
            continue
        if neighbours.positions is None:  # attention: its tokens on the patch grid
            tokens = _token_grid(model, image_sizes)
            if tokens is None:
                if layers is not None:
                    raise ValueError(f"neighbour_pictures: {name} is an attention layer of a model without a patch "
                                     "grid (patch_embed.grid_size or patch_size), so its tokens have no place")
                continue
            neighbours = neighbours.on_token_grid(*tokens)
        if len(neighbours.input_sizes) != 2:
            if layers is not None:
                raise ValueError(f"neighbour_pictures: {name} is {len(neighbours.input_sizes)}-D; pictures are of "
                                 "2-D layers")
            continue
        views = [neighbours.view(point) for point in points]
        background = _ops.picture_background(image.detach().cpu(), list(neighbours.input_sizes))
        pictures.append(LayerPicture(name, neighbours, background, points, views))
    return pictures


def _square(ax, y, x, size, **style):
    from matplotlib.patches import Rectangle
    ax.add_patch(Rectangle((x - size / 2, y - size / 2), size, size, **style))


def _panel(ax, picture, view, head):
    """One panel: the background with the padding around it, the query, and either head `head`'s
    neighbours or (head None) the convolution's window."""
    n = picture.neighbours
    height, width = n.input_sizes
    frame = n.padding if n.has_window else 1  # a token grid keeps a frame for the class token
    ax.set_facecolor(PADDING_COLOUR)
    ax.imshow(picture.background.numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest",
              extent=(-0.5, width - 0.5, height - 0.5, -0.5))
    ax.set_xlim(-0.5 - frame, width - 0.5 + frame)
    ax.set_ylim(height - 0.5 + frame, -0.5 - frame)
    ax.set_xticks([])
    ax.set_yticks([])
    if head is None:
        for y, x in view.window.tolist():
            _square(ax, y, x, 1.0, fill=False, edgecolor=WINDOW_COLOUR, linewidth=1.5, gid="window")
    else:
        weights = view.weights[head]
        largest = float(weights.max()) if weights.numel() and float(weights.max()) > 0 else 1.0
        for (y, x), weight in zip(view.neighbours[head].tolist(), weights.tolist()):
            size = 0.6 + 0.4 * max(weight, 0.0) / largest  # a heavier neighbour is a larger square
            _square(ax, y, x, size, facecolor=NEIGHBOUR_COLOUR, edgecolor="none", gid="neighbour")
    _square(ax, view.query[0], view.query[1], 1.0, fill=False, edgecolor=QUERY_COLOUR, linewidth=2.0, gid="query")


def plot_neighbours(model: torch.nn.Module, image: torch.Tensor,
                    queries: typing.Optional[typing.Sequence[typing.Sequence[int]]] = None, grid: int = 3,
                    layers: typing.Optional[typing.Sequence[str]] = None, panel_size: float = 2.0):
    """The pictures of :func:`neighbour_pictures` as matplotlib figures, one per layer by its name:
    a row per query; a column per head with its K neighbours (red squares, larger for a larger
    weight; the query outlined in blue), and, for a spatial layer, a last column with the R x R
    window of the convolution it generalises (green). Padding cells are light grey."""
    import matplotlib.pyplot as plt
    figures = {}
    for picture in neighbour_pictures(model, image, queries, grid, layers):
        n = picture.neighbours
        heads = n.positions.shape[-4]
        columns = heads + (1 if n.has_window else 0)
        rows = len(picture.views)
        figure, axes = plt.subplots(rows, columns, figsize=(panel_size * columns, panel_size * rows + 0.6),
                                    squeeze=False)
        side = _ops.window_side(n.k, 2)
        for row, view in enumerate(picture.views):
            for head in range(heads):
                _panel(axes[row][head], picture, view, head)
            if n.has_window:
                _panel(axes[row][heads], picture, view, None)
            axes[row][0].set_ylabel(f"query {view.query[0]},{view.query[1]}", fontsize=8)
        corner = "" if n.has_window else " (corner: class token)"  # a token grid's prefix token, off the grid
        for head in range(heads):
            title = f"head {head}: K = {n.k}" if heads > 1 else f"ConvNN: K = {n.k}"
            axes[0][head].set_title(title + corner, fontsize=8)
        if n.has_window:
            axes[0][heads].set_title(f"convolution: {side}x{side}", fontsize=8)
        figure.suptitle(f"{picture.name} ({n.input_sizes[0]}x{n.input_sizes[1]})", fontsize=9)
        figures[picture.name] = figure
    return figures
