"""Bad input on the `convnn` command line: bad config files, bad checkpoints, bad flag values and
unwritable output folders. Each must end in one stderr line `convnn: error: ...` that names the
offending value or file, with a non-zero status and no crash, trace or hang. Every case runs the
real binary in its own process under a timeout, so a crash or a hang fails that case alone; the
processes run side by side, as LibTorch's start-up takes most of each one's time."""
import concurrent.futures
import gzip
import os
import pathlib
import shutil
import struct
import subprocess
import zipfile

import pytest

from cli_support import BINARY, IMAGE_SIDE, SAMPLES, make_data_set, tiny_run_args

# Every case fails at parsing or before its first training step; the one real training run (the
# checkpoint's) takes a few seconds.
CASE_TIMEOUT_S = 60
# Each process takes one core and a few hundred MB.
PARALLEL_CASES = min(8, max(2, os.cpu_count() or 2))



def run_convnn(args, cwd, env=None, timeout=CASE_TIMEOUT_S):
    # One thread each: the cases run side by side.
    env = {**os.environ, "CONVNN_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([BINARY, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(result, *names):
    """The status says failure without a signal; stderr is one `convnn: error:` line naming
    every string of `names`."""
    described = f"status {result.returncode}\nstderr:\n{result.stderr}\nstdout:\n{result.stdout}"
    # Negative: killed by a signal; 128 + n: a shell's report of one (134 abort, 139 segfault).
    assert 1 <= result.returncode <= 127, described
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, described
    assert lines[0].startswith("convnn: error: "), described
    for marker in ("terminate called", "Exception raised from", "frame #"):
        assert marker not in result.stderr, described
    for name in names:
        assert str(name) in lines[0], f"the message does not name {name!r}\n{described}"


# ------------------------------------------------------------------------------- config files

CONFIG_FILES = {
    # name: (contents, or None for no file at all; the strings the message must hold)
    "missing": (None, []),
    "empty": ("", []),
    "malformed": ('{"epochs": 3,', []),
    "nested-100000-deep": ('{"epochs": ' + "[" * 100000 + "]" * 100000 + "}", ["nest more than 64 levels"]),
    "trailing-nul": ('{"epochs": 3}\0', ["NUL byte at offset 13"]),
    "not-an-object": ("[1, 2, 3]", []),
    "unknown-key": ('{"epochs": 3, "bogus_key": 1}', ["bogus_key"]),
    "unknown-model-key": ('{"model_config": {"heads": 2}}', ["heads"]),
    "wrong-type": ('{"epochs": "three"}', ["epochs"]),
    "unknown-enum-name": ('{"optimizer": "adamax"}', ["adamax"]),
    "former-key-beside-current": ('{"optimizer": "sgd", "opt": "adamw"}', ["'optimizer'", "'opt'"]),
    "directory": ("<dir>", []),
    "dev-zero": ("<dev-zero>", ["larger than 4 MiB"]),
}
CONFIG_COMMANDS = ["train", "compare"]


def config_cases(workdir):
    cases = {}
    for command in CONFIG_COMMANDS:
        for name, (contents, names) in CONFIG_FILES.items():
            path = workdir / f"config-{command}-{name}.json"
            if contents == "<dev-zero>":
                path = pathlib.Path("/dev/zero")
            elif contents == "<dir>":
                path.mkdir()
            elif contents is not None:
                path.write_text(contents)
            cases[("config", command, name)] = ([command, "--config", path], [path, *names])
    return cases


# -------------------------------------------------------------------------------- checkpoints

CHECKPOINT_KINDS = ["missing", "empty", "random-bytes", "json", "truncated", "nan-weights",
                    "run-folder-without-one", "nested-100000-deep", "self-referencing"]

# Pickles (protocol 2) that crashed the reader with a stack overflow, or made a cycle.
HOSTILE_PICKLES = {
    "nested-100000-deep": b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b".",
    "self-referencing": b"\x80\x02]q\x00h\x00a.",
}
CHECKPOINT_COMMANDS = ["train", "eval", "train-initial", "viz"]


def bad_checkpoint(kind, workdir, checkpoint):
    """A file (or folder) that --resume and --checkpoint must refuse."""
    path = workdir / f"bad-{kind}.pt"
    if kind == "missing":
        return path
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random-bytes":
        path.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(4096)))
    elif kind == "json":
        path.write_text('{"epochs": 1}')
    elif kind == "truncated":
        data = checkpoint.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "nan-weights":
        # The first weights (the stem's convolution, record data/0) overwritten in place with
        # NaN, as a damaged disk or a bad copy would: the archive stays readable, its contents
        # are wrong.
        shutil.copyfile(checkpoint, path)
        with zipfile.ZipFile(path) as archive:
            record = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
        assert record.file_size >= 64, record
        with open(path, "r+b") as f:
            f.seek(record.header_offset + 26)
            name_length, extra_length = struct.unpack("<HH", f.read(4))
            f.seek(record.header_offset + 30 + name_length + extra_length)
            f.write(struct.pack("<f", float("nan")) * 16)
    elif kind in HOSTILE_PICKLES:
        import torch  # only here: the other cases need no torch in this process
        writer = torch._C.PyTorchFileWriter(str(path))
        writer.write_record("data.pkl", HOSTILE_PICKLES[kind], len(HOSTILE_PICKLES[kind]))
        writer.write_end_of_file()
    elif kind == "run-folder-without-one":
        path = workdir / "run-without-checkpoint"
        path.mkdir()
        (path / "config.json").write_text("{}")
    return path


