"""Data parallelism is exact: with a fixed seed, 4 workers at --batch-size 16 end with the same
weights as 1 worker at --batch-size 64 (the same global batch) after 50 steps on Fashion-MNIST,
up to float summation order (max |difference| <= 1e-4). A control run at another global batch
shows the comparison can tell runs apart. On the CPU engine (the CUDA engine's twin of this
test: test_trainer_gpu.py)."""
import unittest

from dlrun_fixture import main
from trainer_fixture import assert_data_parallel_exact, require_data


class TrainerDataParallelTest(unittest.TestCase):
    def test_four_workers_at_16_match_one_worker_at_64(self):
        require_data(self)
        assert_data_parallel_exact(self, "cpu")


if __name__ == "__main__":
    main()
