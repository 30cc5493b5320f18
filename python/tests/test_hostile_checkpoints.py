"""Checkpoints from strangers (issue 24). A checkpoint is plain data that Python's
torch.load(weights_only=True) reads whole, the optimiser state included, and that torch.optim loads.
A file built by an attacker runs nothing and breaks nothing: a TorchScript payload (whose
__setstate__ prints a marker, or never returns) placed where convnn once opened TorchScript, a
tensor whose storage lies about its dtype, a position out of range, a record that claims more bytes
than its file: each command ends with a one-line error or a load that ignores the payload, within a
time limit, and the payload's marker is never printed."""
import json
import os
import subprocess
import zipfile
import zlib

import pytest
import torch

import convnn
from cli_support import BINARY, make_data_set, tiny_run_args

TIMEOUT_S = 90
MARKER = "CONVNN-PAYLOAD-RAN"

PAYLOAD_SOURCE = f'''
import sys
import torch
from typing import Tuple


class Payload(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = torch.zeros(1)

    @torch.jit.export
    def __getstate__(self):
        return (self.x, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        print("{MARKER}")
        while state[1]:
            pass
        self.x = state[0]
        self.training = state[1]

    def forward(self, x):
        return x


module = Payload()
module.train(sys.argv[2] == "hang")
torch.jit.save(torch.jit.script(module), sys.argv[1])
'''


def make_payload(tmp_path, kind):
    """A TorchScript archive whose __setstate__ prints MARKER and, for "hang", never returns.
    (TorchScript needs the source in a file to compile it.)"""
    script = tmp_path / "make_payload.py"
    script.write_text(PAYLOAD_SOURCE)
    path = tmp_path / f"payload-{kind}.pt"
    subprocess.run([os.sys.executable, str(script), str(path), kind], check=True, timeout=120)
    return path


