"""The control plane of jobs on simulated hosts (network namespaces): `dlrun status`, `dlrun
events` and `dlrun stop`, run from a host of their own, against the store of the agent that
serves the c10d rendezvous.

- A 3-node x 2-worker job: status lists 3 nodes and 6 workers with their pids and ranks, round 0
  and no restart; after a worker is killed the job restarts, status shows round and restarts
  changed and the new pids, and events show the failure before the restart.
- `dlrun stop --exit-code 7` ends a 2-node job: every worker gets SIGTERM (one that ignores it,
  SIGKILL after --stop-timeout) and every agent exits 7.
- `dlrun stop --signal USR1` makes the bundled trainer checkpoint on every rank and exit 0.
- Two agents of a 2-node job on one host (a GPU group each): status lists both under the host's
  name, each with its own agent id, group rank and 2 workers (all 4 pids), in --json and in the
  table.
"""

import glob
import json
import os
import re
import signal
import subprocess
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
from trainer_fixture import checkpoints

WORKER = worker("elastic_worker.py")
SIGNAL_WORKER = worker("signal_worker.py")
EVENT_TIMEOUT_S = 60
PORT = 29400


class ControlPlaneTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        # A job's token lets its control plane take stops and signals from other hosts.
        self.token_file = os.path.join(self.out, "token")
        with open(self.token_file, "w") as f:
            f.write("s3cret\n")
        self.hosts = Hosts(4)  # hosts 0..2 run the job, host 3 asks about it
        self.addCleanup(self.hosts.close)
        self.agents = {}

    def start_agent(self, node, nnodes, worker_args, nproc=2, extra=(), host=None):
        """Agent `node` of the job, on host `node` unless `host` names another."""
        log = open(os.path.join(self.out, f"agent{node}.log"), "w")
        self.addCleanup(log.close)
        args = [
            binary_from_env("DLRUN", "dlrun"),
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}",
            "--rdzv-id=ctl",
            f"--token-file={self.token_file}",
            *extra,
            *worker_args,
        ]
        env = clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=self.out)
        self.agents[node] = self.hosts.popen(
            node if host is None else host, args, env=env, stdout=log, stderr=log
        )

    def logs(self):
        return log_tails(self.out, "agent*.log", tail=4000)

    def control(self, *args):
        """`dlrun COMMAND ...` from host 3: (exit code, stdout, stderr)."""
        argv = [
            binary_from_env("DLRUN", "dlrun"),
            *args,
            f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}",
            "--rdzv-id=ctl",
            f"--token-file={self.token_file}",
        ]
        result = self.hosts.run(
            3, argv, timeout=30, capture_output=True, text=True, env=clean_env()
        )
        return result.returncode, result.stdout, result.stderr

    def status(self):
        code, out, err = self.control("status", "--json")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        return json.loads(out)

    def events(self):
        code, out, err = self.control("events", "--json")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        return [json.loads(line) for line in out.splitlines()]

    def starts(self, attempt):
        return worker_starts(self.out, attempt)

    def wait_for(self, predicate, what):
        wait_until(predicate, EVENT_TIMEOUT_S, what, on_timeout=self.logs)

    def wait_for_exit(self, node):
        try:
            return self.agents[node].wait(EVENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"agent {node} still runs\n{self.logs()}")

    @staticmethod
    def workers(job):
        return sorted((w for n in job["nodes"] for w in n["workers"]), key=lambda w: w["rank"])

    def test_status_and_events_follow_a_failure_and_its_restart(self):
        stop_file = os.path.join(self.out, "stop")
        for node in range(3):
            self.start_agent(
                node,
                3,
                [PYTHON, WORKER, self.out, "--until-file", stop_file],
                extra=["--max-restarts=1"],
            )
        self.wait_for(lambda: len(self.starts(0)) == 6, "6 workers of round 0")

        def settled(round_, pids):
            job = self.status()
            ws = self.workers(job)
            return (
                job["round"] == round_
                and len(ws) == 6
                and all(w["state"] == "running" for w in ws)
                and {w["pid"] for w in ws} == pids
            )

        pids0 = {s["pid"] for s in self.starts(0)}
        self.wait_for(lambda: settled(0, pids0), "status to show the 6 workers of round 0")
        job = self.status()
        self.assertEqual(job["state"], "RUNNING")
        self.assertEqual(job["backend"], "c10d")
        self.assertEqual(len(job["nodes"]), 3)
        self.assertEqual(job["restarts_used"], 0)
        self.assertEqual(job["max_restarts"], 1)
        self.assertEqual([w["rank"] for w in self.workers(job)], list(range(6)))
        by_rank = {int(s["env"]["RANK"]): s["pid"] for s in self.starts(0)}
        self.assertEqual({w["rank"]: w["pid"] for w in self.workers(job)}, by_rank)

        os.kill(by_rank[4], signal.SIGKILL)
        self.wait_for(lambda: len(self.starts(1)) == 6, "6 workers of round 1")
        pids1 = {s["pid"] for s in self.starts(1)}
        self.wait_for(lambda: settled(1, pids1), "status to show the 6 workers of round 1")
        job = self.status()
        self.assertEqual(job["restarts_used"], 1)

        # Each node publishes its own events: rank 4's node its worker's failure, group rank
        # 0's the round's end and then the restart. A failing node's events are in the store
        # before it reports the failure (its publisher, an observer that yields the CPU, once
        # numbered the failure after the restart under load): cause before consequence.
        kinds = [(e["kind"], e.get("rank", -1)) for e in self.events()]
        failed = kinds.index(("worker_failed", 4))
        ended = next(i for i, k in enumerate(kinds) if k[0] == "round_ended")
        restart = next(i for i, k in enumerate(kinds) if k[0] == "restart")
        self.assertLess(failed, ended, kinds)
        self.assertLess(ended, restart, kinds)
        seqs = [int(e["seq"]) for e in self.events()]  # JSON holds int64 as text
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)))

        with open(stop_file, "w"):
            pass
        for node in range(3):
            self.assertEqual(self.wait_for_exit(node), 0, self.logs())

    def test_two_agents_on_one_host_are_listed_apart(self):
        for node in range(2):
            self.start_agent(node, 2, [PYTHON, WORKER, self.out, "--wait"], host=0)
        self.wait_for(lambda: len(self.starts(0)) == 4, "4 workers of round 0")
        by_rank = {int(s["env"]["RANK"]): s["pid"] for s in self.starts(0)}

        def running(job):
            return {w["rank"]: w["pid"] for w in self.workers(job) if w["state"] == "running"}

        self.wait_for(
            lambda: running(self.status()) == by_rank, "status to list the 4 running workers"
        )
        nodes = sorted(self.status()["nodes"], key=lambda n: n["agent"])
        host = self.hosts.hostname(0)
        self.assertEqual(
            [(n["agent"], n["name"], n["replaced_by"], len(n["workers"])) for n in nodes],
            [(1, host, 0, 2), (2, host, 0, 2)],
        )
        self.assertEqual(sorted(n["group_rank"] for n in nodes), [0, 1])

        code, out, err = self.control("status")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        rows = re.findall(rf"^(\d+)\s+(\d+)\s+{host}\s", out, re.M)  # GROUP, AGENT, NODE
        self.assertEqual(
            sorted((int(a), int(g)) for g, a in rows),
            [(n["agent"], n["group_rank"]) for n in nodes],
            out,
        )
        self.assertIn("nodes 2 of 2:2", out)
        for pid in by_rank.values():
            self.assertIn(f" {pid} ", out)

        # Each agent's events name it, in --json and in the text form, as status lists it.
        def started_by():
            return sorted(e.get("agent", 0) for e in self.events() if e["kind"] == "worker_started")

        self.wait_for(lambda: started_by() == [1, 2], "both agents' worker_started events")
        code, out, err = self.control("events")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        self.assertEqual(
            sorted(re.findall(rf"worker_started .*  {host} \(agent (\d)\)", out)), ["1", "2"], out
        )

        code, out, err = self.control("stop", "--exit-code=7")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        for node in range(2):
            self.assertEqual(self.wait_for_exit(node), 7, self.logs())

    def test_stop_ends_every_node_with_the_stated_code(self):
        # Rank 1 ignores SIGTERM: it goes only with the SIGKILL after --stop-timeout.
        for node in range(2):
            self.start_agent(
                node,
                2,
                [PYTHON, SIGNAL_WORKER, self.out, "ignore-term", "1"],
                extra=["--stop-timeout=1"],
            )
        self.wait_for(
            lambda: len(glob.glob(os.path.join(self.out, "pid_*"))) == 4,
            "4 workers with their handlers",
        )
        code, out, err = self.control("stop", "--exit-code=7", "--reason=test")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        for node in range(2):
            self.assertEqual(self.wait_for_exit(node), 7, self.logs())
        got = sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.out, "got_*")))
        self.assertEqual(got, ["got_SIGTERM_0", "got_SIGTERM_2", "got_SIGTERM_3"], self.logs())
        self.assertIn("did not stop within 1000 ms; sending SIGKILL", self.logs())

    def test_stop_signal_usr1_checkpoints_the_trainer_on_every_rank(self):
        checkpoint_dir = os.path.join(self.out, "checkpoints")
        train = binary_from_env("DLRUN_TRAIN", "dlrun-train")
        trainer = [
            train,
            "--synthetic",
            "--epochs",
            "3",
            "--checkpoint-dir",
            checkpoint_dir,
            "--progress-every",
            "10",
        ]
        for node in range(2):
            self.start_agent(node, 2, trainer)

        def trained_a_little():
            with (
                open(os.path.join(self.out, "agent0.log"), errors="replace") as f0,
                open(os.path.join(self.out, "agent1.log"), errors="replace") as f1,
            ):
                return re.search(r"^\[0\]:epoch 1/3 step 10/", f0.read() + f1.read(), re.M)

        self.wait_for(trained_a_little, "rank 0 to train 10 steps")
        code, out, err = self.control("stop", "--signal", "USR1")
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        for node in range(2):
            self.assertEqual(self.wait_for_exit(node), 0, self.logs())
        logs = self.logs()
        self.assertEqual(logs.count("control plane: SIGUSR1 to every worker"), 2, logs)
        steps = re.findall(r'^\[0\]:\{"epochs": \d+, "steps": (\d+)', logs, re.M)
        self.assertEqual(len(steps), 1, logs)
        self.assertIn(int(steps[0]), checkpoints(checkpoint_dir))  # stopped where it saved


if __name__ == "__main__":
    main()
