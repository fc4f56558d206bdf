#!/usr/bin/python3
"""Plots one or more dlrun-train --metrics-file runs on one PNG, so runs can be compared (say 2
and 4 workers): training loss against step, test accuracy against step, and both against time.

Usage: plot_metrics.py RUN.jsonl [RUN.jsonl ...] -o curves.png [--label NAME ...]

Each file is one JSON object a line ("kind": "step" or "epoch"; see trainer/metrics_file.h).
Step lines give the loss curve, epoch lines the accuracy curve. A restarted run's lines follow
on in the same file; its restarts are marked on the loss curve. Needs python3-matplotlib.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: a file
import matplotlib.pyplot as plt  # noqa: E402


def read_run(path):
    """The records of one file, in order; a line that is not JSON is an error naming it."""
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{number}: not a JSON object ({e.msg})")
    if not records:
        sys.exit(f"plot_metrics: {path}: no records")
    return records


def default_label(path, records):
    sizes = sorted({r["world_size"] for r in records})
    workers = "/".join(str(s) for s in sizes)
    return f"{os.path.basename(path)} ({workers} worker{'s' if sizes != [1] else ''})"


def plot(runs, output):
    figure, ((loss_step, acc_step), (loss_time, acc_time)) = plt.subplots(
        2, 2, figsize=(12, 8), dpi=100
    )
    for label, records in runs:
        losses = [r for r in records if r["loss"] is not None]
        epochs = [r for r in records if r["kind"] == "epoch" and r["accuracy"] is not None]
        # Loss from step lines where the run wrote any; else the epochs' mean loss.
        steps = [r for r in losses if r["kind"] == "step"] or losses
        (line,) = loss_step.plot(
            [r["step"] for r in steps], [r["loss"] for r in steps], label=label
        )
        color = line.get_color()
        loss_time.plot(
            [r["elapsed"] for r in steps], [r["loss"] for r in steps], color=color, label=label
        )
        acc_step.plot(
            [r["step"] for r in epochs],
            [r["accuracy"] for r in epochs],
            "o-",
            color=color,
            label=label,
        )
        acc_time.plot(
            [r["elapsed"] for r in epochs],
            [r["accuracy"] for r in epochs],
            "o-",
            color=color,
            label=label,
        )
        for previous, record in zip(records, records[1:]):
            if record["restart"] != previous["restart"]:
                loss_step.axvline(record["step"], color=color, linestyle=":", linewidth=1)
    for axes, x, y, title in (
        (loss_step, "step", "training loss", "Loss by step"),
        (acc_step, "step", "test accuracy", "Test accuracy by step"),
        (loss_time, "seconds since the run's start", "training loss", "Loss by time"),
        (acc_time, "seconds since the run's start", "test accuracy", "Test accuracy by time"),
    ):
        axes.set_xlabel(x)
        axes.set_ylabel(y)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="best", fontsize="small")
    figure.suptitle("dlrun-train runs")
    figure.tight_layout()
    figure.savefig(output)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="--metrics-file outputs of dlrun-train")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        help="a name for each file, in order (default: file and world size)",
    )
    args = parser.parse_args()
    if args.label and len(args.label) != len(args.files):
        parser.error(f"{len(args.label)} --label for {len(args.files)} files")
    runs = []
    for i, path in enumerate(args.files):
        try:
            records = read_run(path)
        except OSError as e:
            sys.exit(f"plot_metrics: {path}: {e.strerror}")
        runs.append((args.label[i] if args.label else default_label(path, records), records))
    plot(runs, args.output)


if __name__ == "__main__":
    main()