def checkpoint_cases(workdir, data_dir, checkpoint):
    cases = {}
    for kind in CHECKPOINT_KINDS:
        path = bad_checkpoint(kind, workdir, checkpoint)
        cases[("checkpoint", "train", kind)] = (["train", "--resume", path], [path])
        cases[("checkpoint", "eval", kind)] = (
            ["eval", "--checkpoint", path, "--data-dir", data_dir, "--workers", 0,
             "--output", workdir / f"eval-{kind}"], [path])
        cases[("checkpoint", "viz", kind)] = (
            ["viz", "--checkpoint", path, "--data-dir", data_dir, "--output", workdir / f"viz-{kind}"], [path])
        cases[("checkpoint", "train-initial", kind)] = (
            ["train", *tiny_run_args(data_dir), "--initial-checkpoint", path,
             "--output", workdir / f"initial-{kind}"], [path])
    return cases


# -------------------------------------------------------------------------------- flag values

VIT = ["--model", "vit_tiny"]
FLAG_CASES = {
    # name: (arguments, the strings the message must hold). <data> stands for a tiny data set and
    # an output folder of the case's own; <missing> for a path that does not exist.
    "num-heads-0": (["info", *VIT, "--num-heads", "0"], ["num_heads must be at least 1", "0"]),
    "num-heads-0-train": (["train", *VIT, "--num-heads", "0"], ["num_heads must be at least 1", "0"]),
    "embed-dim-negative": (["info", *VIT, "--embed-dim", "-8"], ["embed_dim must be at least 1", "-8"]),
    "depth-0": (["info", *VIT, "--depth", "0"], ["depth must be at least 1", "0"]),
    "mlp-dim-0": (["info", *VIT, "--mlp-dim", "0"], ["mlp_dim must be at least 1", "0"]),
    "dropout-on-resnet": (["info", "--model", "resnet18", "--dropout", "0.2"],
                          ["dropout = 0.2 applies to ViT models only", "resnet18"]),
    "preset-heads-do-not-divide": (["info", *VIT, "--embed-dim", "100"], ["num_heads = 3 (vit_tiny's)", "100"]),
    "patch-size-0": (["info", *VIT, "--patch-size", "0"], ["patch_size", "0"]),
    "patch-size-0-train": (["train", *VIT, "--patch-size", "0"], ["patch_size", "0"]),
    "patch-size-3-info": (["info", *VIT, "--image-size", "28", "--patch-size", "3"],
                          ["image_size = 28", "patch_size = 3"]),
    "patch-size-3-on-28px": (["train", *VIT, "--patch-size", "3", "<data>"],
                             [f"image_size = {IMAGE_SIDE}", "patch_size = 3"]),
    "k-0": (["train", "--k", "0"], ["k", "0"]),
    "k-0-info": (["info", "--model", "resnet18", "--layer", "convnn", "--k", "0"], ["k", "0"]),
    "k-on-conv-resnet": (["train", "--model", "resnet18", "--layer", "conv", "--k", "100000000"],
                         ["k = 100000000 is not used by resnet18 with layer conv"]),
    "padding-on-conv-resnet": (["info", "--model", "resnet18", "--padding", "100000"],
                               ["padding = 100000 is not used by resnet18 with layer conv"]),
    "batch-size-negative": (["train", "--batch-size", "-5"], ["batch_size", "-5"]),
    "epochs-negative": (["train", "--epochs", "-1"], ["epochs", "-1"]),
    "epochs-not-a-number": (["train", "--epochs", "three"], ["--epochs", "three"]),
    "lr-0": (["train", "--lr", "0"], ["lr", "0"]),
    "mixup-negative": (["train", "--mixup", "-1"], ["mixup must be an alpha >= 0", "-1"]),
    "rand-augment-negative": (["train", "--rand-augment", "-1"], ["rand_augment must be a magnitude", "-1"]),
    "rand-augment-not-a-number": (["train", "--rand-augment", "nine"], ["--rand-augment", "nine"]),
    "crop-padding-negative": (["train", "--crop-padding", "-1"], ["crop_padding must be in [0, 1024]", "-1"]),
    "crop-padding-huge": (["train", "--crop-padding", "1000000000"], ["crop_padding must be in [0, 1024]",
                                                                      "1000000000"]),
    "prefetch-huge": (["train", "--prefetch", "100000000"], ["prefetch must be in [1, 1024]", "100000000"]),
    "hflip-above-1": (["train", "--hflip", "2"], ["hflip", "2"]),
    "scale-not-numbers": (["train", "--scale", "a", "b"], ["--scale", "a"]),
    "image-size-0": (["train", "--image-size", "0"], ["image_size must be >= 1", "0"]),
    "unknown-model": (["train", "--model", "resnet19"], ["resnet19"]),
    "unknown-dataset": (["train", "--dataset", "imagenet21k"], ["imagenet21k"]),
    "unknown-layer": (["train", "--layer", "attention"], ["attention"]),
    "layer-on-vit": (["info", *VIT, "--layer", "convnn"], ["layer", "convnn"]),
    "unknown-flag": (["train", "--frobnicate"], ["--frobnicate"]),
    "unknown-subcommand": (["frobnicate"], ["frobnicate"]),
    "experiment-with-slash": (["train", "--experiment", "a/b"], ["a/b"]),
    "gzip-bomb": (["train", "--data-dir", "<gzip-bomb>", "--workers", "0"],
                  ["train-images-idx3-ubyte.gz", "trailing data", "reading stopped there"]),
    "eval-batch-size-0": (["eval", "--checkpoint", "x.pt", "--batch-size", "0"], ["--batch-size", "0"]),
    "compare-vit-heads-0": (["compare", "--vit-heads", "0"], ["--vit-heads", "0"]),
    "compare-k-0": (["compare", "--families", "resnet", "--ks", "0", "<data>"], ["k", "0"]),
    "compare-unknown-vit-model": (["compare", "--vit-model", "vit_huge"], ["vit_huge"]),
    "compare-negative-seed": (["compare", "--seeds", "1,-2"], ["--seeds", "-2"]),
    "bench-heads-do-not-divide": (["bench", "--channels", "10", "--heads", "3"], ["heads = 3", "10"]),
    "bench-missing-data": (["bench", "--data", "<missing>"], ["<missing>"]),
    "verify-unknown-dtype": (["verify", "--dtype", "float16"], ["float16"]),
    "threads-0": (["--threads", "0", "info", "--model", "resnet18"], ["--threads", "0"]),
    # Integer flags say their rule in the user's text (CLI11's PositiveNumber printed its bound as
    # a 309-digit double), and a seed outside [0, 2^63) is refused where an unsigned field took -1
    # and any value past 2^64 as 2^64 - 1, silently.
    "eval-workers-negative": (["eval", "--checkpoint", "x.pt", "--workers", "-2"],
                              ["--workers: must be an integer of at least 0, got -2"]),
    "train-seed-negative": (["train", "--seed", "-1"], ["--seed: must be an integer in [0, 2^63), got -1"]),
    "train-seed-past-2-64": (["train", "--seed", "99999999999999999999999"],
                             ["--seed: must be an integer in [0, 2^63), got 99999999999999999999999"]),
    "train-log-interval-0": (["train", "--log-interval", "0"], ["--log-interval: must be an integer of at least 1"]),
    "train-nproc-0": (["train", "--nproc", "0"], ["--nproc: must be an integer of at least 1, got 0"]),
    "generate-seed-negative": (["generate", "--checkpoint", "x.pt", "--seed", "-1"],
                               ["--seed: must be an integer in [0, 2^63), got -1"]),
    "generate-max-new-tokens-negative": (["generate", "--checkpoint", "x.pt", "-n", "-5"],
                                         ["--max-new-tokens: must be an integer of at least 0, got -5"]),
    "bench-sweep-n-negative": (["bench", "--sweep", "--sweep-n", "197,-5"], ["--sweep-n: must be an integer of at least 1, got -5"]),
    "generate-samples-0": (["generate", "--checkpoint", "x.pt", "--samples", "0"],
                           ["--samples: must be an integer of at least 1, got 0"]),
}


