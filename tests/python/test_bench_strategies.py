"""bench/strategies.sh in a tiny configuration (issue 16, point 5): 2 workers, 2 parameter
servers, 5 and 15 steps, under --strategy ps and Gloo's ring. The script exits 0 only when every
process's bytes per step, each way, are within 10% of their formula (a server's NK/P per round,
a ps worker's K, a ring worker's 2(N-1)K/N), so a change that makes the ps wire or the ring send
more than it should fails here, not only in the README's table.
"""

import os
import subprocess
import unittest

from dlrun_fixture import clean_env, dlrun_binary, main
from trainer_fixture import require_data

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "strategies.sh")
TIMEOUT_S = 150


class StrategiesBench(unittest.TestCase):
    def test_bytes_per_step_match_the_formulas(self):
        require_data(self)
        build = os.path.dirname(os.path.dirname(dlrun_binary()))
        result = subprocess.run(
            ["bash", SCRIPT, build],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=clean_env(NPROCS="2", SERVERS="2", STEPS="5,15", PYTHON="/usr/bin/python3"),
        )
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        rows = [
            line.split()
            for line in result.stdout.splitlines()
            if line.startswith(("ps ", "allreduce "))
        ]
        self.assertEqual(
            [(r[0], r[3]) for r in rows],
            [("ps", "server"), ("ps", "worker"), ("allreduce", "worker")],
            result.stdout,
        )
        self.assertIn("PASS", result.stdout)


if __name__ == "__main__":
    main()
