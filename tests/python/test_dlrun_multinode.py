"""Several dlrun agents on loopback forming one job through the c10d rendezvous.

Each agent is a separate dlrun process, as on separate nodes; they meet at one endpoint, where
the first agent to bind serves the store. Workers record what dlrun gave them in files.
"""

import glob
import json
import os
import signal
import socket
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    Dlrun,
    clean_env,
    free_port,
    is_running,
    kill_recorded_workers,
    main,
    read_json,
    temp_dir,
    wait_until,
    worker,
)
from dlrund_fixture import Dlrund

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 60


class MultiNodeTest(unittest.TestCase):
    def start_agents(
        self, count, nnodes, worker_args, nproc=2, extra=(), host="127.0.0.1", per_agent=None
    ):
        """Starts `count` agents; per_agent(i) gives agent i's own extra flags."""
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)
        self.port = free_port()
        endpoint = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        nprocs = nproc if isinstance(nproc, list) else [nproc] * count
        args = [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id=job{self.port}",
            *extra,
        ]
        tail = [PYTHON, WORKER, self.out, *worker_args]
        return [
            Dlrun(
                self,
                [
                    *args,
                    f"--nproc-per-node={nprocs[i]}",
                    *(per_agent(i) if per_agent else []),
                    *tail,
                ],
                env=clean_env(),
            )
            for i in range(count)
        ]

    def starts(self):
        return [read_json(p) for p in glob.glob(os.path.join(self.out, "start_*.json"))]

    def wait_for_starts(self, count, agents, attempt=None):
        def matching():
            return [
                s
                for s in self.starts()
                if attempt is None or s["env"]["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
            ]

        wait_until(
            lambda: len(matching()) >= count,
            JOB_TIMEOUT_S,
            f"{count} workers to start",
            on_timeout=lambda: "\n".join(a.describe() for a in agents),
        )
        return matching()

    def finish(self, agents):
        return [a.wait(JOB_TIMEOUT_S) for a in agents]

    def test_three_agents_give_unique_consistent_ranks_and_allreduce_across_nodes(self):
        agents = self.start_agents(3, "3", ["--allreduce"])
        results = self.finish(agents)
        for r in results:
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(len(starts), 6)
        ranks = sorted(int(s["env"]["RANK"]) for s in starts)
        self.assertEqual(ranks, list(range(6)))
        for s in starts:
            env = s["env"]
            self.assertEqual(env["WORLD_SIZE"], "6")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "3")
            # Two workers per node: the node's group rank places its ranks.
            self.assertEqual(int(env["RANK"]), 2 * int(env["GROUP_RANK"]) + int(env["LOCAL_RANK"]))
            self.assertEqual(s["sum"], sum(range(1, 7)))  # every rank's value, across nodes
        self.assertEqual(len({s["env"]["TF_CONFIG"].split('"task"')[0] for s in starts}), 1)

    def test_roles_give_every_process_one_tf_config_cluster_and_its_own_task(self):
        # ps:1,worker:3 on two nodes, checked by the rules of TensorFlow's
        # TFConfigClusterResolver: the task's type is a job of the cluster, its index in range.
        agents = self.start_agents(2, "2", [], nproc=4, extra=["--roles=ps:1,worker:3"])
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(len(starts), 8)
        configs = [json.loads(s["env"]["TF_CONFIG"]) for s in starts]
        cluster = configs[0]["cluster"]
        self.assertEqual(sorted(cluster), ["chief", "ps", "worker"])
        self.assertEqual(
            (len(cluster["chief"]), len(cluster["ps"]), len(cluster["worker"])), (1, 2, 5)
        )
        entries = [e for job in cluster.values() for e in job]
        self.assertEqual(len(set(entries)), 8)  # unique host:port entries
        tasks = set()
        for s, config in zip(starts, configs):
            env = s["env"]
            self.assertEqual(config["cluster"], cluster)
            task = config["task"]
            self.assertIn(task["type"], cluster)
            self.assertTrue(0 <= task["index"] < len(cluster[task["type"]]), config)
            tasks.add((task["type"], task["index"]))
            # Node order: ps first, then the workers; role ranks follow RANK.
            local = int(env["LOCAL_RANK"])
            self.assertEqual(env["ROLE_NAME"], "ps" if local == 0 else "worker")
            self.assertEqual(env["ROLE_WORLD_SIZE"], "2" if local == 0 else "6")
            node = int(env["GROUP_RANK"])
            role_rank = node if local == 0 else 3 * node + local - 1
            self.assertEqual(env["ROLE_RANK"], str(role_rank))
            expected_type = "ps" if local == 0 else "chief" if role_rank == 0 else "worker"
            self.assertEqual(task["type"], expected_type, env)
        self.assertEqual(len(tasks), 8)

    def run_elastic_range(self, agents, last_call_s):
        """Runs `agents` agents with --nnodes=2:4 to completion; returns (launch time, starts)."""
        launched = time.time()
        results = self.finish(
            self.start_agents(
                agents, "2:4", [], nproc=1, extra=[f"--rdzv-conf=last_call_timeout={last_call_s}"]
            )
        )
        for r in results:
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(sorted(s["env"]["WORLD_SIZE"] for s in starts), [str(agents)] * agents)
        return launched, starts

    def test_nodes_with_different_worker_counts_get_contiguous_ranks(self):
        agents = self.start_agents(3, "3", ["--allreduce"], nproc=[1, 3, 2])
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
        starts = self.starts()
        self.assertEqual(sorted(int(s["env"]["RANK"]) for s in starts), list(range(6)))
        by_node = {}
        for s in starts:
            self.assertEqual(s["env"]["WORLD_SIZE"], "6")
            self.assertEqual(s["sum"], sum(range(1, 7)))
            by_node.setdefault(s["ppid"], []).append(int(s["env"]["RANK"]))
        # Each node holds a contiguous block of ranks, its size its worker count.
        blocks = sorted(sorted(ranks) for ranks in by_node.values())
        self.assertEqual(sorted(len(b) for b in blocks), [1, 2, 3])
        for b in blocks:
            self.assertEqual(b, list(range(b[0], b[0] + len(b))))

    def test_an_elastic_range_closes_after_the_last_call_window(self):
        launched, starts = self.run_elastic_range(3, 1.5)
        # The window opens when the 2nd agent arrives, which is after `launched`.
        self.assertGreaterEqual(min(s["time"] for s in starts), launched + 1.5)

    def test_an_elastic_range_closes_at_once_at_its_maximum(self):
        launched, starts = self.run_elastic_range(4, 30)
        self.assertLess(max(s["time"] for s in starts), launched + 15)  # not the 30 s window

    def test_a_worker_failure_restarts_the_workers_of_every_node(self):
        agents = self.start_agents(
            3, "3", ["--fail-rank", "3", "--fail-rounds", "1"], extra=["--max-restarts=1"]
        )
        results = self.finish(agents)
        for r in results:
            self.assertEqual(r.returncode, 0, r)
        by_attempt = {}
        for s in self.starts():
            by_attempt.setdefault(s["env"]["TORCHELASTIC_RESTART_COUNT"], set()).add(
                int(s["env"]["RANK"])
            )
        # Rank 3 failed in attempt 0 (the others may not have got far before they were
        # stopped); attempt 1 ran on every node.
        self.assertIn(3, by_attempt["0"])
        self.assertEqual(by_attempt["1"], set(range(6)))
        self.assertEqual(set(by_attempt), {"0", "1"})

    def test_past_max_restarts_every_agent_fails_with_the_same_root_cause(self):
        agents = self.start_agents(
            3, "3", ["--fail-rank", "3", "--fail-rounds", "-1"], extra=["--max-restarts=1"]
        )
        results = self.finish(agents)
        reports = []
        for r in results:
            self.assertEqual(r.returncode, 3, r)
            report = [line for line in r.dlrun_lines() if "worker failed" in line]
            self.assertEqual(len(report), 1, r)
            reports.append(report[0])
        self.assertEqual(len(set(reports)), 1, reports)
        self.assertIn("rank 3", reports[0])
        self.assertIn("exit code 3", reports[0])
        self.assertIn("after 1 restart", reports[0])

    def test_the_no_restart_exit_code_ends_every_node_at_once_with_it(self):
        agents = self.start_agents(
            2,
            "2",
            ["--fail-rank", "3", "--fail-rounds", "-1", "--fail-code", "93"],
            extra=["--max-restarts=3", "--no-restart-exit-code=93"],
        )
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 93, r)
            self.assertIn(
                "dlrun: rank 3 exited with 93, --no-restart-exit-code: the job ends "
                "without a restart",
                r.stderr,
            )
        self.assertEqual({s["env"]["TORCHELASTIC_RESTART_COUNT"] for s in self.starts()}, {"0"})

    def test_a_node_that_finished_first_keeps_the_job_open_for_the_others(self):
        stop = os.path.join(temp_dir(self), "stop")
        agents = self.start_agents(2, "2", ["--until-file", stop, "--hold-ranks", "2,3"])
        starts = self.wait_for_starts(4, agents)
        finished = [s["pid"] for s in starts if int(s["env"]["RANK"]) < 2]
        wait_until(
            lambda: not any(is_running(pid) for pid in finished),
            JOB_TIMEOUT_S,
            "ranks 0 and 1 to exit",
        )
        # Group rank 0's workers are done; its agent waits for the job, which goes on.
        agent_of_rank0 = next(s["ppid"] for s in starts if s["env"]["RANK"] == "0")
        done_agent = next(a for a in agents if a.pid == agent_of_rank0)
        self.assertIsNone(done_agent.proc.poll(), done_agent.describe())
        with open(stop, "w"):
            pass
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
        self.assertEqual(len(self.starts()), 4)  # nobody restarted

    def test_a_second_job_shape_under_the_same_id_is_refused(self):
        agents = self.start_agents(
            1, "1:3", ["--wait"], nproc=1, extra=["--rdzv-conf=last_call_timeout=0.1"]
        )
        self.wait_for_starts(1, agents)  # the job (shape 1:3) runs
        args = [
            "--nnodes=2:4",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            f"--rdzv-id=job{self.port}",
            PYTHON,
            WORKER,
            self.out,
        ]
        other = Dlrun(self, args, env=clean_env()).wait(JOB_TIMEOUT_S)
        self.assertEqual(other.returncode, 2, other)
        self.assertIn("--nnodes=1:3", "\n".join(other.dlrun_lines()))
        agents[0].kill()

    def test_local_addr_is_published_and_orders_the_group_ranks(self):
        # Started in reverse order: the numeric address, not arrival, decides the group rank.
        addresses = ["127.0.0.3", "127.0.0.2"]
        agents = self.start_agents(
            2, "2", [], nproc=1, per_agent=lambda i: [f"--local-addr={addresses[i]}"]
        )
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
        for s in self.starts():
            workers = json.loads(s["env"]["TF_CONFIG"])["cluster"]["worker"]
            self.assertEqual([w.rsplit(":", 1)[0] for w in workers], ["127.0.0.2", "127.0.0.3"])

    def test_an_ipv6_endpoint(self):
        agents = self.start_agents(2, "2", [], nproc=1, host="::1")
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
        for s in self.starts():
            self.assertEqual(s["env"]["MASTER_ADDR"], "::1")
            self.assertTrue(
                json.loads(s["env"]["TF_CONFIG"])["cluster"]["worker"][0].startswith("[::1]:")
            )

    def test_when_the_store_serving_agent_dies_the_others_stop_instead_of_hanging(self):
        stop = os.path.join(temp_dir(self), "stop")
        agents = self.start_agents(
            2,
            "2",
            ["--until-file", stop],
            nproc=1,
            per_agent=lambda i: [f"--rdzv-conf=is_host={int(i == 0)}"],
        )
        self.wait_for_starts(2, agents)
        agents[0].proc.kill()  # SIGKILL: the store goes with it
        other = agents[1].wait(JOB_TIMEOUT_S)
        self.assertEqual(other.returncode, 1, other)
        self.assertIn("is gone (connection refused)", other.dlrun_lines()[-1])

    def test_a_dlrund_restarted_without_its_state_costs_one_restart_with_the_reason(self):
        """dlrund restarted on the same port, its keys lost: the agents ride out the gap, find
        their round gone, say so, and meet again in the next round (one restart, the round
        number going on); the job then ends with exit 0, never a hang."""
        daemon = Dlrund()
        self.addCleanup(lambda: daemon.stop(signal.SIGKILL))
        stop = os.path.join(temp_dir(self), "stop")
        agents = self.start_agents(
            2,
            "2",
            ["--until-file", stop],
            nproc=1,
            per_agent=lambda i: [f"--rdzv-endpoint=127.0.0.1:{daemon.port}"],
        )
        self.wait_for_starts(2, agents, attempt=0)
        daemon.stop(signal.SIGKILL)
        daemon = Dlrund(port=daemon.port)
        again = self.wait_for_starts(2, agents, attempt=1)
        self.assertEqual(sorted(s["env"]["RANK"] for s in again), ["0", "1"])
        with open(stop, "w"):
            pass
        for r in self.finish(agents):
            self.assertEqual(r.returncode, 0, r)
            lines = "\n".join(r.dlrun_lines())
            self.assertIn("came back without round 0 (it restarted and lost its keys)", lines, r)
        self.assertEqual(len(self.starts()), 4)  # attempts 0 and 1: nothing else

    def test_agents_turned_away_from_the_store_port_serve_once_it_frees(self):
        """Two agents on the store's host both turned away from its port (here by a socket
        bound there without listening; two agents listening at once can turn each other away
        too): each tries again while nothing answers there, and one serves once the port frees,
        where both used to wait for a store nobody served, silent until the join timeout."""
        port = free_port()
        holder = socket.socket()
        self.addCleanup(holder.close)
        holder.bind(("127.0.0.1", port))  # no SO_REUSEADDR, no listen(): binds to it fail
        args = [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=job{port}",
            "--rdzv-conf=join_timeout=30",
            "--no-python",
            "/bin/true",
        ]
        agents = [Dlrun(self, args, env=clean_env(DLRUN_LOG_LEVEL="debug")) for _ in range(2)]
        retrying = "is taken and nothing answers there: trying again to serve the store"
        wait_until(
            lambda: all(retrying in a.output()[1] for a in agents),
            JOB_TIMEOUT_S,
            "both agents to try the store's port again",
            on_timeout=lambda: "\n".join(a.describe() for a in agents),
        )
        holder.close()
        for result in self.finish(agents):
            self.assertEqual(result.returncode, 0, result)

    def test_an_unreachable_endpoint_fails_after_the_join_timeout(self):
        args = [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-conf=join_timeout=1,is_host=0",
            PYTHON,
            WORKER,
            temp_dir(self),
        ]
        result = Dlrun(self, args, env=clean_env()).wait(JOB_TIMEOUT_S)
        self.assertEqual(result.returncode, 1, result)
        lines = result.dlrun_lines()
        self.assertEqual(len(lines), 1, result)
        self.assertIn("cannot reach the rendezvous store at 127.0.0.1:", lines[0])


if __name__ == "__main__":
    main()