def gzip_bomb(workdir):
    """A Fashion-MNIST folder whose training images (an IDX header promising 64 images of 28x28)
    are followed by 256 MiB of zeros: 250 KB compressed. Inflating it whole used to grow a buffer
    until allocation failed; the reader stops where the header's size ends."""
    root = workdir / "gzip-bomb"
    if not root.exists():
        (workdir / "gzip-bomb-source").mkdir()
        make_data_set(workdir / "gzip-bomb-source")
        shutil.copytree(workdir / "gzip-bomb-source" / "fashion-mnist", root)
        with gzip.open(root / "train-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
            f.write(struct.pack(">IIII", 0x803, SAMPLES, IMAGE_SIDE, IMAGE_SIDE))
            zeros = bytes(1 << 20)
            for _ in range(256):
                f.write(zeros)
    return root


def flag_cases(workdir, data_dir):
    missing = workdir / "no-such-folder"
    cases = {}
    for case, (args, names) in FLAG_CASES.items():
        substitute = {"<data>": ["--data-dir", data_dir, "--output", workdir / f"runs-{case}", "--quiet",
                                 "--no-plots", "--workers", "0"],
                      "<missing>": [missing],
                      "<gzip-bomb>": [gzip_bomb(workdir)]}
        args = [part for a in args for part in substitute.get(a, [a])]
        cases[("flag", case)] = (args, [missing if n == "<missing>" else n for n in names])
    return cases


# ------------------------------------------------------------------------ unwritable outputs

OUTPUT_KINDS = ["under-a-file", "under-proc"]
OUTPUT_COMMANDS = ["train", "compare", "eval"]


def unwritable(kind, workdir):
    if kind == "under-a-file":
        blocker = workdir / "a-file"
        blocker.write_text("not a folder")
        return blocker / "out"
    return pathlib.Path("/proc/convnn-cannot-write-here")


def output_cases(workdir, data_dir, checkpoint):
    cases = {}
    for kind in OUTPUT_KINDS:
        output = unwritable(kind, workdir)
        cases[("output", "train", kind)] = (["train", *tiny_run_args(data_dir), "--output", output], [output])
        cases[("output", "compare", kind)] = (
            ["compare", "--families", "resnet", "--data-dir", data_dir, "--output", output], [output])
        cases[("output", "eval", kind)] = (
            ["eval", "--checkpoint", checkpoint, "--data-dir", data_dir, "--workers", 0, "--output", output],
            [output])
    return cases


# ------------------------------------------------------------------------------------ devices

DEVICE_VALUES = {
    # --device value: (how many CUDA devices make it usable, None: never; the strings the message
    # must hold whatever the machine has)
    "cuda": (1, ["--device cuda", "no cuda device is available"]),
    "cuda:3": (4, ["--device cuda:3"]),
    "banana": (None, ["--device", "banana"]),
}
DEVICE_COMMANDS = ["train", "eval", "compare"]


def cuda_device_count():
    """The CUDA devices a process of this machine sees (the binary links the venv's torch)."""
    import torch  # only here: the other cases need no torch in this process
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_is_usable(value):
    needed, _ = DEVICE_VALUES[value]
    return needed is not None and cuda_device_count() >= needed


def device_output(workdir, command, value):
    return workdir / f"device-{command}-{value.replace(':', '-')}"


def device_cases(workdir, data_dir, checkpoint=None):
    """The train and compare cases, or with `checkpoint` the eval ones; a value this machine can
    use is left out (it would run)."""
    cases = {}
    for value, (_, names) in DEVICE_VALUES.items():
        if device_is_usable(value):
            continue
        commands = {
            "train": ["train", *tiny_run_args(data_dir)],
            "compare": ["compare", "--families", "resnet", "--data-dir", data_dir],
        } if checkpoint is None else {
            "eval": ["eval", "--checkpoint", checkpoint, "--data-dir", data_dir, "--workers", 0],
        }
        for command, args in commands.items():
            cases[("device", command, value)] = (
                [*args, "--output", device_output(workdir, command, value), "--device", value], names)
    return cases


# -------------------------------------------------------------------------------- the runs

class Runs:
    """The cases' processes, started side by side; a case's result is awaited by its own test,
    so that a case that hangs (TimeoutExpired) or crashes fails alone."""

    def __init__(self, pool, workdir):
        self.pool, self.workdir, self.started, self.training = pool, workdir, {}, None

    def start(self, cases, env=None):
        for key, (args, names) in cases.items():
            self.started[key] = (self.pool.submit(run_convnn, args, self.workdir, env), names)

    def result(self, key):
        if key not in self.started:
            pytest.fail(f"no real checkpoint to start from: status {self.training.returncode}\n"
                        f"{self.training.stderr}")
        future, names = self.started[key]
        return future.result(), names


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case. Those that need a real checkpoint start once the one-epoch run that makes it
    has finished; the others run meanwhile."""
    workdir = tmp_path_factory.mktemp("cli")
    data_dir = make_data_set(workdir)
    with concurrent.futures.ThreadPoolExecutor(PARALLEL_CASES) as pool:
        runs = Runs(pool, workdir)
        runs.start({**config_cases(workdir), **flag_cases(workdir, data_dir),
                    **device_cases(workdir, data_dir)})
        runs.start({"thread-variable": (["info", "--model", "resnet18"], ["CONVNN_NUM_THREADS", "many"])},
                   env={"CONVNN_NUM_THREADS": "many"})
        runs.training = run_convnn(["train", *tiny_run_args(data_dir), "--output", workdir / "runs",
                                    "--experiment", "tiny", "--device", "cpu"], cwd=workdir)
        checkpoint = workdir / "runs" / "tiny" / "checkpoint-latest.pt"
        if runs.training.returncode == 0 and checkpoint.is_file():
            # A copy, so that resuming it does not change the file the other cases read.
            shutil.copytree(workdir / "runs" / "tiny", workdir / "runs" / "tiny-auto")
            runs.start({**checkpoint_cases(workdir, data_dir, checkpoint),
                        **output_cases(workdir, data_dir, checkpoint),
                        **device_cases(workdir, data_dir, checkpoint),
                        "resume-on-auto": (
                            ["train", "--resume", workdir / "runs" / "tiny-auto", "--epochs", 2, "--device",
                             "auto", "--data-dir", data_dir, "--workers", 0, "--quiet", "--no-plots"], []),
                        "real-checkpoint-evaluates": (
                            ["eval", "--checkpoint", checkpoint, "--data-dir", data_dir, "--workers", 0,
                             "--output", workdir / "eval-good"], [])})
        yield runs


def assert_fails_in_one_line(runs, key):
    result, names = runs.result(key)
    assert_one_line_error(result, *names)


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
@pytest.mark.parametrize("case", sorted(CONFIG_FILES))
def test_a_bad_config_file_is_one_line_naming_it(runs, command, case):
    assert_fails_in_one_line(runs, ("config", command, case))


@pytest.mark.parametrize("command", CHECKPOINT_COMMANDS)
@pytest.mark.parametrize("kind", CHECKPOINT_KINDS)
def test_a_bad_checkpoint_is_one_line_naming_it(runs, command, kind):
    assert_fails_in_one_line(runs, ("checkpoint", command, kind))


def test_the_real_checkpoint_evaluates(runs):
    """The checkpoint the bad ones are made from is good: their errors come from the damage."""
    result, _ = runs.result("real-checkpoint-evaluates")
    assert result.returncode == 0, result.stderr
    assert "top-1" in result.stdout


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_a_bad_flag_value_is_one_line_naming_it(runs, case):
    assert_fails_in_one_line(runs, ("flag", case))


def test_a_bad_thread_count_in_the_environment_is_one_line_naming_it(runs):
    assert_fails_in_one_line(runs, "thread-variable")


@pytest.mark.parametrize("command", OUTPUT_COMMANDS)
@pytest.mark.parametrize("kind", OUTPUT_KINDS)
def test_an_unwritable_output_folder_is_one_line_naming_it(runs, command, kind):
    assert_fails_in_one_line(runs, ("output", command, kind))


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
@pytest.mark.parametrize("value", sorted(DEVICE_VALUES))
def test_an_unusable_device_is_one_line_naming_it(runs, command, value):
    """Checked before any work: no run, comparison or evaluation folder is left behind."""
    if device_is_usable(value):
        pytest.skip(f"--device {value} is usable on this machine")
    assert_fails_in_one_line(runs, ("device", command, value))
    output = device_output(runs.workdir, command, value)
    assert not output.exists(), f"{output} was created: --device was checked after work began"


def test_device_cpu_trains(runs):
    """The run every checkpoint case starts from was trained with --device cpu."""
    assert runs.training.returncode == 0, runs.training.stderr
    assert "device: cpu" in runs.training.stdout


def test_a_run_resumes_under_another_device_text(runs):
    """Trained with --device cpu, resumed with --device auto (the accelerator where there is one):
    the device is a run-time choice, not part of the run's config."""
    result, _ = runs.result("resume-on-auto")
    assert result.returncode == 0, f"status {result.returncode}\n{result.stderr}"
    assert "epoch 2/2" in result.stdout, result.stdout


# ------------------------------------------------------------------ bench --impl and --device

BENCH_IMPL_CASES = {
    # Fails on every machine: no CUDA device here; where there is one, the fused kernels exist only
    # on the CPU. Both messages name the device.
    "fused-on-cuda": (["bench", "--impl", "fused", "--device", "cuda"], ["cuda"]),
    "unknown-device": (["bench", "--device", "banana"], ["--device", "banana"]),
    "unknown-impl": (["bench", "--impl", "cpu"], ["--impl", "cpu"]),
    # On CPU tensors the layer's ops reach the fused kernels: a module-level generic run would lie.
    "generic-module-on-cpu": (["bench", "--impl", "generic", "--level", "module", "--device", "cpu"],
                              ["generic", "module", "cpu"]),
}


@pytest.mark.parametrize("case", sorted(BENCH_IMPL_CASES))
def test_a_bench_impl_or_device_that_cannot_run_is_one_line_naming_it(case, tmp_path):
    args, names = BENCH_IMPL_CASES[case]
    assert_one_line_error(run_convnn(args, tmp_path), *names)