def run_convnn(*args, cwd):
    env = {**os.environ, "CONVNN_NUM_THREADS": "1"}
    return subprocess.run([BINARY, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S)


def write_checkpoint(path, contents, header):
    """A checkpoint as convnn lays it out (torch.save's zip with the header records beside data.pkl),
    its header's CRC-32 computed as an attacker would."""
    staging = path.with_suffix(".staging")
    torch.save(contents, staging)
    reader = torch._C.PyTorchFileReader(str(staging))
    writer = torch._C.PyTorchFileWriter(str(path))
    for name in reader.get_all_records():
        if name not in ("version", ".data/version"):  # the writer adds these
            data = reader.get_record(name)
            writer.write_record(name, data, len(data))
    text = json.dumps(header).encode()
    crc = str(zlib.crc32(text)).encode()
    writer.write_record("convnn_header.json", text, len(text))
    writer.write_record("convnn_header.crc32", crc, len(crc))
    writer.write_end_of_file()
    staging.unlink()
    return path


def header_of(path):
    return json.loads(torch._C.PyTorchFileReader(str(path)).get_record("convnn_header.json"))


def tensor_crc(tensor):
    return zlib.crc32(tensor.contiguous().view(torch.uint8).numpy().tobytes())


class Run:
    def __init__(self, root):
        self.root = root
        self.data = make_data_set(root)
        result = run_convnn("train", *tiny_run_args(self.data), "--output", root / "runs", "--experiment", "good",
                            cwd=root)
        assert result.returncode == 0, result.stderr
        self.checkpoint = root / "runs" / "good" / "checkpoint-latest.pt"

    def commands(self, path, name):
        """Every command that reads a checkpoint a user hands it, and what each may answer."""
        out = self.root / f"out-{name}"
        return {
            "eval": ["eval", "--checkpoint", path, "--data-dir", self.data, "--workers", 0, "--output", out / "eval"],
            "resume": ["train", "--resume", path, "--epochs", 2, "--workers", 0, "--quiet", "--no-plots"],
            "initial": ["train", *tiny_run_args(self.data), "--initial-checkpoint", path, "--output", out,
                        "--experiment", "initial"],
            "convert": ["checkpoint", "convert", path, out / "converted.pt"],
        }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return Run(tmp_path_factory.mktemp("hostile"))


def format3_with_archive(run, archive_path, path):
    """The run's checkpoint as convnn wrote format 3: the optimiser state replaced by the bytes of a
    TorchScript archive (here the payload) under "optimizer_archive", every CRC-32 recomputed."""
    contents = torch.load(run.checkpoint, weights_only=True)
    archive = torch.frombuffer(bytearray(archive_path.read_bytes()), dtype=torch.uint8)
    del contents["optimizer"]
    contents["optimizer_archive"] = archive
    contents["convnn_format"] = 3
    header = header_of(run.checkpoint)
    header["format"] = 3
    header["crc32"]["optimizer"] = tensor_crc(archive)
    return write_checkpoint(path, contents, header)


@pytest.mark.parametrize("kind", ["print", "hang"])
def test_a_torchscript_payload_runs_in_no_command(run, tmp_path, kind):
    payload = make_payload(tmp_path, kind)
    files = {"format3": format3_with_archive(run, payload, tmp_path / f"format3-{kind}.pt"),
             "torchscript": payload}
    for file_kind, path in files.items():
        for command, args in run.commands(path, f"{kind}-{file_kind}").items():
            result = run_convnn(*args, cwd=run.root)  # a hang is TimeoutExpired: a failure
            described = f"{file_kind} {command}: status {result.returncode}\n{result.stdout}\n{result.stderr}"
            assert MARKER not in result.stdout + result.stderr, described
            if file_kind == "format3" and command in ("eval", "initial"):
                # They use only the weights: the optimiser record is not opened.
                assert result.returncode == 0, described
            else:
                assert result.returncode == 1, described
                assert "--trust-legacy" in result.stderr and len(result.stderr.splitlines()) == 1, described
        # Python's loader reads the weights with torch.load(weights_only=True), or refuses.
        try:
            convnn.models.load_checkpoint(path)
        except convnn.models.CheckpointError as error:
            assert file_kind == "torchscript" and "--trust-legacy" in str(error)
    assert not (run.root / f"out-{kind}-torchscript" / "converted.pt").exists()


def test_torch_load_weights_only_reads_the_optimizer_state_and_adamw_resumes_from_it(run):
    checkpoint = torch.load(run.checkpoint, weights_only=True)
    assert checkpoint["convnn_format"] == 4
    state_dict = checkpoint["optimizer"]
    model = convnn.models.load_checkpoint(run.checkpoint)
    parameters = list(model.parameters())
    assert [len(group["params"]) for group in state_dict["param_groups"]] == [len(parameters)]
    optimizer = torch.optim.AdamW(parameters)
    optimizer.load_state_dict(state_dict)
    group = optimizer.param_groups[0]
    assert group["decoupled_weight_decay"] and group["weight_decay"] == 0.05
    for index, parameter in enumerate(parameters):
        stored = state_dict["state"][index]
        live = optimizer.state[parameter]
        assert torch.equal(live["exp_avg"], stored["exp_avg"]) and live["exp_avg"].shape == parameter.shape
        assert live["step"].item() == checkpoint["position"]["step"]
    model(torch.rand(2, 1, 28, 28)).sum().backward()
    optimizer.step()  # the state is usable, not only loadable
    assert all(torch.isfinite(p).all() for p in parameters)


def test_a_storage_that_lies_about_its_dtype_is_refused_by_eval(run, tmp_path):
    contents = torch.load(run.checkpoint, weights_only=True)
    header = header_of(run.checkpoint)
    name = header["tensors"][0]
    contents["state_dict"][name] = contents["state_dict"][name].view(torch.int32)  # same bytes, same CRC
    path = write_checkpoint(tmp_path / "int-storage.pt", contents, header)
    result = run_convnn(*run.commands(path, "dtype")["eval"], cwd=run.root)
    assert result.returncode == 1 and f"holds '{name}' Int" in result.stderr, result.stderr


@pytest.mark.parametrize("field,value,message", [
    ("next_batch", 2 ** 62, "position's next_batch is 4611686018427387904, outside [0, "),
    ("next_batch", 1000, "next_batch 1000 is past the epoch's 2 batches"),
    ("step", -2 ** 62, "position's step is -4611686018427387904"),
    ("step", 1000, "step 1000 is more than the 2 steps of 1 epochs"),
])
def test_a_position_out_of_range_is_refused_by_resume(run, tmp_path, field, value, message):
    contents = torch.load(run.checkpoint, weights_only=True)
    header = header_of(run.checkpoint)
    for position in (contents["position"], header["position"]):
        # Within the run's first epoch, before any evaluation, so that only the field is wrong.
        position.update(epoch=0, best_epoch=-1, best_top1=-1.0)
        position[field] = value
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = write_checkpoint(run_dir / "checkpoint-latest.pt", contents, header)
    result = run_convnn(*run.commands(path, field)["resume"], cwd=run.root)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Exception raised from" not in result.stderr, result.stderr


def pickle_file(path, pickle):
    """A torch.save file (zip) whose data.pkl is `pickle`, and nothing else."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("hostile/data.pkl", pickle)
        archive.writestr("hostile/byteorder", "little")
        archive.writestr("hostile/version", "3\n")
    return path


# PROTO 2, EMPTY_DICT, the key: EMPTY_TUPLE wrapped by TUPLE1 a million times, the value NONE,
# SETITEM, STOP. torch.load(weights_only=True) builds it, then hashing the key recurses in C.
DEEP_TUPLE_KEY = b"\x80\x02}" + b")" + b"\x85" * 1_000_000 + b"Ns."


def test_load_checkpoint_refuses_what_the_cpp_reader_refuses_before_torch_load_sees_it(run, tmp_path):
    """A dict key nested a million deep killed Python (SIGSEGV) inside torch.load; load_checkpoint
    now runs the C++ reader's checks first, so it is one CheckpointError, whose reason is the very
    text the convnn command gives for the same file. In a child process, so that a signal fails the test
    instead of ending the run."""
    path = pickle_file(tmp_path / "deep-key.pt", DEEP_TUPLE_KEY)
    load = ("import sys, convnn\ntry:\n    convnn.models.load_checkpoint(sys.argv[1])\n"
            "except convnn.models.CheckpointError as error:\n    print(error)\n    sys.exit(3)\n")
    child = subprocess.run([os.sys.executable, "-c", load, str(path)], capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    assert child.returncode == 3, (child.returncode, child.stderr[-2000:])
    assert child.stdout.startswith(f"checkpoint '{path}' cannot be read: "), child.stdout
    reason = child.stdout.split(" cannot be read: ", 1)[1].strip()
    assert "nested more than 64" in reason, reason
    # The command that reads a file without a run's header whole: a run started from its weights.
    started = run_convnn(*run.commands(path, "deep-key")["initial"], cwd=run.root)
    assert started.returncode == 1 and reason in started.stderr, (reason, started.stderr)


def test_a_record_that_claims_more_bytes_than_its_file_is_refused(run, tmp_path):
    """A deflated data.pkl of 256 MiB of zeros (a quarter of a MB on disk): the reader refuses it from
    the zip directory's size, before inflating anything."""
    path = tmp_path / "bomb.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/data.pkl", b"\0" * (256 << 20))
        archive.writestr("bomb/byteorder", "little")
        archive.writestr("bomb/version", "3\n")
    assert path.stat().st_size < (1 << 20)
    result = run_convnn(*run.commands(path, "bomb")["eval"], cwd=run.root)
    assert result.returncode == 1 and "claims 268435456 bytes, more than the file's" in result.stderr, result.stderr
