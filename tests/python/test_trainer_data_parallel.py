"""Data parallelism is exact: with a fixed seed, 4 workers at --batch-size 16 end with the same
weights as 1 worker at --batch-size 64 (the same global batch) after 50 steps on Fashion-MNIST,
up to float summation order (max |difference| <= 1e-4). A control run at another global batch
shows the comparison can tell runs apart. On the CPU engine (the CUDA engine's twin of this
test: test_trainer_gpu.py): as a job on one machine runs by default (gradients summed in shared
memory, the AVX2 build of the math where the CPU has AVX2 and FMA), and through the other paths
(Gloo over TCP, as across machines, and the baseline math, as on CPUs without AVX2); and a job
on one machine does take the fast paths."""

import unittest

from dlrun_fixture import clean_env, main
from trainer_fixture import TrainJob, assert_data_parallel_exact, require_data


def cpu_has_avx2():
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return "avx2" in flags and "fma" in flags


class TrainerDataParallelTest(unittest.TestCase):
    def setUp(self):
        require_data(self)

    def test_four_workers_at_16_match_one_worker_at_64(self):
        assert_data_parallel_exact(self, "cpu")

    def test_the_same_over_gloo_with_the_baseline_math(self):
        assert_data_parallel_exact(self, "cpu", ["--allreduce", "gloo", "--cpu-math", "baseline"])

    def test_one_machine_sums_in_shared_memory_with_the_fastest_math(self):
        env = clean_env(DLRUN_LOG_LEVEL="debug")
        result = TrainJob(self, ["--epochs", "1", "--max-steps", "5"], 2, env=env).wait()
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(result.stderr.count("debug: all-reduce: shared memory"), 2, result)
        math = "avx2" if cpu_has_avx2() else "baseline"
        self.assertEqual(result.stderr.count(f"debug: CPU math: {math} "), 2, result)


if __name__ == "__main__":
    main()
