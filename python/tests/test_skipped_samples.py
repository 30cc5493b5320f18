"""`convnn train` and `convnn eval` on an image folder with an unreadable file: the library
reports the skip, the command prints it, once, as a warning naming the file, and counts it."""
import subprocess

import pytest
from PIL import Image

from cli_support import BINARY

SIDE = 32
COMMON = ["--workers", "0", "--batch-size", "4"]


def write_folder(root):
    """Two classes, four training and two validation JPEGs each."""
    for split, count in (("train", 4), ("val", 2)):
        for label in range(2):
            folder = root / split / f"c{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                colour = (60 + 120 * label, 40 * i, 90)
                Image.new("RGB", (SIDE + 8, SIDE), colour).save(folder / f"{i}.jpg", quality=90)


@pytest.fixture(scope="module")
def broken_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    write_folder(root)
    broken = root / "train" / "c1" / "2.jpg"
    broken.write_bytes(broken.read_bytes()[:100])  # truncated: the decoder fails
    return root, broken


def convnn(*args):
    return subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_train_warns_once_per_skipped_file_and_counts_it(broken_folder, tmp_path):
    root, broken = broken_folder
    run = convnn("train", "--dataset", "imagefolder", "--data-dir", root, "--image-size", SIDE, "--model",
                 "resnet18", "--small-stem", "--width", "4", "--epochs", "1", "--warmup-epochs", "0", "--quiet",
                 "--no-plots", "--output", tmp_path, "--experiment", "run", *COMMON)
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("convnn: warning: skipped a sample")]
    assert len(warnings) == 1, run.stderr
    assert str(broken) in warnings[0]
    assert "skipped 1 train / 0 val" in run.stdout, run.stdout

    evaluation = convnn("eval", "--checkpoint", tmp_path / "run" / "checkpoint-latest.pt", "--split", "train",
                        "--output", tmp_path / "eval", *COMMON)
    assert evaluation.returncode == 0, evaluation.stderr
    assert evaluation.stderr.count("convnn: warning: skipped a sample") == 1, evaluation.stderr
    assert str(broken) in evaluation.stderr


def png_claiming(width, height):
    """A valid 1x1-pixel PNG stream whose header claims width x height (CRCs correct): a
    decompression bomb's header, a hundred bytes long."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0\0\0\0"))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("strict", [False, True])
def test_an_image_claiming_ten_billion_pixels_is_skipped_by_name_or_stops_a_strict_run(tmp_path, strict):
    """Decoding it would allocate 30 GB at once (std::bad_alloc, naming no file, before the limit):
    it is refused from its header, like any damaged image."""
    root = tmp_path / "folder"
    write_folder(root)
    bomb = root / "train" / "c0" / "bomb.png"
    bomb.write_bytes(png_claiming(100000, 100000))
    run = convnn("train", "--dataset", "imagefolder", "--data-dir", root, "--image-size", SIDE, "--model",
                 "resnet18", "--small-stem", "--width", "4", "--epochs", "1", "--warmup-epochs", "0", "--quiet",
                 "--no-plots", "--output", tmp_path / "runs", "--experiment", "run", *COMMON,
                 *(["--strict-data"] if strict else []))
    if strict:
        assert run.returncode == 1, run.stderr
        assert run.stderr.startswith("convnn: error:") and len(run.stderr.splitlines()) == 1, run.stderr
    else:
        assert run.returncode == 0, run.stderr
        assert run.stderr.count("convnn: warning: skipped a sample") == 1, run.stderr
    assert str(bomb) in run.stderr and "100000x100000" in run.stderr and "max_image_pixels" in run.stderr
