"""Data parallelism is exact: with a fixed seed, 4 workers at --batch-size 16 end with the same
weights as 1 worker at --batch-size 64 (the same global batch) after 50 steps on Fashion-MNIST,
up to float summation order (max |difference| <= 1e-4). A control run at another global batch
shows the comparison can tell runs apart."""
import os
import unittest

from dlrun_fixture import main, temp_dir
from trainer_fixture import (max_abs_difference, read_floats, require_data, run_single,
                             run_train, summary)

STEPS = 50
SEED = 7
TOLERANCE = 1e-4
COMMON = ["--epochs", "1", "--max-steps", str(STEPS), "--lr-schedule", "constant",
          "--seed", str(SEED)]


class TrainerDataParallelTest(unittest.TestCase):
    def weights_of(self, result, path):
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(summary(self, result)["steps"], STEPS, result)
        weights = read_floats(path)
        self.assertGreater(len(weights), 0)
        return weights

    def test_four_workers_at_16_match_one_worker_at_64(self):
        require_data(self)
        out = temp_dir(self)
        one, four, control = (os.path.join(out, name) for name in ("one", "four", "control"))
        alone = self.weights_of(run_single(self, [*COMMON, "--batch-size", "64",
                                                  "--dump-weights", one]), one)
        parallel = self.weights_of(run_train(self, [*COMMON, "--batch-size", "16",
                                                    "--dump-weights", four], 4), four)
        difference = max_abs_difference(alone, parallel)
        self.assertLessEqual(difference, TOLERANCE)
        # The same data at another global batch (16) ends elsewhere: the check has teeth.
        other = self.weights_of(run_single(self, [*COMMON, "--batch-size", "16",
                                                  "--dump-weights", control]), control)
        self.assertGreater(max_abs_difference(alone, other), 100 * TOLERANCE)


if __name__ == "__main__":
    main()
