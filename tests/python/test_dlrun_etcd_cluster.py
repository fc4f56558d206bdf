"""dlrun's etcd backend on a real 3-member etcd cluster (Debian's /usr/bin/etcd), each member on
its own simulated host (network namespaces, tests/python/netns_fixture.py), and the dlrun nodes
on other simulated hosts. Every connection starts inside a namespace: etcdctl and dlrun run
inside hosts. Every etcd member is stopped by PID in the test's cleanups, also on failure.

- three nodes x two workers form one world through the cluster (ranks, WORLD_SIZE,
  GROUP_RANK, TF_CONFIG, a torch gloo all-reduce across nodes);
- the etcd leader SIGKILLed mid-job: no worker restarts; a node started afterwards is admitted
  at the next round; the job ends with exit 0;
- the etcd member the agents use silenced (its link down, so nothing resets its connections):
  no worker restarts, and the job still ends within seconds;
- the etcd member the agents use cut off from the other members, but not from the agents (a
  partition): it has no leader and refuses their streams; no worker restarts, the agents leave
  it, and the job still ends within seconds;
- every etcd member killed for 8 s and started again with its data: no worker restarts, and
  each agent says when the store went and when it came back;
- a dlrun node's link set down: its lease lapses and the survivors restart within TTL + 1 s;
- the bundled trainer (--synthetic, checkpoints in a shared temp dir) on three nodes loses the
  node of group rank 0, which serves the workers' store (every process of its namespace
  SIGKILLed): the two survivors' new workers start within 3 s with the next group rank 0's
  store as MASTER_ADDR, resume from the checkpoint and take every remaining step once.

Needs root (namespaces); skipped without it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

from dlrun_fixture import (
    POLL_S,
    PYTHON,
    binary_from_env,
    clean_env,
    log_tails,
    temp_dir,
    wait_until,
    worker,
    worker_starts,
)
from etcd_fixture import ETCD, ETCDCTL, member_args
from netns_fixture import Hosts, main
from trainer_fixture import checkpoints

MEMBERS = 3  # hosts 0..2 run etcd; hosts 3.. run dlrun
NODES = 3
WORKER = worker("elastic_worker.py")
START_TIMEOUT_S = 30  # the cluster answering
EVENT_TIMEOUT_S = 60  # workers starting, agents ending
ELECTION_TIMEOUT_S = 15  # a new leader after the old one is killed
TTL_S = 3.0  # keep_alive_interval (1 s) x keep_alive_max_attempt (3): the defaults
QUIET_S = TTL_S + 2.0  # after the leader's loss, how long no worker may restart
OUTAGE_S = 8  # every member down, then started again with its data
STORE_MOVE_S = 3.0  # from the loss of the workers' store's node to the survivors' workers
TRAIN_EPOCHS = 4  # the trainer on --synthetic data (20000 examples, batches of 64)
STEPS_3 = 105  # steps an epoch at world size 3: ceil(ceil(20000 / 3) / 64)
STEPS_2 = 157  # ... at world size 2: ceil(10000 / 64)
CHECKPOINT_EVERY = 20
TRAIN_TIMEOUT_S = 150
MIN_ACCURACY = 0.3  # of 10 classes (chance: 0.1)


def setUpModule():
    if os.geteuid() != 0:
        print("test_dlrun_etcd_cluster: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("network namespaces need root")
    for path in (ETCD, ETCDCTL):
        if not os.access(path, os.X_OK):
            raise AssertionError(
                f"{path} is missing: the etcd tests need Debian's etcd-server "
                "and etcd-client packages"
            )


class EtcdClusterTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.stop_file = os.path.join(self.out, "stop")
        self.hosts = Hosts(MEMBERS + NODES + 1)
        self.addCleanup(self.hosts.close)
        self.agents = {}
        self.members = {}
        self.start_cluster()

    # --- etcd ---------------------------------------------------------------------------------

    def endpoints(self, members=range(MEMBERS)):
        return ",".join(f"{self.hosts.address(m)}:2379" for m in members)

    def start_cluster(self):
        for m in range(MEMBERS):
            self.start_member(m)
            self.addCleanup(self.stop_member, m)
        self.await_cluster()

    def start_member(self, m):
        """Starts member m, with its data directory (kept across restarts)."""
        addresses = {i: self.hosts.address(i) for i in range(MEMBERS)}
        log = open(os.path.join(self.out, f"etcd{m}.log"), "a")
        self.addCleanup(log.close)
        self.members[m] = self.hosts.popen(
            m,
            member_args(m, addresses, f"{self.out}/etcd{m}", f"dlrun-{self.hosts.prefix}"),
            stdout=log,
            stderr=log,
        )

    def await_cluster(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy(range(MEMBERS)):
            for m, proc in self.members.items():
                if proc.poll() is not None:
                    self.fail(f"etcd m{m} exited with {proc.returncode}\n{self.logs()}")
            if time.monotonic() >= deadline:
                self.fail(
                    f"the etcd cluster did not answer within {START_TIMEOUT_S}s\n{self.logs()}"
                )
            time.sleep(POLL_S)

    def stop_member(self, m):
        proc = self.members[m]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(EVENT_TIMEOUT_S)

    def etcdctl(self, members, *args):
        """etcdctl run inside the first dlrun host (never from the root namespace)."""
        return self.hosts.run(
            MEMBERS,
            [
                ETCDCTL,
                f"--endpoints={self.endpoints(members)}",
                "--dial-timeout=1s",
                "--command-timeout=2s",
                *args,
            ],
            timeout=15,
            env={**os.environ, "ETCDCTL_API": "3"},
        )

    def healthy(self, members):
        return self.etcdctl(members, "endpoint", "health").returncode == 0

    def leader(self, members=range(MEMBERS)):
        """The member index of the leader the members in `members` agree on, else None."""
        result = self.etcdctl(members, "endpoint", "status", "-w", "json")
        if result.returncode != 0:
            return None
        statuses = json.loads(result.stdout)
        # No leader (mid-election) is 0, which etcdctl's JSON leaves out.
        leaders = {s["Status"].get("leader", 0) for s in statuses}
        if len(leaders) != 1 or 0 in leaders:
            return None
        for s in statuses:
            if s["Status"]["header"]["member_id"] in leaders:
                address = s["Endpoint"].split("//")[-1].rsplit(":", 1)[0]
                return next(m for m in members if self.hosts.address(m) == address)
        return None

    def make_leader(self, target):
        """Moves the cluster's leadership to member `target` (etcdctl move-leader, sent to the
        leader); returns once every member agrees."""
        result = self.etcdctl([target], "endpoint", "status", "-w", "json")
        self.assertEqual(result.returncode, 0, result.stderr)
        target_id = json.loads(result.stdout)[0]["Status"]["header"]["member_id"]
        leader = self.leader()
        self.assertIsNotNone(leader, self.logs())
        if leader != target:
            result = self.etcdctl([leader], "move-leader", f"{target_id:x}")
            self.assertEqual(result.returncode, 0, result.stderr)
        wait_until(
            lambda: self.leader() == target,
            ELECTION_TIMEOUT_S,
            f"m{target} to lead",
            on_timeout=self.logs,
        )

    def watch_streams(self, m):
        """How many Watch streams member m serves (its metrics, read from the first dlrun host)."""
        script = (
            "import re, urllib.request; t = urllib.request.urlopen("
            f"'http://{self.hosts.address(m)}:2379/metrics', timeout=5).read().decode(); "
            "print(re.search(r'^etcd_debugging_mvcc_watch_stream_total (\\S+)', t, "
            "re.M).group(1))"
        )
        result = self.hosts.run(MEMBERS, [PYTHON, "-c", script], timeout=15)
        self.assertEqual(result.returncode, 0, result.stderr)
        return float(result.stdout)

    # --- dlrun --------------------------------------------------------------------------------

    def start_agent(self, node, nnodes, worker_args, nproc=1, extra=()):
        host = MEMBERS + node
        log = open(os.path.join(self.out, f"agent{node}-{len(self.agents)}.log"), "w")
        self.addCleanup(log.close)
        args = [
            binary_from_env("DLRUN", "dlrun"),
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.endpoints()}",
            f"--rdzv-id={self.hosts.prefix}",
            *extra,
            PYTHON,
            WORKER,
            self.out,
            *worker_args,
        ]
        env = clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=self.out)
        self.agents[node] = self.hosts.popen(host, args, env=env, stdout=log, stderr=log)
        return self.agents[node]

    def logs(self):
        return log_tails(self.out, "*.log", tail=3000)

    def starts(self, attempt=None):
        return worker_starts(self.out, attempt)

    def wait_for_starts(self, attempt, count):
        wait_until(
            lambda: len(self.starts(attempt)) >= count,
            EVENT_TIMEOUT_S,
            f"{count} workers of attempt {attempt}",
            on_timeout=self.logs,
        )
        return self.starts(attempt)

    def wait_for_exit(self, node, timeout=EVENT_TIMEOUT_S):
        """Agent `node`'s exit code; fails the test, with the logs, if it runs past timeout."""
        try:
            return self.agents[node].wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"agent {node} still runs after {timeout}s\n{self.logs()}")

    def finish(self, nodes):
        with open(self.stop_file, "w"):
            pass
        for node in nodes:
            self.assertEqual(self.wait_for_exit(node), 0, self.logs())

    def assert_no_restart_until(self, deadline):
        """Watches until `deadline` (time.monotonic()): no worker of a second attempt starts and
        every agent runs on."""
        while time.monotonic() < deadline:
            self.assertEqual(self.starts(1), [], self.logs())
            for node, agent in self.agents.items():
                self.assertIsNone(agent.poll(), f"agent {node} exited\n{self.logs()}")
            time.sleep(POLL_S)

    def assert_world(self, starts, size):
        self.assertEqual([int(s["env"]["RANK"]) for s in starts], list(range(size)), self.logs())
        for s in starts:
            self.assertEqual(s["env"]["WORLD_SIZE"], str(size))

    # --- the tests ----------------------------------------------------------------------------

    def test_three_nodes_form_one_world_and_allreduce_across_hosts(self):
        for node in range(3):
            self.start_agent(node, 3, ["--allreduce"], nproc=2)
        for node in range(3):
            self.assertEqual(self.wait_for_exit(node), 0, self.logs())
        starts = self.starts()
        self.assert_world(starts, 6)
        group_hosts = {}
        for s in starts:
            env = s["env"]
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "3")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(int(env["RANK"]), 2 * int(env["GROUP_RANK"]) + int(env["LOCAL_RANK"]))
            self.assertEqual(s["sum"], sum(range(1, 7)))  # every rank's value, across hosts
            group_hosts.setdefault(env["GROUP_RANK"], set()).add(s["host"])
            workers = json.loads(env["TF_CONFIG"])["cluster"]["worker"]
            self.assertEqual(len(workers), 6)
            self.assertEqual(
                json.loads(env["TF_CONFIG"])["task"], {"type": "worker", "index": int(env["RANK"])}
            )
        # One group rank a host, every host one group rank; the workers' store is served by
        # group rank 0's host, and TF_CONFIG lists each rank on its own host's address.
        self.assertEqual(sorted(group_hosts), ["0", "1", "2"])
        self.assertTrue(all(len(h) == 1 for h in group_hosts.values()), group_hosts)
        self.assertEqual(
            sorted(h.pop() for h in group_hosts.values()),
            [self.hosts.hostname(MEMBERS + n) for n in range(3)],
        )
        address_of = {self.hosts.hostname(i): self.hosts.address(i) for i in range(self.hosts.n)}
        for s in starts:
            env = s["env"]
            rank0_host = next(r["host"] for r in starts if r["env"]["RANK"] == "0")
            self.assertEqual(env["MASTER_ADDR"], address_of[rank0_host])
            workers = json.loads(env["TF_CONFIG"])["cluster"]["worker"]
            self.assertEqual(workers[int(env["RANK"])].rsplit(":", 1)[0], address_of[s["host"]])
        self.assertEqual(len({s["env"]["MASTER_PORT"] for s in starts}), 1)

    def test_killing_the_etcd_leader_restarts_no_worker_and_a_new_node_joins(self):
        for node in range(2):
            self.start_agent(node, "2:3", ["--until-file", self.stop_file])
        first = self.wait_for_starts(0, 2)
        self.assert_world(first, 2)
        # The leader is the first endpoint, the one the agents are likeliest to use.
        leader = 0
        self.make_leader(leader)

        killed = time.monotonic()
        self.stop_member(leader)
        survivors = [m for m in range(MEMBERS) if m != leader]
        wait_until(
            lambda: self.leader(survivors) is not None,
            ELECTION_TIMEOUT_S,
            "a new etcd leader",
            on_timeout=self.logs,
        )
        print(
            f"leader m{leader} killed; new leader m{self.leader(survivors)} after "
            f"{time.monotonic() - killed:.2f} s"
        )
        # The agents' leases outlive the election: for longer than their TTL after the loss,
        # no worker restarts and every agent runs on.
        self.assert_no_restart_until(killed + QUIET_S)
        self.assertEqual(len(self.starts()), 2, self.logs())

        joined = time.monotonic()
        self.start_agent(2, "2:3", ["--until-file", self.stop_file])
        grown = self.wait_for_starts(1, 3)
        print(f"new node admitted in {time.monotonic() - joined:.2f} s")
        self.assert_world(grown, 3)
        self.assertEqual(
            sorted(s["host"] for s in grown), [self.hosts.hostname(MEMBERS + n) for n in range(3)]
        )
        self.finish(range(3))
        self.assertEqual(len(self.starts()), 5, self.logs())  # 2, then 3: nothing else

    def ride_out_trouble_at_member_0(self, trouble, afterwards=lambda: None):
        """Two nodes run; `trouble()` befalls member 0, the first endpoint, the one the agents use
        (their watches are there). No worker restarts for QUIET_S, `afterwards()` checks what it
        will, and the job's end reaches both agents through the other members within seconds."""
        for node in range(2):
            self.start_agent(node, "2:3", ["--until-file", self.stop_file])
        first = self.wait_for_starts(0, 2)
        self.assert_world(first, 2)
        self.assertGreaterEqual(self.watch_streams(0), 2, self.logs())
        began = time.monotonic()
        trouble()
        self.assert_no_restart_until(began + QUIET_S)
        afterwards()
        ended = time.monotonic()
        self.finish(range(2))
        print(f"job ended {time.monotonic() - ended:.2f} s after its workers were told to")
        self.assertLess(time.monotonic() - ended, 5.0, self.logs())
        self.assertEqual(len(self.starts()), 2, self.logs())

    def test_a_silent_etcd_member_restarts_no_worker_and_the_job_ends_on_time(self):
        # Its link down: no reset reaches anyone, and it is cut off from its cluster too. The
        # end must not wait for the silent member's connection to time out.
        self.ride_out_trouble_at_member_0(lambda: self.hosts.link(0, up=False))

    def test_an_etcd_member_cut_off_from_its_cluster_restarts_no_worker(self):
        # It loses its peers but not its clients: it answers, but has no leader, so it refuses
        # their watches and keep-alives (`hasleader`) and cannot commit their writes. The agents
        # move to the other members: none of their watch streams stays.
        def cut():
            for member in range(1, MEMBERS):
                self.hosts.cut(0, member)

        self.ride_out_trouble_at_member_0(
            cut, afterwards=lambda: self.assertEqual(self.watch_streams(0), 0, self.logs())
        )

    def test_every_etcd_member_down_for_8_s_restarts_no_worker(self):
        """A store outage is not a node loss: the whole cluster killed for 8 s and started again
        with its data. The workers run through it, no round ends, and each agent says when the
        store went and when it came back."""
        for node in range(2):
            self.start_agent(node, "2:3", ["--until-file", self.stop_file])
        self.assert_world(self.wait_for_starts(0, 2), 2)
        for m in range(MEMBERS):
            self.stop_member(m)
        time.sleep(OUTAGE_S)  # the outage itself
        for m in range(MEMBERS):
            self.start_member(m)
        self.await_cluster()
        # Leases lapse one TTL after the cluster is back unless renewed.
        self.assert_no_restart_until(time.monotonic() + QUIET_S)
        self.finish(range(2))
        self.assertEqual(len(self.starts()), 2, self.logs())
        for node in range(2):
            with open(os.path.join(self.out, f"agent{node}-{node}.log")) as f:
                lines = f.read()
            self.assertRegex(
                lines,
                r"the rendezvous store at .+ stopped answering .*the "
                r"workers keep running",
                lines,
            )
            self.assertRegex(
                lines,
                r"the rendezvous store at .+ answers again after "
                r"\d+\.\d s",
                lines,
            )
            self.assertNotIn("stopping workers", lines)
            self.assertNotIn("spare", lines)

    def test_a_silent_node_lapses_and_the_survivors_restart_within_ttl(self):
        for node in range(3):
            self.start_agent(node, "2:3", ["--until-file", self.stop_file])
        first = self.wait_for_starts(0, 3)
        self.assert_world(first, 3)
        # Not group rank 0's node: its workers' store is the one the job's workers share.
        victim = next(s for s in first if s["env"]["GROUP_RANK"] == "2")
        victim_node = next(
            n for n in range(NODES) if self.hosts.hostname(MEMBERS + n) == victim["host"]
        )

        silenced = time.time()
        self.hosts.link(MEMBERS + victim_node, up=False)
        shrunk = self.wait_for_starts(1, 2)
        self.assert_world(shrunk, 2)
        self.assertNotIn(victim["host"], {s["host"] for s in shrunk})
        recovery = max(s["time"] for s in shrunk) - silenced
        print(f"link down to restarted workers: {recovery:.2f} s")
        self.assertLessEqual(recovery, TTL_S + 1.0, self.logs())
        self.finish([n for n in range(NODES) if n != victim_node])

    def test_the_trainer_loses_the_store_serving_node_and_takes_every_step_once(self):
        checkpoint_dir = os.path.join(self.out, "checkpoints")
        train = binary_from_env("DLRUN_TRAIN", "dlrun-train")
        trainer = [
            "--exec",
            train,
            "--synthetic",
            "--epochs",
            str(TRAIN_EPOCHS),
            "--seed",
            "3",
            "--lr",
            "0.02",  # off the knife edge of the default 0.05 (test_slurm.py)
            "--checkpoint-dir",
            checkpoint_dir,
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--progress-every",
            str(CHECKPOINT_EVERY),
        ]
        # A survivor's trainer fails when its peer's connection breaks, maybe before its agent
        # sees the node's lease lapse: that restart is the node loss's, so restarts are allowed.
        # --worker-store=agent: Python execs the trainer, which meets at dlrun's store whatever
        # the interpreter's torch (Debian 13's would have rank 0's torch serve it).
        for node in range(3):
            self.start_agent(
                node, "2:3", trainer, extra=["--max-restarts=3", "--worker-store=agent"]
            )

        def saved():
            return checkpoints(checkpoint_dir) if os.path.isdir(checkpoint_dir) else {}

        first = self.wait_for_starts(0, 3)
        self.assert_world(first, 3)
        # A checkpoint is written after an all-reduce of every rank: all three are training.
        wait_until(lambda: saved(), EVENT_TIMEOUT_S, "the first checkpoint", on_timeout=self.logs)
        host = next(s for s in first if s["env"]["GROUP_RANK"] == "0")["host"]
        victim = next(n for n in range(NODES) if self.hosts.hostname(MEMBERS + n) == host)
        self.assertEqual(first[0]["env"]["MASTER_ADDR"], self.hosts.address(MEMBERS + victim))

        killed = time.time()
        self.hosts.kill_host(MEMBERS + victim)
        saved_at_kill = max(saved())
        self.assertLess(saved_at_kill, TRAIN_EPOCHS * STEPS_3, "trained to the end before the kill")
        again = self.wait_for_starts(1, 2)
        restarted = max(s["time"] for s in again) - killed
        print(
            f"group rank 0 killed after step {saved_at_kill} -> survivors restarted in "
            f"{restarted:.2f} s"
        )
        self.assertLess(restarted, STORE_MOVE_S, self.logs())
        self.assert_world(again, 2)
        self.assertNotIn(host, {s["host"] for s in again})
        new_host = next(s for s in again if s["env"]["GROUP_RANK"] == "0")["host"]
        self.assertEqual(
            {s["env"]["MASTER_ADDR"] for s in again},
            {self.hosts.address(int(new_host[len("node") :]))},
        )
        survivors = [n for n in range(NODES) if n != victim]
        for node in survivors:
            self.assertEqual(self.wait_for_exit(node, TRAIN_TIMEOUT_S), 0, self.logs())
        self.assertEqual(len(self.starts()), 5, self.logs())  # 3, then 2: no other restart

        output = ""
        for node in survivors:
            with open(os.path.join(self.out, f"agent{node}-{node}.log"), errors="replace") as f:
                output += f.read()
        rank0 = [m.group(1) for m in re.finditer(r"^\[0\]:(.*)$", output, re.MULTILINE)]
        # The new group went on from a checkpoint of the old one (the newest at the kill, or one
        # written in the moment before the survivors stopped), not from the start.
        resumed = [line for line in rank0 if line.startswith("resuming from checkpoint")]
        self.assertEqual(len(resumed), 1, output)
        match = re.search(r"epoch (\d+), (\d+) samples into it, step (\d+)$", resumed[0])
        self.assertIsNotNone(match, resumed[0])
        epoch, samples, resumed_at = (int(g) for g in match.groups())
        self.assertGreaterEqual(resumed_at, saved_at_kill, output)
        # ... and took each remaining step once, at world size 2, to the last epoch's end.
        left = (STEPS_2 - samples // (2 * 64)) + (TRAIN_EPOCHS - epoch) * STEPS_2
        summary = json.loads(next(line for line in reversed(rank0) if line.startswith("{")))
        self.assertEqual(
            (summary["epochs"], summary["steps"], summary["world_size"]),
            (TRAIN_EPOCHS, resumed_at + left, 2),
            output,
        )
        self.assertGreaterEqual(summary["test_accuracy"], MIN_ACCURACY, output)
        self.assertIn(resumed_at + left, saved(), output)
        print(
            f"{resumed[0]}; the end: {summary['steps']} steps, "
            f"test accuracy {summary['test_accuracy']:.4f}"
        )


if __name__ == "__main__":
    main()
