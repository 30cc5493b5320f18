"""RESULTS.md's language-model table from the runs of scripts/lm-results.sh: per variant (ConvNN
attention with each K, the MHSA twin) the validation loss of each seed's last epoch in bits per
byte (nats / ln 2) with the mean and the sample standard deviation over seeds, the next-byte top-1,
the parameters, and the speed pass's training and generation tokens per second.

    python3 scripts/lm_results_table.py runs/lm-results
"""
import json
import math
import pathlib
import statistics
import sys

VARIANTS = [("convnn-k8", "ConvNN", 8), ("convnn-k16", "ConvNN", 16), ("convnn-k32", "ConvNN", 32),
            ("mhsa", "MHSA (twin)", None)]


def finished_last_epoch(run):
    """The metrics of a run's last epoch, or None while it is not finished."""
    if not (run / "metrics.json").exists():
        return None
    epochs = json.loads((run / "metrics.json").read_text())
    wanted = json.loads((run / "config.json").read_text())["epochs"]
    return epochs[-1] if len(epochs) == wanted else None


def generation_rates(speed):
    """name -> generated tokens per second, as `convnn generate --speed` reported it."""
    rates = {}
    for report in speed.glob("generate-*.speed"):
        name = report.stem[len("generate-"):]
        rates[name] = float(report.read_text().split(": ")[-1].split()[0])
    return rates


def row(out, name, attention, k, rates):
    runs = sorted(out.glob(f"{name}-s*"))
    epochs = [e for e in (finished_last_epoch(run) for run in runs) if e is not None]
    bits = [e["val_loss"] / math.log(2) for e in epochs]
    if not bits:
        return None
    spread = statistics.stdev(bits) if len(bits) > 1 else float("nan")
    top1 = statistics.mean(e["val_top1"] for e in epochs)
    speed = out / "speed"
    info = speed / f"info-{name}.json"
    parameters = f"{json.loads(info.read_text())['parameters']:,}" if info.exists() else "–"
    train_metrics = speed / f"train-{name}" / "metrics.json"
    train_rate = f"{json.loads(train_metrics.read_text())[-1]['images_per_s']:,.0f}" if train_metrics.exists() else "–"
    generate_rate = f"{rates[name]:,.0f}" if name in rates else "–"
    per_seed = ", ".join(f"{b:.4f}" for b in bits)
    return (f"| {attention} | {k if k else '–'} | {parameters} | **{statistics.mean(bits):.4f} ± {spread:.4f}** "
            f"| {per_seed} | {top1:.2f} % | {len(bits)} | {train_rate} | {generate_rate} |")


def main(out):
    out = pathlib.Path(out)
    rates = generation_rates(out / "speed")
    print("| attention | K | parameters | validation bits/byte (mean ± std) | per seed | next-byte top-1 | seeds "
          "| training tokens/s | generation tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, attention, k in VARIANTS:
        line = row(out, name, attention, k, rates)
        if line:
            print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/lm-results")
