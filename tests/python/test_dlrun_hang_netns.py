"""A hung rank on one of two simulated hosts (network namespaces): dlrun notices, names it, takes
every rank's stack, restarts the group from its checkpoint, and the job finishes every step once.

Two dlrun nodes x two workers of the bundled trainer (synthetic data, checkpoints every few
steps) with --hang-timeout; the trainer's testing aid --hang-at-step makes the last rank (rank 3)
sleep for ever before its all-reduce on the first attempt, so ranks 0..2 wait in that
all-reduce. Checked: the hang is seen within the timeout + 1 s of the stuck rank's last word
(both read from the agents' logs as they grow); the summary on the node that saw it names rank
3 and its node as the suspect; every rank's stack file exists on its node and the stuck rank's
shows the sleeping frame; the group restarts once, resumes from the checkpoint, and its step
count is the whole run's (none twice, none lost).
"""

import glob
import os
import re
import time
import unittest

from dlrun_fixture import binary_from_env, clean_env, temp_dir, wait_until
from netns_fixture import Hosts, main
from trainer_fixture import checkpoints

NODES = 2
NPROC = 2
HANG_TIMEOUT_S = 3.0
HANG_AT_STEP = 30
CHECKPOINT_EVERY = 10
EPOCHS = 1
STEPS = 79  # an epoch of --synthetic (20000 examples) at world size 4, batch 64
EVENT_TIMEOUT_S = 60
TRAIN_TIMEOUT_S = 150


class HangAcrossHostsTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.hosts = Hosts(NODES)
        self.addCleanup(self.hosts.close)
        self.agents = {}
        self.checkpoint_dir = os.path.join(self.out, "checkpoints")

    def start_agent(self, node):
        log = open(self.log_path(node), "w")
        self.addCleanup(log.close)
        args = [
            binary_from_env("DLRUN", "dlrun"),
            f"--nnodes={NODES}",
            f"--nproc-per-node={NPROC}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.hosts.address(0)}:29400",
            "--rdzv-id=hang",
            f"--hang-timeout={HANG_TIMEOUT_S}",
            "--max-restarts=1",
            f"--log-dir={self.log_dir(node)}",
            binary_from_env("DLRUN_TRAIN", "dlrun-train"),
            "--synthetic",
            "--epochs",
            str(EPOCHS),
            "--seed",
            "4",
            "--checkpoint-dir",
            self.checkpoint_dir,
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--progress-every",
            "1000",
            "--hang-at-step",
            str(HANG_AT_STEP),
        ]
        env = clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=self.out)
        self.agents[node] = self.hosts.popen(node, args, env=env, stdout=log, stderr=log)

    def log_path(self, node):
        return os.path.join(self.out, f"agent{node}.log")

    def log_dir(self, node):
        return os.path.join(self.out, f"logs{node}")

    def log(self, node):
        with open(self.log_path(node), errors="replace") as f:
            return f.read()

    def logs(self):
        return "".join(f"--- agent {n} ---\n{self.log(n)[-6000:]}" for n in range(NODES))

    def first_node_with(self, pattern):
        """(node, match) of the first agent log that matches, else None."""
        for node in range(NODES):
            match = re.search(pattern, self.log(node), re.MULTILINE)
            if match:
                return node, match
        return None

    def test_a_rank_stuck_before_its_all_reduce_is_named_and_the_job_resumes(self):
        for node in range(NODES):
            self.start_agent(node)
        stuck_line = r"^\[3\]:dlrun-train: --hang-at-step \d+: rank 3 sleeps for ever"
        wait_until(
            lambda: self.first_node_with(stuck_line),
            EVENT_TIMEOUT_S,
            "rank 3 to start sleeping",
            on_timeout=self.logs,
        )
        stuck_at = time.monotonic()
        wait_until(
            lambda: self.first_node_with(r"^dlrun: hang: rank \d+"),
            EVENT_TIMEOUT_S,
            "dlrun to see the hang",
            on_timeout=self.logs,
        )
        seen_at = time.monotonic()
        self.assertLessEqual(seen_at - stuck_at, HANG_TIMEOUT_S + 1.0, self.logs())

        for node in range(NODES):
            try:
                code = self.agents[node].wait(TRAIN_TIMEOUT_S)
            except Exception:
                self.fail(f"agent {node} still runs\n{self.logs()}")
            self.assertEqual(code, 0, self.logs())

        stuck_node, _ = self.first_node_with(stuck_line)
        stuck_host = self.hosts.hostname(stuck_node)
        # The detection line: the silence it measured is within the timeout + 1 s as well.
        _, detected = self.first_node_with(
            r"^dlrun: hang: rank \d+.* made no progress for "
            r"([0-9.]+) s"
        )
        self.assertLessEqual(float(detected.group(1)), HANG_TIMEOUT_S + 1.0, self.logs())
        # One node prints the summary; it names rank 3 on the stuck rank's node.
        summaries = [n for n in range(NODES) if "hang: no progress for" in self.log(n)]
        self.assertEqual(len(summaries), 1, self.logs())
        summary = self.log(summaries[0])
        self.assertRegex(
            summary,
            rf"suspect: rank 3 on {stuck_host} \([0-9.]+\), last step "
            rf"{HANG_AT_STEP}, silent [0-9.]+ s, not in a collective",
        )
        for rank in range(3):
            self.assertRegex(
                summary,
                rf"rank {rank} on \S+ \([0-9.]+\), last step "
                rf"{HANG_AT_STEP}, silent [0-9.]+ s, waiting in",
            )

        # Every rank's stack, on its own node; the stuck one in its sleeping frame.
        stacks = {}
        for node in range(NODES):
            for path in glob.glob(
                os.path.join(self.log_dir(node), "*", "attempt_0", "stacks", "rank_*.txt")
            ):
                stacks[int(re.search(r"rank_(\d+)\.txt$", path).group(1))] = path
        self.assertEqual(sorted(stacks), list(range(NODES * NPROC)), self.logs())
        with open(stacks[3]) as f:
            self.assertIn("sleepForeverForTesting", f.read())
        self.assertIn("sleepForeverForTesting", summary)
        for rank in range(3):
            with open(stacks[rank]) as f:
                self.assertRegex(f.read(), r"waiting in: all_reduce")

        # The restart: once, from the checkpoint before the hang, through to the end.
        for node in range(NODES):
            self.assertEqual(self.log(node).count("restarting, attempt 1 of 1"), 1, self.logs())
        output = self.log(0) + self.log(1)
        resumed = re.findall(
            r"^\[0\]:resuming from checkpoint: .* step (\d+)$", output, re.MULTILINE
        )
        last_checkpoint = (HANG_AT_STEP - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        self.assertEqual(resumed, [str(last_checkpoint)], self.logs())
        steps = re.findall(r'^\[0\]:\{"epochs": \d+, "steps": (\d+)', output, re.MULTILINE)
        self.assertEqual(steps, [str(EPOCHS * STEPS)], self.logs())  # none twice, none lost
        self.assertIn(EPOCHS * STEPS, checkpoints(self.checkpoint_dir))


if __name__ == "__main__":
    main()
