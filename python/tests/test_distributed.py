"""Data-parallel `convnn train` on c10d (Gloo over loopback): two processes train the weights
one process trains with the same global batch, evaluation is sharded without counting a sample
twice, and a rank that dies or is interrupted stops the others, after which the run resumes.

The equivalence runs in float64 (--precision float64), where the two runs differ only by the
order of the all-reduce's sums: measured 4.2e-15 at most on this test's ViT (6 steps) and 3.6e-14 on a
wider one (16 steps) (AMD EPYC, 2026-11-24),
against 1.9e-5 in float32, where AdamW's normalisation magnifies last-bit differences of tiny
gradients."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from cli_support import BINARY, make_data_set

TORCHRUN = str(pathlib.Path(sys.executable).with_name("torchrun"))
VAL_SAMPLES = 63  # odd: two ranks' shards differ in length, and a padded shard would count one twice
VIT = ["--model", "vit_tiny", "--patch-size", 7, "--depth", 2, "--embed-dim", 24, "--num-heads", 2,
       "--workers", 0, "--quiet", "--no-plots", "--warmup-epochs", 0, "--seed", 5]
EQUIVALENCE_TOLERANCE = 1e-10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def convnn_args(*args):
    return [BINARY, *map(str, args)]


def torchrun(nproc, *args, cwd, timeout=120):
    command = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--no-python",
               *convnn_args(*args)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def by_hand(world, *args, cwd):
    """The ranks of a group started without torchrun, as its environment variables describe."""
    port = free_port()
    return [subprocess.Popen(convnn_args(*args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank),
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
            for rank in range(world)]


def ok(result):
    assert result.returncode == 0, f"status {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def state(run_dir):
    return torch.load(run_dir / "checkpoint-latest.pt", weights_only=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    return root, make_data_set(root, samples=VAL_SAMPLES)


def test_two_ranks_train_the_weights_of_one_rank_with_the_same_global_batch(data):
    root, data_dir = data
    common = [*VIT, "--data-dir", data_dir, "--train-subset", 48, "--epochs", 2, "--precision", "float64",
              "--output", root / "runs"]
    single = subprocess.run(convnn_args("train", *common, "--batch-size", 16, "--experiment", "one"), cwd=root,
                            capture_output=True, text=True, timeout=120)
    ok(single)
    two = torchrun(2, "train", *common, "--batch-size", 8, "--experiment", "two", cwd=root)
    first_line = ok(two).splitlines()[0]
    assert "2 processes (gloo" in first_line, first_line
    one_state, two_state = state(root / "runs" / "one"), state(root / "runs" / "two")
    assert one_state["position"]["step"] == two_state["position"]["step"] == 6
    difference = max((one_state["state_dict"][k] - two_state["state_dict"][k]).abs().max().item()
                     for k in one_state["state_dict"])
    assert difference < EQUIVALENCE_TOLERANCE, difference
    config = json.loads((root / "runs" / "two" / "config.json").read_text())
    assert config["world_size"] == 2 and config["dist_backend"] == "gloo"

    # Sharded evaluation: the same counts as one process's, over all 63 samples once.
    one_metrics = json.loads((root / "runs" / "one" / "metrics.json").read_text())
    two_metrics = json.loads((root / "runs" / "two" / "metrics.json").read_text())
    for a, b in zip(one_metrics, two_metrics):
        assert a["val_top1"] == b["val_top1"] and a["val_top5"] == b["val_top5"]
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-9
        for percent in (b["val_top1"], b["val_top5"]):
            count = percent * VAL_SAMPLES / 100
            assert abs(count - round(count)) < 1e-6, f"{percent}% is no count of {VAL_SAMPLES} samples"
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-9)


def wait_for(path, processes, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert all(p.poll() is None for p in processes), "a rank ended before the first checkpoint"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


def long_run(data_dir, root, experiment):
    return ["train", *VIT, "--data-dir", data_dir, "--train-subset", 48, "--batch-size", 8, "--epochs", 12,
            "--output", root / "runs", "--experiment", experiment]


def test_a_killed_rank_stops_the_other_at_once_and_the_run_resumes(data):
    root, data_dir = data
    ranks = by_hand(2, *long_run(data_dir, root, "killed"), cwd=root)
    wait_for(root / "runs" / "killed" / "checkpoint-latest.pt", ranks)
    ranks[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = ranks[0].communicate(timeout=60)
    ranks[1].communicate()
    assert ranks[0].returncode not in (0, None), stderr
    assert time.monotonic() - killed_at < 30, "the surviving rank waited for the timeout"
    assert stderr.strip().splitlines()[-1].startswith("convnn: error: rank 0 of 2"), stderr
    assert "died" in stderr, stderr
    resumed = torchrun(2, "train", "--resume", root / "runs" / "killed", cwd=root)
    ok(resumed)
    assert state(root / "runs" / "killed")["position"]["epoch"] == 12


def test_ctrl_c_on_any_rank_saves_once_and_stops_every_rank(data):
    root, data_dir = data
    ranks = by_hand(2, *long_run(data_dir, root, "interrupted"), cwd=root)
    wait_for(root / "runs" / "interrupted" / "checkpoint-latest.pt", ranks)
    ranks[1].send_signal(signal.SIGINT)  # not rank 0: the one that writes
    outputs = [rank.communicate(timeout=60) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [130, 130], outputs
    assert outputs[0][0].count("stopped at epoch") == 1 and "stopped at epoch" not in outputs[1][0], outputs
    position = state(root / "runs" / "interrupted")["position"]
    assert 0 < position["epoch"] < 12 or position["next_batch"] > 0, position
    ok(torchrun(2, "train", "--resume", root / "runs" / "interrupted", cwd=root))
    assert state(root / "runs" / "interrupted")["position"]["epoch"] == 12


def test_resuming_within_an_epoch_with_another_world_size_is_refused(data):
    root, data_dir = data
    ranks = by_hand(2, *long_run(data_dir, root, "mid-epoch"), cwd=root)
    wait_for(root / "runs" / "mid-epoch" / "checkpoint-latest.pt", ranks)
    ranks[0].send_signal(signal.SIGINT)
    for rank in ranks:
        rank.communicate(timeout=60)
    position = state(root / "runs" / "mid-epoch")["position"]
    if position["next_batch"] == 0:
        pytest.skip("the stop fell on an epoch's end, which any world size resumes")
    single = subprocess.run(convnn_args("train", "--resume", root / "runs" / "mid-epoch"), cwd=root,
                            capture_output=True, text=True, timeout=120)
    assert single.returncode != 0 and "resume it with 2" in single.stderr, single.stderr


def test_a_rank_that_cannot_reach_the_rendezvous_fails_naming_the_address(data, tmp_path):
    root, data_dir = data
    port = free_port()  # nothing listens there
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    started = time.monotonic()
    result = subprocess.run(convnn_args("train", *VIT, "--data-dir", data_dir, "--dist-timeout", 2,
                                        "--output", tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("convnn: error: rank 1 of 2 could not join the process group at 127.0.0.1:"
                           f"{port} within 2 s"), result.stderr
    assert time.monotonic() - started < 30
    assert not any(tmp_path.iterdir()), "a failed join left files"


@pytest.mark.parametrize("sync_bn", [True, False])
def test_synchronised_batch_norm_makes_two_ranks_train_the_weights_of_one(data, sync_bn):
    """A ResNet: with --sync-bn, two processes normalise with the statistics of the global batch
    and train the weights (and running statistics) of one process; without it (DDP's default)
    each normalises its own half, and they do not."""
    root, data_dir = data
    flag = ["--sync-bn"] if sync_bn else []
    name = "sync" if sync_bn else "local"
    common = ["--model", "resnet18", "--small-stem", "--width", 4, "--workers", 0, "--quiet", "--no-plots",
              "--warmup-epochs", 0, "--seed", 5, "--data-dir", data_dir, "--train-subset", 48, "--epochs", 1,
              "--precision", "float64", "--output", root / "runs"]
    ok(subprocess.run(convnn_args("train", *common, "--batch-size", 16, "--experiment", f"bn-one-{name}"),
                      cwd=root, capture_output=True, text=True, timeout=120))
    ok(torchrun(2, "train", *common, *flag, "--batch-size", 8, "--experiment", f"bn-two-{name}", cwd=root))
    one, two = state(root / "runs" / f"bn-one-{name}"), state(root / "runs" / f"bn-two-{name}")
    difference = max((one["state_dict"][k].double() - two["state_dict"][k].double()).abs().max().item()
                     for k in one["state_dict"])
    if sync_bn:
        assert two["config"]["sync_bn"]
        assert difference < EQUIVALENCE_TOLERANCE, difference
    else:
        assert difference > 1e-6, difference


def test_nproc_starts_the_ranks_itself_and_passes_ctrl_c_on(data):
    """`convnn train --nproc 2` without torchrun: the same weights as one process with the global
    batch, and a Ctrl-C to it reaches both ranks once (rank 0 saves, all exit 130)."""
    root, data_dir = data
    common = [*VIT, "--data-dir", data_dir, "--train-subset", 48, "--epochs", 1, "--precision", "float64",
              "--output", root / "runs"]
    ok(subprocess.run(convnn_args("train", *common, "--batch-size", 16, "--experiment", "nproc-one"), cwd=root,
                      capture_output=True, text=True, timeout=120))
    two = subprocess.run(convnn_args("train", "--nproc", 2, *common, "--batch-size", 8, "--experiment", "nproc-two"),
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert "2 processes (gloo" in ok(two).splitlines()[0]
    one_state, two_state = state(root / "runs" / "nproc-one"), state(root / "runs" / "nproc-two")
    difference = max((one_state["state_dict"][k] - two_state["state_dict"][k]).abs().max().item()
                     for k in one_state["state_dict"])
    assert difference < EQUIVALENCE_TOLERANCE, difference

    parent = subprocess.Popen(convnn_args(*long_run(data_dir, root, "nproc-stopped"), "--nproc", 2),
                              cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(root / "runs" / "nproc-stopped" / "checkpoint-latest.pt", [parent])
    parent.send_signal(signal.SIGINT)
    stdout, stderr = parent.communicate(timeout=60)
    assert parent.returncode == 130, stderr
    assert stdout.count("stopped at epoch") == 1, stdout
