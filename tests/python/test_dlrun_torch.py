"""Real PyTorch under dlrun, in both eras (ctest runs this file under torch 1.13's and torch
2.13's interpreters; the workers run under the test's): four workers meet through dlrun's store
with init_process_group("gloo", env://), train with DistributedDataParallel, and all hold the
same parameters afterwards. Both entry-point forms: an interpreter with the script as its
argument, and a .py path run by PYTHON_EXEC."""

import os
import sys
import unittest

from dlrun_fixture import PYTHON, WORKERS, clean_env, main, read_json, run_dlrun, temp_dir, worker

sys.path.insert(0, WORKERS)
from worker_util import lacks_libuv  # noqa: E402

DDP_TRAIN = worker("ddp_train.py")
WORLD = 4
TIMEOUT_S = 60


class DlrunTorchTest(unittest.TestCase):
    def check_replicas(self, out, result):
        self.assertEqual(result.returncode, 0, result)
        names = sorted(os.listdir(out))
        self.assertEqual(names, [f"ok_{r}.json" for r in range(WORLD)], result)
        records = [read_json(os.path.join(out, n)) for n in names]
        self.assertEqual([r["rank"] for r in records], list(range(WORLD)))
        self.assertEqual({r["world"] for r in records}, {WORLD})
        self.assertEqual(len({r["checksum"] for r in records}), 1, records)
        return records

    def test_interpreter_as_entry_point(self):
        out = temp_dir(self)
        result = run_dlrun(
            self,
            ["--standalone", f"--nproc-per-node={WORLD}", PYTHON, DDP_TRAIN, out, str(WORLD)],
            timeout=TIMEOUT_S,
        )
        self.check_replicas(out, result)

    def test_through_the_store_proxy(self):
        # init_process_group's store client and its barrier through the agent's proxy.
        out = temp_dir(self)
        result = run_dlrun(
            self,
            [
                "--standalone",
                f"--nproc-per-node={WORLD}",
                "--store-proxy=on",
                PYTHON,
                DDP_TRAIN,
                out,
                str(WORLD),
            ],
            timeout=TIMEOUT_S,
        )
        self.check_replicas(out, result)
        if lacks_libuv():  # rank 0's torch serves the store (test_torch_libuv.py): no proxy
            self.assertIn("rank 0's torch serves the workers' store", result.stderr)
            self.assertNotIn("store proxy:", result.stderr)
        else:
            self.assertIn("store proxy: this node's workers reach the store at", result.stderr)

    def test_py_script_runs_with_python_exec(self):
        out = temp_dir(self)
        # PATH's python3 may lack torch: the script only works if PYTHON_EXEC is honoured.
        env = clean_env(PYTHON_EXEC=PYTHON)
        result = run_dlrun(
            self,
            ["--standalone", f"--nproc-per-node={WORLD}", DDP_TRAIN, out, str(WORLD)],
            env=env,
            timeout=TIMEOUT_S,
        )
        records = self.check_replicas(out, result)
        self.assertEqual({r["executable"] for r in records}, {PYTHON})


if __name__ == "__main__":
    main()
