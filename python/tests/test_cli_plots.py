"""The training plots of `convnn train` (apps/convnn/plots.cpp): drawn by gnuplot from metrics.csv,
with the epoch axis in whole epochs."""
import shutil
import subprocess

import pytest

from cli_support import BINARY, make_data_set, tiny_run_args

pytestmark = pytest.mark.skipif(shutil.which("gnuplot") is None, reason="gnuplot is not installed")


def test_the_plots_are_drawn_with_whole_epoch_tics(tmp_path):
    args = [a for a in tiny_run_args(make_data_set(tmp_path)) if a != "--no-plots"]
    epochs = args.index("--epochs")
    args[epochs + 1] = 3
    subprocess.run([BINARY, "train", *map(str, args), "--output", str(tmp_path / "runs"), "--experiment", "run"],
                   check=True, capture_output=True, text=True, timeout=600)
    plots = tmp_path / "runs" / "run" / "plots"
    for name in ("loss.png", "accuracy.png", "lr.png"):
        assert (plots / name).stat().st_size > 1000, name
    script = (plots / "plots.gp").read_text()
    # The tic step is a whole number of epochs (1 up to ten epochs) and the labels have no fraction;
    # gnuplot's own choice at 3 epochs was 1, 1.5, 2, 2.5, 3.
    assert "epoch_step = STATS_max > 10 ? ceil(STATS_max / 10.0) : 1" in script
    assert "set xtics epoch_step" in script and "set format x '%.0f'" in script
    shown = subprocess.run(["gnuplot"], input=script.split("set output")[0] + "print epoch_step\n",
                           capture_output=True, text=True, check=True, cwd=plots)
    assert shown.stderr.strip().splitlines()[-1] == "1"
