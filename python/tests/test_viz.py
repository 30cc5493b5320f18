"""Pictures of the neighbours: `convnn viz` draws one PNG per ConvNN layer of a trained model (the
main job's configuration, on a tiny data set), and what it draws is what the layer returned: the
cells coloured as neighbours in each PNG are the positions of the indices the same layer returns
in Python for the same input (input.pt), head by head. Python's convnn.viz draws the same cells."""
import json
import pathlib
import subprocess

import matplotlib
import pytest
import torch
from PIL import Image

import convnn
from cli_support import BINARY, make_data_set

matplotlib.use("Agg")

REPO = pathlib.Path(__file__).resolve().parents[2]
MAIN_JOB_CONFIG = REPO / "configs" / "fashion-mnist.json"
QUERIES = [(5, 5), (20, 14), (27, 0)]


def convnn_command(*args, cwd=None):
    return subprocess.run([BINARY, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


def succeed(*args, cwd=None):
    result = convnn_command(*args, cwd=cwd)
    assert result.returncode == 0, f"convnn {' '.join(map(str, args))} failed:\n{result.stdout}\n{result.stderr}"
    return result


def train(root, data, experiment, *model_args):
    succeed("train", "--data-dir", data, "--train-subset", 64, "--val-subset", 64, "--epochs", 1, "--warmup-epochs", 0,
            "--batch-size", 32, "--workers", 0, "--quiet", "--no-plots", "--output", root / "runs", "--experiment",
            experiment, *model_args)
    return root / "runs" / experiment / "checkpoint-latest.pt"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("viz")
    data = make_data_set(root)
    branching = train(root, data, "branching", "--config", MAIN_JOB_CONFIG)
    vit = train(root, data, "vit", "--model", "vit_tiny", "--attention", "convnn", "--k", 5, "--patch-size", 7,
                "--depth", 1, "--embed-dim", 24, "--num-heads", 2, "--num-candidates", 0, "--lr", 1e-3)
    return root, data, branching, vit


def viz(checkpoint, output, *args):
    succeed("viz", "--checkpoint", checkpoint, "--output", output, *args)
    return json.loads((output / "neighbours.json").read_text())


def returned_neighbours(checkpoint, output):
    """Each layer's Neighbours for the input `convnn viz` ran on, from the Python model."""
    model = convnn.models.load_checkpoint(checkpoint).eval()
    image = torch.load(output / "input.pt", weights_only=True)
    with torch.no_grad(), convnn.nn.record_neighbours(model) as recorded:
        model(image.unsqueeze(0))
    return model, image, recorded


def returned_row(neighbours, layer, query):
    """The row of what the layer returned for the query at `query`: a spatial layer's rows are its
    output grid (the stride lattice); an attention layer's are its tokens, the class token first."""
    if layer["token_grid"]:
        return 1 + query[0] * layer["input_sizes"][1] + query[1]
    row = 0
    for axis, coordinate in enumerate(query):
        row = row * neighbours.query_grid[axis] + coordinate // neighbours.stride[axis]
    return row


def positions_of(indices, layer):
    """Indices -> (y, x) cells as drawn, written out here: a spatial layer's indices are flat in the
    padded grid; a token grid's are tokens after the class token, which is drawn at (-1, -1)."""
    height, width = layer["input_sizes"]
    cells = set()
    for index in indices:
        if layer["token_grid"]:
            cells.add((-1, -1) if index == 0 else divmod(index - 1, width))
        else:
            padded_width = width + 2 * layer["padding"]
            y, x = divmod(index, padded_width)
            cells.add((y - layer["padding"], x - layer["padding"]))
    return cells


def coloured_cells(png, layer, panel, colour):
    """The cells of one panel whose centre pixel has `colour`."""
    frame, cell = layer["frame"], layer["cell_px"]
    height, width = layer["input_sizes"]
    left, top = panel["box"][0], panel["box"][1]
    target = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    cells = set()
    for y in range(-frame, height + frame):
        for x in range(-frame, width + frame):
            pixel = png.getpixel((int(left + (x + 0.5 + frame) * cell), int(top + (y + 0.5 + frame) * cell)))
            if all(abs(pixel[c] - target[c]) <= 24 for c in range(3)):
                cells.add((y, x))
    return cells


def expected_size(layer):
    """The layout rule of apps/convnn/neighbour_plots.cpp, restated: 240-pixel panels of cells of
    at least 12 pixels, margins 70 / 16 and 56 / 12, gaps 16 and 28."""
    cells = max(layer["input_sizes"]) + 2 * layer["frame"]
    panel = cells * max(12, 240 // cells)
    columns = layer["heads"] + (0 if layer["token_grid"] else 1)
    return (70 + columns * panel + (columns - 1) * 16 + 16, 56 + layer["queries"] * panel + (layer["queries"] - 1) * 28 + 12)


def check_pictures(report, output, recorded):
    colours = report["colours"]
    for layer in report["layers"]:
        png_path = output / layer["file"]
        assert png_path.is_file(), png_path
        png = Image.open(png_path).convert("RGB")
        assert png.size == tuple(layer["size"]) == expected_size(layer), layer["name"]
        neighbours = recorded[layer["name"]]
        for panel in layer["panels"]:
            if "head" not in panel:
                continue
            returned = neighbours.indices[0, panel["head"], returned_row(neighbours, layer, panel["query"])].tolist()
            assert panel["indices"] == returned, (layer["name"], panel["query"])
            cells = positions_of(returned, layer)
            assert {tuple(c) for c in panel["neighbours"]} == cells, (layer["name"], panel["query"])
            assert coloured_cells(png, layer, panel, colours["neighbour"]) == cells, (layer["name"], panel)


def test_viz_draws_each_convnn_layer_with_the_neighbours_it_returned(runs, tmp_path):
    _, _, checkpoint, _ = runs
    output = tmp_path / "pictures"
    report = viz(checkpoint, output, *[arg for q in QUERIES for arg in ("--query", f"{q[0]},{q[1]}")])
    model, image, recorded = returned_neighbours(checkpoint, output)
    layers = [name for name, m in model.named_modules() if isinstance(m, convnn.nn.BranchingConv2d)]
    assert len(layers) == 13 and [layer["name"] for layer in report["layers"]] == layers
    assert image.shape == (1, 28, 28)
    for layer in report["layers"]:
        height, width = layer["input_sizes"]
        assert [p["query"] for p in layer["panels"] if "head" in p] == [
            [int((y + 0.5) / 28 * height), int((x + 0.5) / 28 * width)] for y, x in QUERIES]
        windows = [p["window"] for p in layer["panels"] if "window" in p]
        assert len(windows) == len(QUERIES) and all(len(w) == 9 for w in windows)
    check_pictures(report, output, recorded)


def test_viz_draws_a_vit_s_selected_patches_per_head(runs, tmp_path):
    _, _, _, checkpoint = runs
    output = tmp_path / "vit"
    report = viz(checkpoint, output, "--grid", 2)
    _, _, recorded = returned_neighbours(checkpoint, output)
    (layer,) = report["layers"]
    assert layer["name"] == "blocks.0.attn" and layer["token_grid"] and layer["heads"] == 2
    assert layer["input_sizes"] == [4, 4] and len(layer["panels"]) == 4 * 2
    check_pictures(report, output, recorded)


def test_python_draws_the_same_cells_as_the_command(runs, tmp_path):
    _, _, checkpoint, _ = runs
    output = tmp_path / "same"
    report = viz(checkpoint, output, "--query", "20,14", "--layers", "layer1.0.conv1,layer3.0.conv2")
    model = convnn.models.load_checkpoint(checkpoint)
    image = torch.load(output / "input.pt", weights_only=True)
    figures = convnn.viz.plot_neighbours(model, image, queries=[(20, 14)], layers=["layer1.0.conv1", "layer3.0.conv2"])
    assert list(figures) == [layer["name"] for layer in report["layers"]]
    for layer in report["layers"]:
        axes = figures[layer["name"]].axes
        drawn = {(round(p.get_y() + p.get_height() / 2), round(p.get_x() + p.get_width() / 2))
                 for p in axes[0].patches if p.get_gid() == "neighbour"}
        window = {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in axes[1].patches if p.get_gid() == "window"}
        assert drawn == {tuple(c) for c in layer["panels"][0]["neighbours"]}
        assert window == {tuple(c) for c in layer["panels"][1]["window"]}
    assert model.training, "plot_neighbours leaves the model in the mode it found"


def test_viz_of_an_image_file_and_a_second_run_replaces_the_pictures(runs, tmp_path):
    root, _, checkpoint, _ = runs
    picture = tmp_path / "shoe.png"
    Image.fromarray(torch.arange(40 * 30, dtype=torch.uint8).view(40, 30).numpy()).convert("RGB").save(picture)
    output = tmp_path / "file"
    first = viz(checkpoint, output, "--grid", 1)
    report = viz(checkpoint, output, "--image", picture, "--grid", 1, "--layers", "layer2.1.conv1")
    assert report["image"] == str(picture)
    assert [layer["file"] for layer in report["layers"]] == ["01-layer2.1.conv1.png"]
    pictures = sorted(p.name for p in output.glob("*.png"))
    assert pictures == ["01-layer2.1.conv1.png"], f"the earlier run's {len(first['layers'])} pictures are replaced"
    assert torch.load(output / "input.pt", weights_only=True).shape == (1, 28, 28)


@pytest.mark.parametrize("args, message", [
    (["--query", "28,3"], "picture_points: query pixel [28, 3] is outside the [28, 28] image"),
    (["--query", "3"], "--query '3' must be a pixel Y,X of the model's input image"),
    (["--layers", "layer9.conv1"], "--layers: no ConvNN layer named 'layer9.conv1' in resnet18; its ConvNN layers are "
                                    "layer1.0.conv1, layer1.0.conv2"),
    (["--sample", "64"], "--sample 64 is not a sample of the test split of fashion-mnist (64 samples: 0 to 63)"),
    (["--sample", "-1"], "--sample -1 is not a sample of the test split of fashion-mnist (64 samples: 0 to 63)"),
    (["--grid", "0"], "--grid: Value 0 not in range 1 to 16"),
    (["--image", "/nonexistent.png"], "/nonexistent.png"),
])
def test_viz_refuses_bad_input_naming_it(runs, tmp_path, args, message):
    _, data, checkpoint, _ = runs
    result = convnn_command("viz", "--checkpoint", checkpoint, "--data-dir", data, "--output", tmp_path / "x", *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
