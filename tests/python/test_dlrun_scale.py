"""Large jobs: 4 agents x 4,000 workers (16,000 ranks) on loopback, TF_CONFIG over the kernel's
limit for one environment string, and a node asked for more workers than its descriptors allow.

The workers are dlrun-rank-probe (bench/rank_probe.cpp, from DLRUN_RANK_PROBE): a small static
program that appends "RANK START_NS TF_CONFIG_BYTES" to one file in a single O_APPEND write and
exits, far cheaper than 16,000 Pythons. Bounded: every wait has a deadline, every dlrun is
killed by PID in a cleanup, and the probes exit at once (their agents reap them while they start).
"""

import os
import resource
import subprocess
import sys
import time
import unittest
from collections import Counter

from dlrun_fixture import (
    Dlrun,
    binary_from_env,
    clean_env,
    die_with_parent,
    dlrun_binary,
    free_port,
    main,
    run_dlrun,
    temp_dir,
)

AGENTS = 4
PER_AGENT = 4000
JOB_TIMEOUT_S = 150  # about 6 s on 2 idle cores; generous for a loaded CI machine
FAIL_FAST_S = 1.0


def probe():
    return binary_from_env("DLRUN_RANK_PROBE", "dlrun-rank-probe")


def read_probes(path):
    """[(rank, tf_config_bytes)] from the probes' file; [] when no probe ran."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [(int(rank), int(tf)) for rank, _, tf in (line.split() for line in f)]


class ScaleTest(unittest.TestCase):
    def start_agents(self, extra=()):
        out = temp_dir(self)
        self.ranks_file = os.path.join(out, "ranks.txt")
        port = free_port()
        args = [
            "--nnodes=4",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=scale{port}",
            f"--nproc-per-node={PER_AGENT}",
            *extra,
            "--no-python",
            probe(),
            self.ranks_file,
        ]
        return [Dlrun(self, args) for _ in range(AGENTS)]

    def test_16000_ranks_start_and_end_once_each_without_tf_config(self):
        started = time.monotonic()
        results = [agent.wait(JOB_TIMEOUT_S) for agent in self.start_agents()]
        elapsed = time.monotonic() - started
        for result in results:
            self.assertEqual(result.returncode, 0, result)
        probes = read_probes(self.ranks_file)
        counts = Counter(rank for rank, _ in probes)
        self.assertEqual(len(probes), AGENTS * PER_AGENT)
        self.assertEqual(sorted(counts), list(range(AGENTS * PER_AGENT)))
        self.assertEqual(max(counts.values()), 1)
        # About 288 KB for 16,000 workers: left out under auto, with one warning per agent.
        self.assertEqual({tf for _, tf in probes}, {-1})
        for result in results:
            warnings = [line for line in result.dlrun_lines() if "TF_CONFIG" in line]
            self.assertEqual(len(warnings), 1, result)
            self.assertIn("warning:", warnings[0])
            self.assertRegex(warnings[0], r"TF_CONFIG for 16000 workers would take \d+ bytes")
            self.assertIn("--tf-config", warnings[0])
        print(
            f"\n{AGENTS} x {PER_AGENT} ranks started and ended in {elapsed:.1f} s", file=sys.stderr
        )

    def test_tf_config_always_fails_before_any_worker_starts(self):
        started = time.monotonic()
        results = [agent.wait(JOB_TIMEOUT_S) for agent in self.start_agents(["--tf-config=always"])]
        elapsed = time.monotonic() - started
        for result in results:
            self.assertEqual(result.returncode, 2, result)
            errors = [line for line in result.dlrun_lines() if "error" in line]
            self.assertEqual(len(errors), 1, result)
            self.assertIn("--tf-config=always", errors[0])
            self.assertIn("131072 bytes", errors[0])
        self.assertEqual(read_probes(self.ranks_file), [])
        print(f"\n--tf-config=always refused on every agent in {elapsed:.1f} s", file=sys.stderr)

    def test_more_workers_than_the_descriptor_limit_allows_fail_at_once(self):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > 1 << 20:
            self.skipTest(f"the hard descriptor limit ({hard}) is too high to exceed")
        ranks_file = os.path.join(temp_dir(self), "ranks.txt")
        started = time.monotonic()
        result = run_dlrun(
            self,
            ["--standalone", f"--nproc-per-node={hard * 4}", "--no-python", probe(), ranks_file],
        )
        elapsed = time.monotonic() - started
        self.assertEqual(result.returncode, 2, result)
        self.assertLess(elapsed, FAIL_FAST_S, result)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result)
        self.assertIn(f"over the limit of {hard} (ulimit -n", lines[0])
        self.assertEqual(read_probes(ranks_file), [])

    def test_a_node_of_a_larger_job_refuses_before_it_joins(self):
        """Under a lowered limit, and with no other node or store there: nothing is waited for."""
        ranks_file = os.path.join(temp_dir(self), "ranks.txt")

        def low_limit():
            die_with_parent()
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

        env = clean_env(TMPDIR=temp_dir(self))
        started = time.monotonic()
        proc = subprocess.run(
            [
                dlrun_binary(),
                "--nnodes=2",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                "--rdzv-id=lowlimit",
                "--nproc-per-node=1000",
                "--no-python",
                probe(),
                ranks_file,
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            preexec_fn=low_limit,
            timeout=30,
        )
        elapsed = time.monotonic() - started
        self.assertEqual(proc.returncode, 2, proc)
        self.assertLess(elapsed, FAIL_FAST_S, proc)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc)
        self.assertIn("1000 workers need about", lines[0])
        self.assertIn("over the limit of 256 (ulimit -n", lines[0])
        self.assertEqual(read_probes(ranks_file), [])


if __name__ == "__main__":
    main()
