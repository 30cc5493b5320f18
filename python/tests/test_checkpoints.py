"""Checkpoints both ways between `convnn train` (C++) and Python: a CLI checkpoint is read by
torch.load(weights_only=True) and by convnn.models.load_checkpoint; a state_dict saved by Python is
evaluated by `convnn eval` and fine-tuned from by `convnn train --initial-checkpoint`, with exactly
its weights; mismatched, damaged and old files are errors that say what is wrong."""
import re
import subprocess

import pytest
import torch

import convnn
from cli_support import BINARY, make_data_set, tiny_run_args


def run_convnn(*args, cwd):
    return subprocess.run([BINARY, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


def succeed(*args, cwd):
    result = run_convnn(*args, cwd=cwd)
    assert result.returncode == 0, f"convnn {' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def eval_numbers(stdout):
    """top-1, top-5 and loss of `convnn eval`'s result line."""
    match = re.search(r"top-1 ([\d.]+)%\s+top-5 ([\d.]+)%\s+loss ([\d.]+)", stdout)
    assert match, stdout
    return match.groups()


class Run:
    def __init__(self, root):
        self.root = root
        self.data = make_data_set(root)
        succeed("train", *tiny_run_args(self.data), "--output", root / "runs", "--experiment", "cli",
                cwd=root)
        self.dir = root / "runs" / "cli"
        self.checkpoint = self.dir / "checkpoint-latest.pt"

    def eval(self, checkpoint, *model):
        return run_convnn("eval", "--checkpoint", checkpoint, "--data-dir", self.data, "--workers", 0,
                          "--output", self.root / "eval", *model, cwd=self.root)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return Run(tmp_path_factory.mktemp("checkpoints"))


def state_of(path):
    return torch.load(path, weights_only=True)["state_dict"]


def test_a_cli_checkpoint_is_a_plain_dict_for_torch_load_weights_only(run):
    checkpoint = torch.load(run.checkpoint, weights_only=True)
    assert checkpoint["convnn_format"] == 4
    assert checkpoint["config"]["model"] == "resnet18"
    assert checkpoint["config"]["model_config"]["width"] == 4
    assert checkpoint["position"]["epoch"] == 1 and checkpoint["position"]["step"] == 2
    python_model = convnn.models.create_model("resnet18", **checkpoint["config"]["model_config"])
    expected = python_model.state_dict()
    assert list(checkpoint["state_dict"]) == list(expected)
    for name, tensor in checkpoint["state_dict"].items():
        assert tensor.shape == expected[name].shape and tensor.dtype == expected[name].dtype, name


def test_load_checkpoint_gives_the_runs_model_with_its_weights(run):
    model = convnn.models.load_checkpoint(run.checkpoint)
    assert model.model_name == "resnet18" and model.training
    for name, tensor in state_of(run.checkpoint).items():
        assert torch.equal(model.state_dict()[name], tensor), name
    # A run directory stands for its latest checkpoint, as in `convnn eval --checkpoint DIR`.
    from_dir = convnn.models.load_checkpoint(run.dir)
    for name, tensor in model.state_dict().items():
        assert torch.equal(from_dir.state_dict()[name], tensor), name


def perturbed_state(run):
    """The run's weights, changed in Python so that only a load of this file gives them."""
    model = convnn.models.load_checkpoint(run.checkpoint)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5).add_(torch.randn(parameter.shape, generator=generator), alpha=0.01)
    return model.state_dict()


@pytest.mark.parametrize("wrapping", ["plain", "under-state_dict", "ddp-prefix"])
def test_convnn_eval_reads_a_state_dict_saved_by_python_as_the_checkpoint(run, wrapping):
    state = convnn.models.load_checkpoint(run.checkpoint).state_dict()
    saved = {"plain": state, "under-state_dict": {"state_dict": state, "epoch": 1},
             "ddp-prefix": {f"module.{k}": v for k, v in state.items()}}[wrapping]
    path = run.root / f"weights-{wrapping}.pt"
    torch.save(saved, path)
    original = run.eval(run.checkpoint)
    from_python = run.eval(path, "--config", run.dir / "config.json")
    from_flags = run.eval(path, "--model", "resnet18", "--small-stem", "--width", "4")
    for result in (original, from_python, from_flags):
        assert result.returncode == 0, result.stderr
    assert eval_numbers(from_python.stdout) == eval_numbers(original.stdout)
    assert eval_numbers(from_flags.stdout) == eval_numbers(original.stdout)


def test_convnn_eval_of_weights_alone_without_their_model_says_to_pass_config(run):
    """A state_dict that does not fit the default model: the error names the mismatch and says how
    to name the weights' model (before: only the mismatch)."""
    path = run.root / "weights-without-config.pt"
    torch.save(convnn.models.load_checkpoint(run.checkpoint).state_dict(), path)
    result = run.eval(path)
    assert result.returncode != 0
    assert "does not fit the model" in result.stderr, result.stderr
    assert "holds weights alone" in result.stderr and "pass --config runs/<run>/config.json" in result.stderr


def test_train_initial_checkpoint_starts_from_exactly_the_python_weights(run):
    """C++ -> Python -> C++: the fine-tuning run's parameters, after one step of SGD with a
    learning rate too small to move them, are bitwise the weights Python saved."""
    state = perturbed_state(run)
    path = run.root / "perturbed.pt"
    torch.save(state, path)
    succeed("train", *tiny_run_args(run.data), "--initial-checkpoint", path,
            "--opt", "sgd", "--momentum", 0, "--lr", 1e-30, "--min-lr", 1e-30, "--sched", "constant",
            "--weight-decay", 0, "--clip-grad", 0,
            "--output", run.root / "runs", "--experiment", "fine-tuned", cwd=run.root)
    fine_tuned = torch.load(run.root / "runs" / "fine-tuned" / "checkpoint-latest.pt", weights_only=True)
    assert fine_tuned["config"]["initial_checkpoint"] == str(path)
    parameters = dict(convnn.models.load_checkpoint(run.checkpoint).named_parameters())
    for name in parameters:
        assert torch.equal(fine_tuned["state_dict"][name], state[name]), name


def mismatched_files(run):
    state = convnn.models.load_checkpoint(run.checkpoint).state_dict()
    wider = convnn.models.create_model("resnet18", small_stem=True, width=8, in_channels=1,
                                       num_classes=10, image_size=28).state_dict()
    missing = dict(state)
    del missing["layer2.0.bn1.running_var"]
    return {
        "another-shape": (wider, ["'conv1.weight'", "[8, 1, 3, 3]", "[4, 1, 3, 3]"]),
        "a-key-missing": (missing, ["has no 'layer2.0.bn1.running_var'"]),
        "an-extra-key": ({**state, "head.extra": torch.zeros(3)}, ["'head.extra'", "does not have"]),
        "not-tensors": ({"epochs": 3, "lr": 0.1}, ["neither a convnn checkpoint nor a state_dict"]),
    }


@pytest.mark.parametrize("case", ["another-shape", "a-key-missing", "an-extra-key", "not-tensors"])
def test_a_mismatched_state_dict_is_one_line_naming_the_file_and_the_first_key(run, case):
    state, names = mismatched_files(run)[case]
    path = run.root / f"mismatch-{case}.pt"
    torch.save(state, path)
    for result in (run.eval(path, "--config", run.dir / "config.json"),
                   run_convnn("train", *tiny_run_args(run.data), "--initial-checkpoint", path,
                              "--output", run.root / f"mismatch-{case}", cwd=run.root)):
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("convnn: error: "), result.stderr
        for name in [str(path), *names]:
            assert name in lines[0], lines[0]
    assert not (run.root / f"mismatch-{case}").exists(), "a refused start left a run folder"


def test_a_run_checkpoint_refuses_model_flags_and_weights_alone_cannot_resume(run):
    refused = run.eval(run.checkpoint, "--model", "resnet34")
    assert refused.returncode != 0 and "leave out --model" in refused.stderr
    torch.save(state_of(run.checkpoint), run.root / "weights.pt")
    resumed = run_convnn("train", "--resume", run.root / "weights.pt", cwd=run.root)
    assert resumed.returncode != 0 and "holds weights only" in resumed.stderr


def test_load_checkpoint_errors_name_the_file_and_say_why(run, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(run.checkpoint.read_bytes()[:5000])
    with pytest.raises(convnn.models.CheckpointError, match=f"checkpoint '{truncated}' cannot be read"):
        convnn.models.load_checkpoint(truncated)
    weights = tmp_path / "weights.pt"
    torch.save(state_of(run.checkpoint), weights)
    with pytest.raises(convnn.models.CheckpointError, match="not a convnn run's checkpoint.*create_model"):
        convnn.models.load_checkpoint(weights)
    # A TorchScript archive, as convnn wrote checkpoints before format 3: opening one runs its code,
    # so it is refused with the way to convert it (the C++ side likewise:
    # CheckpointIntegrity.Format1IsRefusedUnlessTrustedThenLoadsAndNewerFormatsAreRefused).
    old = tmp_path / "old.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), old)
    with pytest.raises(convnn.models.CheckpointError,
                       match="TorchScript archive.*convnn checkpoint convert .* --trust-legacy"):
        convnn.models.load_checkpoint(old)


def test_load_checkpoint_names_a_config_or_state_dict_of_the_wrong_shape(run, tmp_path):
    """A config that is not a dict naming the model, or a missing state_dict: one message naming the
    file and the rule, not a bare TypeError or KeyError."""
    contents = torch.load(run.checkpoint, weights_only=True)
    cases = {"config-list": ({**contents, "config": [1, 2]}, "not a convnn run's checkpoint"),
             "no-model": ({**contents, "config": {"model_config": {}}}, "without the run's model"),
             "options-list": ({**contents, "config": {**contents["config"], "model_config": [1]}},
                              "without the run's model"),
             "no-state": ({k: v for k, v in contents.items() if k != "state_dict"}, "has no 'state_dict'")}
    for name, (edited, message) in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save(edited, path)
        with pytest.raises(convnn.models.CheckpointError, match=f"checkpoint '{path}' .*{message}"):
            convnn.models.load_checkpoint(path)
