"""The bundled trainer learns: `dlrun --standalone --nproc-per-node=2 train --epochs 3` reaches
a test accuracy of at least 0.86 on Fashion-MNIST, as rank 0's final JSON summary reports.
(The default 15-epoch job and its 0.885 bar: scripts/check_default_accuracy.sh, outside ctest.)
"""

import unittest

from dlrun_fixture import main
from trainer_fixture import require_data, run_train, summary

MIN_ACCURACY = 0.86
EPOCHS = 3
NPROC = 2


class TrainerAccuracyTest(unittest.TestCase):
    def test_three_epochs_on_two_workers(self):
        require_data(self)
        result = run_train(self, ["--epochs", str(EPOCHS)], NPROC)
        self.assertEqual(result.returncode, 0, result)
        report = summary(self, result)
        self.assertEqual(report["epochs"], EPOCHS, result)
        self.assertEqual(report["world_size"], NPROC, result)
        # 60,000 images, 64 per rank per step: ceil(30000 / 64) = 469 steps an epoch.
        self.assertEqual(report["steps"], EPOCHS * 469, result)
        self.assertGreaterEqual(report["test_accuracy"], MIN_ACCURACY, result)
        # One line per epoch from rank 0 only, each with its test accuracy.
        epoch_lines = [line for line in result.stdout.splitlines() if "test accuracy" in line]
        self.assertEqual([line[:4] for line in epoch_lines], ["[0]:"] * EPOCHS, result)


if __name__ == "__main__":
    main()
