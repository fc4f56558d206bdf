"""dlrun's etcd backend end to end: several dlrun agents on loopback (127.0.0.1-3, as separate
nodes) forming one job through a real etcd (one member, tests/python/etcd_fixture.py), where no
agent serves the rendezvous and the workers' store is served by each round's group rank 0.
"""

import glob
import json
import os
import sys
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    WORKERS,
    Dlrun,
    clean_env,
    free_ports,
    kill_if_ours,
    kill_recorded_workers,
    main,
    read_json,
    temp_dir,
    wait_until,
    worker,
)
from etcd_fixture import start_etcd

sys.path.insert(0, WORKERS)
from worker_util import lacks_libuv  # noqa: E402

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 60
# A lost node's etcd lease lapses after etcd's minimum TTL (2 s): heartbeats every 0.5 s, 3 of
# them missed. The survivors' new workers must start within this long of the loss.
# Leases of 3 s: a lost node is seen within 3 s. At 1.5 s (3 tries) a busy CI machine let a live
# agent's lease lapse now and then (etcd's own fsync stalls), and the first round never formed.
FAST_LEASE = "--rdzv-conf=keep_alive_interval=0.5,keep_alive_max_attempt=6"
RESTART_WITHIN_S = 8.0  # the lease's 3 s, a round, the workers' start and their all-reduce
# An ended job's keys expire this long after its agents left (--rdzv-conf job_ttl); etcd checks
# its leases every 500 ms, and revokes them in batches.
JOB_TTL_S = 3
EXPIRY_SLACK_S = 10
# A store outage the job rides out (etcd killed, then started again with its data), and how
# long after it no lease may lapse: the default TTL (3 s) and a second's slack.
OUTAGE_S = 8
TTL_S = 3
LAPSE_SLACK_S = 2
ERROR_WITHIN_S = 15  # an unreachable cluster is reported within etcd's connect timeout (5 s)


