"""What a recovery of dlrun.recovery's loop allocates again takes pages the process holds already
(python/dlrun/_memory.py), each case in a fresh interpreter (glibc's malloc keeps its state for a
process's life), its page faults counted (getrusage's minor faults):

- With the allocator prepared (keep_freed), 16 MB of heap touched serve two new blocks of 6 MB
  with almost no fault; untouched, every page of theirs faults.
- Without keep_freed the touch is given back to the kernel as it is freed: the blocks fault.
- The loop outside dlrun's recovery (no DLRUN_RECOVERY_DIR: a plain loop over env://, one rank)
  leaves the allocator as it was: a touch is given back, as without dlrun.
- state_bytes counts a module's parameters and buffers; prepare() asks twice that touched.
"""

import os
import subprocess
import sys
import unittest

PYTHONDIR = os.environ["DLRUN_PYTHONDIR"]
PAGES_12MB = (12 << 20) // 4096
PRELUDE = f"""
import os, resource, sys
sys.path.insert(0, {PYTHONDIR!r})
import torch
from dlrun import _memory

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def written(nbytes):
    return torch.ones(nbytes, dtype=torch.uint8)
"""


def run(body):
    """Runs `body` after PRELUDE in a fresh interpreter of this era; its last line of output,
    an int."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + body],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("DLRUN_RECOVERY")},
    )
    if done.returncode != 0:
        raise AssertionError(f"the case failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(done.stdout.split()[-1])


TWO_BLOCKS = """
before = faults()
first, second = written(6 << 20), written(6 << 20)
print(faults() - before)
"""
TOUCHED = "_memory.touch_heap(16 << 20)\n" + TWO_BLOCKS


class MemoryTest(unittest.TestCase):
    def test_a_touched_heap_serves_new_blocks_without_faults(self):
        touched = run("assert _memory.keep_freed()\n" + TOUCHED)
        untouched = run("assert _memory.keep_freed()\n" + TWO_BLOCKS)
        self.assertLess(touched, PAGES_12MB // 10, f"touched: {touched}, untouched: {untouched}")
        self.assertGreater(untouched, PAGES_12MB * 9 // 10, f"untouched: {untouched}")

    def test_without_keep_freed_the_touch_is_given_back(self):
        faulted = run(TOUCHED)
        self.assertGreater(faulted, PAGES_12MB * 9 // 10, f"not kept: {faulted} faults")

    def test_the_loop_outside_recovery_leaves_the_allocator_alone(self):
        loop = f"""
import socket
import dlrun.recovery
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
model = torch.nn.Linear(4, 2)
loop = dlrun.recovery.Loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
{TOUCHED}"""
        faulted = run(loop)
        self.assertGreater(faulted, PAGES_12MB * 9 // 10, f"outside recovery: {faulted} faults")

    def test_state_bytes_counts_parameters_and_buffers(self):
        counted = run(
            """
model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20))
assert _memory.prepare(model) == 2 * _memory.state_bytes(model)
print(_memory.state_bytes(model))
"""
        )
        # Linear: 10*20 + 20 floats; BatchNorm1d: weight, bias, running mean and var (20 each)
        # and num_batches_tracked (one int64).
        self.assertEqual(counted, (10 * 20 + 20 + 4 * 20) * 4 + 8)


if __name__ == "__main__":
    unittest.main(verbosity=2)
