"""convnn.models.create_model: the C++ registry's ResNets and ViTs in Python, with the C++ parameter
counts, state_dict keys and initial tensors, and outputs and gradients bitwise equal to the C++
model on the same weights (convnn_layer_parity in model mode)."""
import json
import os
import pathlib
import re
import subprocess

import pytest
import torch

import convnn.models as models

PARITY = os.environ.get(
    "CONVNN_LAYER_PARITY", str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" / "convnn_layer_parity"))


def parameters(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_equal_the_cpp_ones():
    # torchvision's counts, and the paper's ResNet-50 with branching layers (tests/models/resnet_test.cpp).
    assert parameters(models.create_model("resnet18")) == 11_689_512
    assert parameters(models.create_model("resnet34")) == 21_797_672
    assert parameters(models.create_model("resnet50")) == 25_557_032
    assert parameters(models.create_model("resnet50", layer="branching", k=9)) == 26_474_760
    assert parameters(models.create_model("resnet50", layer="branching", k=16)) == 29_671_688
    # The stride-2 3x3 convolutions as ConvNN layers of stride 2: still the convolutions' count.
    assert parameters(models.create_model("resnet18", layer="convnn", strided_slots=True)) == 11_689_512


def test_vit_parameter_counts_equal_timms():
    # timm's vit_tiny/small/base_patch16_224; KVT keeps the count (its kernel is a buffer of ones).
    assert parameters(models.create_model("vit_tiny")) == 5_717_416
    assert parameters(models.create_model("vit_small", attention="kvt")) == 22_050_664
    assert parameters(models.create_model("vit_base")) == 86_567_656


SMALL = dict(small_stem=True, width=8, num_classes=10, image_size=16, in_channels=1)
CASES = {
    "conv": dict(SMALL),
    "convnn": dict(SMALL, layer="convnn", k=9),
    "branching": dict(SMALL, layer="branching", k=9),
    "branching-random": dict(SMALL, layer="branching", k=9, num_candidates=12),
    "convnn-strided-slots": dict(SMALL, layer="convnn", k=9, strided_slots=True),
    "branching-strided-slots": dict(SMALL, layer="branching", k=9, strided_slots=True),
}


VIT = dict(image_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=3, num_classes=5)
VIT_CASES = {
    "vit-mhsa": dict(VIT, dropout=0.1, drop_path=0.1, attention_dropout=0.1),
    "vit-kvt": dict(VIT, attention="kvt", k=5),
    "vit-convnn": dict(VIT, attention="convnn", k=5, drop_path=0.2, num_candidates=9),
    "vit-paper": dict(VIT, attention="convnn", k=5, paper=True),
}
MODELS = [("resnet18", name, options, (2, 1, 16, 16)) for name, options in CASES.items()]
MODELS += [("vit_tiny", name, options, (2, 3, 16, 16)) for name, options in VIT_CASES.items()]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("model_name,case,options,shape", MODELS, ids=[m[1] for m in MODELS])
def test_outputs_and_gradients_equal_the_cpp_model_bitwise(tmp_path, model_name, case, options, shape, training):
    torch.manual_seed(0)
    model = models.create_model(model_name, **options).double().train(training)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    # Random candidates draw from the default generator in training: both sides seed it the same.
    torch.manual_seed(11)
    out = model(x)
    grad_output = torch.randn_like(out)
    out.backward(grad_output)
    case_file, result_file = tmp_path / "case.pt", tmp_path / "result.pt"
    torch.save({"model": model_name, "config": json.dumps(options), "state": state, "input": x.detach(),
                "grad_output": grad_output, "training": training, "seed": 11}, case_file)
    subprocess.run([PARITY, str(case_file), str(result_file)], check=True)
    cpp = torch.load(result_file, weights_only=False)  # the tool's own output (torch::pickle_save)
    assert torch.equal(cpp["output"], out.detach())
    assert torch.equal(cpp["input_grad"], x.grad)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(cpp["grads"]) == set(grads)
    for n, g in grads.items():
        assert torch.equal(cpp["grads"][n], g), n


def test_construction_is_the_cpp_registrys():
    torch.manual_seed(3)
    first = models.create_model("resnet18", **CASES["branching"])
    after_first = torch.get_rng_state()
    torch.manual_seed(3)
    names, tensors = torch.ops.convnn.model_build("resnet18", json.dumps(CASES["branching"]))[3:5]
    # Building the Python tree draws nothing beyond the C++ construction itself.
    assert torch.equal(torch.get_rng_state(), after_first)
    state = first.state_dict()
    assert set(state) == set(names)
    for n, t in zip(names, tensors):
        assert torch.equal(state[n], t), n


def test_options_are_checked_by_the_cpp_registry():
    with pytest.raises(RuntimeError, match="kk"):
        models.create_model("resnet18", kk=3)
    with pytest.raises(RuntimeError, match="resnet99"):
        models.create_model("resnet99")
    with pytest.raises(RuntimeError, match="k = 16"):
        models.create_model("resnet50", layer="convnn", k=16, image_size=32)
    with pytest.raises(ValueError, match="position embedding fixes the size"):
        models.create_model("vit_tiny", **VIT)(torch.randn(1, 3, 32, 32))
    assert "resnet50" in models.model_names()


# ------------------------------------------------------------------------ the registry's table

def run_cli(*args, check=True):
    from cli_support import BINARY

    if not os.path.exists(BINARY):
        pytest.skip(f"the convnn command is not built ({BINARY})")
    result = subprocess.run([BINARY, *args], capture_output=True, text=True, check=check,
                            env={**os.environ, "CONVNN_NUM_THREADS": "1"})
    return result.stdout if check else result


def test_the_cpp_table_is_the_one_list_of_models():
    """create_model, `convnn info --list` and compare's choices read one C++ table (test_timm.py
    checks timm's names against it too)."""
    table = models.model_table()
    names = [row["name"] for row in table]
    assert names == models.model_names() == list(torch.ops.convnn.model_names())
    assert names == ["resnet18", "resnet34", "resnet50", "vit_tiny", "vit_small", "vit_base", "vit_large",
                     "lm_tiny", "lm_small"]
    assert {row["family"] for row in table} == {"resnet", "vit", "lm"}
    assert json.loads(run_cli("info", "--list", "--json")) == table
    listed = [line.split()[:2] for line in run_cli("info", "--list").splitlines()]
    assert listed == [[row["name"], row["family"]] for row in table]
    # compare's --families and --vit-model choices: CLI11 prints them as TEXT:{a,b,...}.
    help_text = run_cli("compare", "--help")
    choices = {flag: set(values.split(",")) for flag, values in re.findall(r"(--[a-z-]+) TEXT:\{([^}]*)\}", help_text)}
    assert choices["--vit-model"] == {row["name"] for row in table if row["family"] == "vit"}
    # compare's grid is of image classifiers; the language models are compared by scripts/lm-results.sh.
    assert choices["--families"] == {row["family"] for row in table} - {"lm"}


def test_compares_grid_and_timms_listing_follow_the_family_rows(tmp_path):
    """`convnn compare`'s cells are each image family's layer without ConvNN, then its ConvNN layers
    at every K (on random candidates too where the row says so), as the C++ family rows list them;
    timm lists exactly the rows with a timm listing, under their suffixes."""
    from cli_support import make_data_set

    families = models.model_family_table()
    assert [row["name"] for row in families] == ["resnet", "vit", "lm"]
    image = [row for row in families if row["image_classifier"]]
    assert [row["name"] for row in image] == [row["name"] for row in families if row["timm"] is not None]
    data = make_data_set(tmp_path)
    listed = run_cli("compare", "--dry-run", "--families", ",".join(row["name"] for row in image), "--ks", "4,9",
                     "--random-candidates", "16", "--data-dir", str(data), "--output", str(tmp_path / "runs"))
    cells = [line.split()[0] for line in listed.splitlines()[1:]]
    expected = []
    for row in image:
        expected.append(f"{row['name']}-{row['baseline_layer']}")
        for layer in row["convnn_layers"]:
            for k in (4, 9):
                if row["compare_random_candidates"]:
                    expected += [f"{row['name']}-{layer}-k{k}-all", f"{row['name']}-{layer}-k{k}-r16"]
                else:
                    expected.append(f"{row['name']}-{layer}-k{k}")
    assert cells == expected
    assert not (tmp_path / "runs").exists()  # a dry run trains nothing and writes nothing


def test_vit_large_is_one_row_with_timms_parameter_count():
    row = next(row for row in models.model_table() if row["name"] == "vit_large")
    assert row == {"name": "vit_large", "family": "vit",
                   "preset": {"embed_dim": 1024, "depth": 24, "num_heads": 16, "mlp_dim": 4096}}
    # timm's vit_large_patch16_224: 304,326,632 (plain attention, 224 px, 1000 classes).
    assert parameters(models.create_model("vit_large")) == 304_326_632


def test_an_unknown_model_is_refused_with_the_valid_names():
    valid = ", ".join(models.model_names())
    with pytest.raises(RuntimeError, match=re.escape(f"model must be one of {valid}; got 'vit_huge'")):
        models.create_model("vit_huge")
    valid = ",".join(models.model_names())
    result = run_cli("info", "--model", "vit_huge", check=False)
    assert result.returncode != 0 and f"vit_huge not in {{{valid}}}" in result.stderr
    result = run_cli("info", check=False)
    assert result.returncode == 1 and result.stderr.strip() == (
        "convnn: error: info: --model is required (convnn info --list names the models)")
    result = run_cli("info", "--list", "--model", "resnet18", check=False)
    assert result.returncode != 0 and "excludes --list" in result.stderr
