"""Acceptance 3 of issue 15: dlrun-train --metrics-file and scripts/plot_metrics.py.

Two 3-epoch runs on Fashion-MNIST (1 and 2 workers) each write one JSON object a line with the
fields the issue names; plot_metrics.py draws both on one PNG, checked by its size and by
reading it back with matplotlib (both runs' colours are on it). The PNG is kept in the test's
output directory (test-output/ in ctest's working directory) for a person to look at.
"""

import json
import os
import shutil
import subprocess
import unittest

from dlrun_fixture import main, temp_dir
from trainer_fixture import require_data, run_train

PYTHON = "/usr/bin/python3"
FIELDS = {
    "kind",
    "time",
    "elapsed",
    "step",
    "epoch",
    "loss",
    "accuracy",
    "samples_per_sec",
    "lr",
    "world_size",
    "restart",
}
EPOCHS = 3


def plot_script():
    source = os.environ.get("DLRUN_SOURCE_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", ".."
    )
    return os.path.join(source, "scripts", "plot_metrics.py")


def output_dir():
    path = os.path.join(os.getcwd(), "test-output")
    os.makedirs(path, exist_ok=True)
    return path


class MetricsFileTest(unittest.TestCase):
    def run_to_file(self, nproc):
        path = os.path.join(temp_dir(self), f"run{nproc}.jsonl")
        result = run_train(
            self, ["--epochs", str(EPOCHS), "--progress-every", "50", "--metrics-file", path], nproc
        )
        self.assertEqual(result.returncode, 0, result)
        return path

    def check_records(self, path, nproc):
        with open(path) as f:
            lines = f.read().splitlines()
        records = [json.loads(line) for line in lines]  # one valid object a line
        for record in records:
            self.assertEqual(set(record), FIELDS, record)
            self.assertEqual(record["world_size"], nproc)
            self.assertEqual(record["restart"], 0)
            self.assertGreater(record["samples_per_sec"], 0, record)
            self.assertGreaterEqual(record["lr"], 0)
        epochs = [r for r in records if r["kind"] == "epoch"]
        steps = [r for r in records if r["kind"] == "step"]
        self.assertEqual([r["epoch"] for r in epochs], list(range(1, EPOCHS + 1)))
        self.assertTrue(all(0.5 < r["accuracy"] <= 1 for r in epochs), epochs)
        self.assertTrue(all(r["accuracy"] is None for r in steps))
        self.assertGreater(len(steps), EPOCHS)
        self.assertEqual([r["step"] for r in records], sorted(r["step"] for r in records))
        self.assertLess(epochs[-1]["loss"], epochs[0]["loss"])
        return records

    def test_two_runs_make_records_and_one_picture(self):
        require_data(self)
        runs = [self.run_to_file(1), self.run_to_file(2)]
        self.check_records(runs[0], 1)
        self.check_records(runs[1], 2)

        png = os.path.join(temp_dir(self), "curves.png")
        plotted = subprocess.run(
            [PYTHON, plot_script(), *runs, "-o", png], capture_output=True, text=True, timeout=120
        )
        self.assertEqual(plotted.returncode, 0, plotted.stderr)
        self.assertGreater(os.path.getsize(png), 20_000)
        shutil.copy(png, os.path.join(output_dir(), "trainer_metrics_curves.png"))

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.image
        import numpy

        image = matplotlib.image.imread(png)
        self.assertEqual(image.shape[:2], (800, 1200))
        rgb = (image[:, :, :3] * 255).round().astype(int)
        # matplotlib's first two colours, one a run: both runs' curves are drawn.
        for colour in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
            pixels = numpy.all(rgb == colour, axis=-1).sum()
            self.assertGreater(pixels, 500, f"colour {colour} on {pixels} pixels")

    def test_a_file_that_cannot_be_opened_is_one_line_and_exit_2(self):
        missing = os.path.join(temp_dir(self), "no", "such", "dir", "run.jsonl")
        result = run_train(self, ["--epochs", "1", "--synthetic", "--metrics-file", missing], 1)
        self.assertEqual(result.returncode, 2, result)
        self.assertIn("--metrics-file", result.stderr)
        self.assertIn(missing, result.stderr)


if __name__ == "__main__":
    main()
