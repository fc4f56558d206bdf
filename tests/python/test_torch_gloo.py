"""Four torch processes (the era of the interpreter running the test) rendezvous through dlrund
and all_reduce over gloo."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

from dlrun_fixture import read_shared
from dlrund_fixture import die_with_parent, main, start_dlrund, stop_process

WORLD_SIZE = 4
TIMEOUT_S = 60
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gloo_worker.py")


class TorchGlooTest(unittest.TestCase):
    def start_worker(self, port, rank):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(WORLD_SIZE),
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT="0",
            OMP_NUM_THREADS="1",
            GLOO_SOCKET_IFNAME="lo",
        )
        # Output goes to a file, not a pipe nobody drains, and is shown if the worker fails.
        log = tempfile.TemporaryFile()
        self.addCleanup(log.close)
        proc = subprocess.Popen(
            [sys.executable, WORKER],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        self.addCleanup(stop_process, proc)  # cleanups run in reverse: before log.close
        return proc, log

    def test_all_reduce(self):
        daemon = start_dlrund(self)
        workers = [self.start_worker(daemon.port, rank) for rank in range(WORLD_SIZE)]
        deadline = time.monotonic() + TIMEOUT_S
        for rank, (proc, log) in enumerate(workers):
            try:
                code = proc.wait(max(0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                output = read_shared(log)
                self.fail(
                    f"rank {rank} exited with {code} (None: still running after "
                    f"{TIMEOUT_S}s); its output:\n{output}"
                )
        self.assertIsNone(daemon.proc.poll(), "dlrund exited during the run")


if __name__ == "__main__":
    main()
