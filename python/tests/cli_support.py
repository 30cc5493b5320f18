"""What the tests that run the `convnn` command share: the binary under test and a tiny
Fashion-MNIST-shaped data set."""
import gzip
import os
import pathlib
import struct

BINARY = os.environ.get(
    "CONVNN_BIN", str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin" / "convnn"))
IMAGE_SIDE = 28  # Fashion-MNIST's, the default data set's
SAMPLES = 64


def write_idx(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def make_data_set(workdir, samples=SAMPLES):
    """A Fashion-MNIST-shaped data set of `samples` images per split: fast to load, and no
    dependence on the installed data set."""
    root = workdir / "fashion-mnist"
    root.mkdir()
    for split in ("train", "t10k"):
        pixels = bytes((i * 37) % 256 for i in range(samples * IMAGE_SIDE * IMAGE_SIDE))
        write_idx(root / f"{split}-images-idx3-ubyte.gz", 0x803, (samples, IMAGE_SIDE, IMAGE_SIDE), pixels)
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", 0x801, (samples,), bytes(i % 10 for i in range(samples)))
    return root


def tiny_run_args(data_dir):
    return ["--model", "resnet18", "--small-stem", "--width", "4", "--data-dir", data_dir,
            "--train-subset", SAMPLES, "--val-subset", SAMPLES, "--epochs", 1, "--batch-size", 32,
            "--warmup-epochs", 0, "--workers", 0, "--quiet", "--no-plots"]