class EtcdBackendTest(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)

    def start_agents(self, nnodes, addresses, worker_args, nproc=2, extra=()):
        """One agent per address (None: no --local-addr, the address etcd is reached from)."""
        args = [
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.etcd.endpoint}",
            f"--rdzv-id=job{self.etcd.port}",
            *extra,
        ]
        return [
            Dlrun(
                self,
                [
                    *args,
                    *([f"--local-addr={addr}"] if addr else []),
                    PYTHON,
                    WORKER,
                    self.out,
                    *worker_args,
                ],
                env=clean_env(),
            )
            for addr in addresses
        ]

    def starts(self):
        return [read_json(p) for p in glob.glob(os.path.join(self.out, "start_*.json"))]

    def wait_for_starts(self, count, agents, attempt):
        def matching():
            return [
                s for s in self.starts() if s["env"]["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
            ]

        wait_until(
            lambda: len(matching()) >= count,
            JOB_TIMEOUT_S,
            f"{count} workers of attempt {attempt} to start",
            on_timeout=lambda: "\n".join(a.describe() for a in agents),
        )
        return matching()

    def test_three_nodes_form_one_job_and_allreduce_through_group_rank_0s_store(self):
        agents = self.start_agents(3, ["127.0.0.1", "127.0.0.2", "127.0.0.3"], ["--allreduce"])
        for agent in agents:
            r = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(len(starts), 6)
        self.assertEqual(sorted(int(s["env"]["RANK"]) for s in starts), list(range(6)))
        for s in starts:
            env = s["env"]
            self.assertEqual(env["WORLD_SIZE"], "6")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "3")
            self.assertEqual(int(env["RANK"]), 2 * int(env["GROUP_RANK"]) + int(env["LOCAL_RANK"]))
            # Group rank 0 is 127.0.0.1 (numeric order), and it serves the workers' store: its
            # agent, or its rank 0's torch where torch lacks libuv (test_torch_libuv.py).
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(
                env["TORCHELASTIC_USE_AGENT_STORE"], "False" if lacks_libuv() else "True"
            )
            self.assertEqual(s["sum"], sum(range(1, 7)))  # every rank's value, across nodes
            workers = json.loads(env["TF_CONFIG"])["cluster"]["worker"]
            self.assertEqual(len(workers), 6)
            # A node's workers are its group rank's block of the roster.
            self.assertEqual(
                workers[int(env["RANK"])].rsplit(":", 1)[0], f"127.0.0.{int(env['GROUP_RANK']) + 1}"
            )
        self.assertEqual(len({s["env"]["MASTER_PORT"] for s in starts}), 1)
        self.assertEqual(len({s["env"]["TF_CONFIG"].split('"task"')[0] for s in starts}), 1)

    def test_losing_the_store_serving_node_moves_the_workers_store_to_the_next_group_rank_0(self):
        stop = os.path.join(temp_dir(self), "stop")
        addresses = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        agents = self.start_agents(
            "2:3", addresses, ["--allreduce", "--until-file", stop], nproc=1, extra=[FAST_LEASE]
        )
        first = self.wait_for_starts(3, agents, attempt=0)
        master = {s["env"]["MASTER_ADDR"] for s in first}
        self.assertEqual(master, {"127.0.0.1"})
        host = next(s for s in first if s["env"]["GROUP_RANK"] == "0")
        victim = next(a for a in agents if a.pid == host["ppid"])
        # SIGKILL the agent that serves the workers' store, and its worker: the node is gone.
        victim.proc.kill()
        killed = time.time()
        kill_if_ours(host["pid"])
        victim.proc.wait()
        survivors = [a for a in agents if a is not victim]
        again = self.wait_for_starts(2, survivors, attempt=1)
        self.assertLess(
            max(s["time"] for s in again) - killed,
            RESTART_WITHIN_S,
            "\n".join(a.describe() for a in survivors),
        )
        for s in again:
            env = s["env"]
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.2")  # the new group rank 0
            self.assertEqual(s["sum"], 1 + 2)  # the all-reduce ran on the moved store
        with open(stop, "w"):
            pass
        for agent in survivors:
            r = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)

    def test_etcd_down_for_8_s_restarts_no_worker_and_the_lines_say_when_it_went_and_came_back(
        self,
    ):
        """A store outage is not a node loss: etcd (one member) killed for 8 s and started again
        with its data. The workers run through it, no round ends, and each agent says when the
        store went and when it came back."""
        stop = os.path.join(temp_dir(self), "stop")
        agents = self.start_agents(2, ["127.0.0.1", "127.0.0.2"], ["--until-file", stop], nproc=1)
        self.wait_for_starts(2, agents, attempt=0)
        self.etcd.stop()
        time.sleep(OUTAGE_S)  # the outage itself
        self.etcd.restart()
        back = time.monotonic()
        # Leases lapse one TTL after the cluster is back unless renewed: past it, still no
        # second attempt and every agent runs on.
        while time.monotonic() < back + TTL_S + LAPSE_SLACK_S:
            self.assertEqual(
                [s for s in self.starts() if s["env"]["TORCHELASTIC_RESTART_COUNT"] != "0"],
                [],
                "\n".join(a.describe() for a in agents),
            )
            for agent in agents:
                self.assertIsNone(agent.proc.poll(), agent.describe())
            time.sleep(0.2)
        with open(stop, "w"):
            pass
        for agent in agents:
            r = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)
            lines = "\n".join(r.dlrun_lines())
            self.assertRegex(
                lines,
                r"the rendezvous store at .+ stopped answering .*the "
                r"workers keep running",
                r,
            )
            self.assertRegex(
                lines,
                r"the rendezvous store at .+ answers again after "
                r"\d+\.\d s",
                r,
            )
            self.assertNotIn("stopping workers", lines, r)
            self.assertNotIn("spare", lines, r)
        self.assertEqual(len(self.starts()), 2)

    def test_a_worker_failure_while_etcd_is_down_is_reported_once_it_is_back(self):
        """Only what needs the store waits: a worker killed during the outage is reported when
        etcd answers again, and the job restarts then (attempt 1 on both nodes)."""
        stop = os.path.join(temp_dir(self), "stop")
        agents = self.start_agents(
            2,
            ["127.0.0.1", "127.0.0.2"],
            ["--until-file", stop],
            nproc=1,
            extra=["--max-restarts=1"],
        )
        first = self.wait_for_starts(2, agents, attempt=0)
        self.etcd.stop()
        kill_if_ours(first[1]["pid"])
        time.sleep(OUTAGE_S)  # the outage itself
        self.etcd.restart()
        again = self.wait_for_starts(2, agents, attempt=1)
        self.assertEqual(sorted(s["env"]["RANK"] for s in again), ["0", "1"])
        with open(stop, "w"):
            pass
        lines = ""
        for agent in agents:
            r = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)
            lines += "\n".join(r.dlrun_lines())
        self.assertIn("is made once it does", lines)
        self.assertEqual(len(self.starts()), 4)

    def test_without_local_addr_etcds_side_serves_and_an_ended_job_id_is_refused(self):
        agents = self.start_agents(
            2, [None, None], ["--allreduce"], nproc=1, extra=["--rdzv-conf=etcd_prefix=/elsewhere"]
        )
        for agent in agents:
            r = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(sorted(s["env"]["RANK"] for s in starts), ["0", "1"])
        for s in starts:
            self.assertEqual(s["env"]["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(s["sum"], 1 + 2)
        # The job's keys live under PREFIX/ID/, none under the default /dlrun/.
        self.assertNotEqual(self.etcd.keys(f"/elsewhere/job{self.etcd.port}/"), [])
        self.assertEqual(self.etcd.keys("/dlrun/"), [])
        # etcd outlives the job: a new job under the same id is refused, not handed the old
        # outcome (exit 0 and no worker).
        out = temp_dir(self)
        again = Dlrun(
            self,
            [
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=etcd",
                f"--rdzv-endpoint={self.etcd.endpoint}",
                f"--rdzv-id=job{self.etcd.port}",
                "--rdzv-conf=etcd_prefix=/elsewhere",
                PYTHON,
                WORKER,
                out,
            ],
            env=clean_env(),
        ).wait(JOB_TIMEOUT_S)
        self.assertEqual(again.returncode, 2, again)
        self.assertEqual(len(again.dlrun_lines()), 1, again)
        # The line says when the id frees: the job's agents leased its keys as they left.
        self.assertRegex(
            again.dlrun_lines()[0],
            r"names a job that ended at \d\d:\d\d:\d\d \(every worker finished\); "
            r"its keys expire at \d\d:\d\d:\d\d, in \d+ s "
            r"\(--rdzv-conf job_ttl=3600\)",
        )
        self.assertEqual(os.listdir(out), [])  # no worker started

    def test_a_rerun_under_the_default_id_starts_once_the_ended_jobs_keys_expired(self):
        # torchrun's default --rdzv-id (none), as a job script re-run would use it.
        args = [
            "--nnodes=1:2",
            "--nproc-per-node=1",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.etcd.endpoint}",
            f"--rdzv-conf=job_ttl={JOB_TTL_S},last_call_timeout=0.2",
        ]
        for run in range(2):
            out = temp_dir(self)
            r = Dlrun(self, [*args, PYTHON, WORKER, out], env=clean_env()).wait(JOB_TIMEOUT_S)
            self.assertEqual(r.returncode, 0, r)
            self.assertEqual(len(glob.glob(os.path.join(out, "start_*.json"))), 1, r)
            keys = self.etcd.keys("")
            self.assertIn("/dlrun/none/kv/expiry", keys)
            for key in keys:  # one prefix, not the store's and the rendezvous's
                self.assertTrue(key.startswith("/dlrun/none/"), key)
                self.assertEqual(key.count("dlrun/none/"), 1, key)
            # etcd holds no key of the job once its TTL passed.
            wait_until(
                lambda: self.etcd.keys("") == [],
                JOB_TTL_S + EXPIRY_SLACK_S,
                f"the keys of run {run} to expire",
                on_timeout=lambda: self.etcd.keys(""),
            )

    def assert_one_line_error(self, args, code, part, within=JOB_TIMEOUT_S):
        started = time.monotonic()
        r = Dlrun(self, [*args, PYTHON, WORKER, self.out], env=clean_env()).wait(JOB_TIMEOUT_S)
        self.assertLess(time.monotonic() - started, within, r)
        self.assertEqual(r.returncode, code, r)
        lines = r.dlrun_lines()
        self.assertEqual(len(lines), 1, r)
        self.assertIn(part, lines[0])
        self.assertEqual(self.starts(), [])  # no worker started

    def test_unreachable_endpoints_are_one_line_in_bounded_time(self):
        dead = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
        self.assert_one_line_error(
            ["--nnodes=2", "--rdzv-backend=etcd", f"--rdzv-endpoint={dead}"],
            1,
            "cannot reach etcd (--rdzv-endpoint): etcd: no endpoint answered",
            within=ERROR_WITHIN_S,
        )

    def test_a_malformed_endpoint_list_is_one_line_exit_2(self):
        self.assert_one_line_error(
            ["--nnodes=2", "--rdzv-backend=etcd", f"--rdzv-endpoint={self.etcd.endpoint},,x"],
            2,
            "--rdzv-endpoint",
        )

    def test_etcd_v2_is_refused_in_one_line_exit_2(self):
        self.assert_one_line_error(
            ["--nnodes=2", "--rdzv-backend=etcd-v2", f"--rdzv-endpoint={self.etcd.endpoint}"],
            2,
            "dlrun speaks etcd's v3 API; use --rdzv-backend=etcd",
        )


if __name__ == "__main__":
    main()
