"""dlrun across simulated hosts: one agent per network namespace, linked by a bridge.

Every dlrun runs inside a host, so every connection starts inside a namespace. A node is
crashed by SIGKILLing every process in its namespace, or silenced by taking its link down; the
survivors must restart their workers with the world shrunk within 5 s, and a node that comes
back is admitted at the next round.
"""

import os
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    log_tails,
    temp_dir,
    wait_until,
    worker,
    worker_starts,
)
from netns_fixture import Hosts, main

WORKER = worker("elastic_worker.py")
RECOVERY_LIMIT_S = 5.0
EVENT_TIMEOUT_S = 60


class NetnsTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.stop_file = os.path.join(self.out, "stop")
        self.hosts = Hosts(3)
        self.addCleanup(self.hosts.close)
        self.agents = {}

    def start_agent(self, i):
        log = open(os.path.join(self.out, f"agent{i}-{len(self.agents)}.log"), "w")
        self.addCleanup(log.close)
        args = [
            binary_from_env("DLRUN", "dlrun"),
            "--nnodes=2:3",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.hosts.address(0)}:29400",
            "--rdzv-id=netns",
            "--rdzv-conf=last_call_timeout=0.5",
            PYTHON,
            WORKER,
            self.out,
            "--until-file",
            self.stop_file,
        ]
        env = clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=self.out)
        self.agents[i] = self.hosts.popen(i, args, env=env, stdout=log, stderr=log)

    def logs(self):
        return log_tails(self.out, "agent*.log", tail=None)

    def starts(self, attempt):
        return worker_starts(self.out, attempt)

    def wait_for_starts(self, attempt, count):
        wait_until(
            lambda: len(self.starts(attempt)) >= count,
            EVENT_TIMEOUT_S,
            f"{count} workers of attempt {attempt}",
            on_timeout=self.logs,
        )
        return self.starts(attempt)

    def assert_world(self, starts, size):
        self.assertEqual([int(s["env"]["RANK"]) for s in starts], list(range(size)), self.logs())
        for s in starts:
            self.assertEqual(s["env"]["WORLD_SIZE"], str(size))
            self.assertEqual(s["env"]["MASTER_ADDR"], self.hosts.address(0))

    def finish_job(self, hosts):
        with open(self.stop_file, "w"):
            pass
        for i in hosts:
            self.assertEqual(self.agents[i].wait(EVENT_TIMEOUT_S), 0, self.logs())

    def test_crashed_node_survivors_restart_then_it_is_admitted_again(self):
        for i in range(3):
            self.start_agent(i)
        first = self.wait_for_starts(0, 3)
        self.assert_world(first, 3)
        self.assertEqual(sorted(s["host"] for s in first), ["node0", "node1", "node2"])

        killed = time.time()
        self.hosts.kill_host(2)
        shrunk = self.wait_for_starts(1, 2)
        self.assert_world(shrunk, 2)
        recovery = max(s["time"] for s in shrunk) - killed
        print(f"crash to restarted workers: {recovery:.2f} s")
        self.assertLessEqual(recovery, RECOVERY_LIMIT_S, self.logs())

        self.start_agent(2)  # the node comes back: scale up at the next round
        grown = self.wait_for_starts(2, 3)
        self.assert_world(grown, 3)
        self.finish_job([0, 1, 2])

    def test_silent_node_is_detected_and_rejoins_when_its_link_heals(self):
        for i in range(3):
            self.start_agent(i)
        self.wait_for_starts(0, 3)

        silenced = time.time()
        self.hosts.link(2, up=False)
        shrunk = self.wait_for_starts(1, 2)
        self.assert_world(shrunk, 2)
        self.assertEqual(sorted(s["host"] for s in shrunk), ["node0", "node1"])
        detection = max(s["time"] for s in shrunk) - silenced
        print(f"link down to restarted workers: {detection:.2f} s")
        self.assertLessEqual(detection, RECOVERY_LIMIT_S, self.logs())

        self.hosts.link(2, up=True)
        grown = self.wait_for_starts(2, 3)
        self.assert_world(grown, 3)
        self.finish_job([0, 1, 2])


if __name__ == "__main__":
    main()
