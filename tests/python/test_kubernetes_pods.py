"""dlrun as the container command of Kubernetes training operators' pods (issue 47,
docs/guides/kubernetes.md). Each pod is a simulated host (a network namespace, scripts/netns.sh)
with its operator's environment exactly (KUBERNETES_SERVICE_HOST too, as in every pod); the pods
start in a random order (the seed is printed); the operator's service names are not in the pods'
hosts files until every pod said it waits for them (one line each), as a pod's DNS record
appears only once it is ready.

- Kubeflow Trainer v2's torch runtime (kubeflow/trainer pkg/runtime/framework/plugins/torch):
  PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the completion index), PET_MASTER_ADDR=
  <job>-node-0-0.<job>, PET_MASTER_PORT=29500, and `dlrun train.py` as the SDK's `torchrun
  train.py`. Every pod says once that it waits for the master's name; once the names resolve, 6
  ranks all-reduce over gloo. Then a pod deleted: SIGTERM to its dlrun, whose workers ignore it;
  within the pod's 30 s of grace (25 s of --stop-timeout in a pod) its dlrun has SIGKILLed them
  and exited 143, and the others stop cleanly, 143, naming the stop.
- PyTorchJob v1, static (kubeflow/training-operator pkg/controller.v1/pytorch, v1.8): the
  pod-level MASTER_ADDR=<job>-master-0, MASTER_PORT=23456, WORLD_SIZE (pods x nprocPerNode),
  RANK (master 0, worker i i+1), PYTHONUNBUFFERED, with PET_NNODES, PET_NODE_RANK,
  PET_NPROC_PER_NODE, PET_MASTER_ADDR, PET_MASTER_PORT: the workers get dlrun's RANK and
  WORLD_SIZE, as torchrun gives them, not the pod's, and all-reduce; a worker pod deleted stops
  the job on every pod (143).
- PyTorchJob v1, elastic: PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT=<job>-worker-0:23456,
  PET_NNODES=2:3, PET_NPROC_PER_NODE=1, PET_MAX_RESTARTS. A pod deleted leaves the job (a pod's
  default stop_policy in an elastic job): the two others meet again without it, using no failure
  restart, all-reduce as 2 and finish.
- A dlrund behind a name (a headless service) whose pod is replaced: the agents dial the store by
  that name, follow it to the new pod, and meet again after one restart.

Needs root (network namespaces)."""

import glob
import os
import random
import signal
import subprocess
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
EVENT_TIMEOUT_S = 60
POD_GRACE_S = 30  # terminationGracePeriodSeconds' default
PODS = 3
# A worker that heeds no SIGTERM (it ignores it; its sleeps die of it), ended only by SIGKILL;
# once it ignores it, it leaves OUT/stubborn.PID (OUT: its $0). `$$$$`: the workers' arguments
# go through torchrun's macro substitution, where `$$` is one `$`.
STUBBORN = ["--exec", "/bin/sh", "-c", "trap '' TERM; : > \"$0.$$$$\"; while :; do sleep 1; done"]


class KubernetesPodsTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            print("test_kubernetes_pods: skipped, needs root", flush=True)
            self.skipTest("network namespaces need root")
        self.out = temp_dir(self)
        self.stop_file = os.path.join(self.out, "stop")
        self.hosts = Hosts(PODS)
        self.addCleanup(self.hosts.close)
        self.pods = {}
        seed = random.randrange(1 << 30)
        print(f"test_kubernetes_pods: start order seed {seed}", flush=True)
        self.random = random.Random(seed)

    def start_pods(self, env_of, worker_args, pods=range(PODS)):
        """Starts the pods' dlrun, in a random order, with env_of(i) added to a clean env."""
        order = list(pods)
        self.random.shuffle(order)
        for i in order:
            log = open(os.path.join(self.out, f"pod{i}.log"), "w")
            self.addCleanup(log.close)
            env = clean_env(
                GLOO_SOCKET_IFNAME=None,
                TMPDIR=self.out,
                KUBERNETES_SERVICE_HOST="10.96.0.1",
                KUBERNETES_SERVICE_PORT="443",
                **env_of(i),
            )
            args = [binary_from_env("DLRUN", "dlrun"), PYTHON, WORKER, self.out, *worker_args]
            self.pods[i] = self.hosts.popen(i, args, env=env, stdout=log, stderr=log)

    def publish_names(self, names):
        """The pods' DNS records appear: names[i] (a list) resolve to pod i's address, in every
        pod. Appended in place: each pod's /etc/hosts is a bind mount of its file."""
        lines = "".join(f"{self.hosts.address(i)} {' '.join(n)}\n" for i, n in names.items())
        for i in range(PODS):
            with open(f"/etc/netns/{self.hosts.namespace(i)}/hosts", "a") as f:
                f.write(lines)

    def move_name(self, name, i):
        """`name` now resolves to pod i's address, in every pod: its line rewritten in place."""
        for j in range(PODS):
            with open(f"/etc/netns/{self.hosts.namespace(j)}/hosts", "r+") as f:
                lines = [line for line in f.read().splitlines() if name not in line.split()[1:]]
                f.seek(0)
                f.write("\n".join(lines + [f"{self.hosts.address(i)} {name}"]) + "\n")
                f.truncate()

    def start_dlrund(self, i):
        """A dlrund in pod i on the store's port; its PID, killed with the pod set."""
        args = [binary_from_env("DLRUND", "dlrund"), "--host", "0.0.0.0", "--port", "29400"]
        log = open(os.path.join(self.out, f"dlrund{i}.log"), "w")
        self.addCleanup(log.close)
        return self.hosts.popen(i, args, stdout=log, stderr=log)

    def publish_names_once_awaited(self, what, host, names):
        """Waits until every pod said once that it waits for `what` `host` to resolve, then
        publishes `names` (publish_names)."""
        waiting = f"waiting for {what} '{host}' to resolve"
        wait_until(
            lambda: all(waiting in self.log(i) for i in range(PODS)),
            EVENT_TIMEOUT_S,
            f"every pod to wait for {host}",
            on_timeout=self.logs,
        )
        self.publish_names(names)
        return waiting

    def log(self, i):
        with open(os.path.join(self.out, f"pod{i}.log")) as f:
            return f.read()

    def logs(self):
        return log_tails(self.out, "pod*.log", tail=None)

    def wait_for_starts(self, attempt, count):
        wait_until(
            lambda: len(worker_starts(self.out, attempt)) >= count,
            EVENT_TIMEOUT_S,
            f"{count} workers of attempt {attempt}",
            on_timeout=self.logs,
        )
        return worker_starts(self.out, attempt)

    def wait_all(self, pods, code):
        for i in pods:
            try:
                self.assertEqual(self.pods[i].wait(EVENT_TIMEOUT_S), code, self.logs())
            except subprocess.TimeoutExpired:
                self.fail(f"pod {i}'s dlrun still runs:\n{self.logs()}")

    def delete_pod(self, i):
        """SIGTERM to the pod's dlrun, then, as the kubelet, SIGKILL to everything in the pod
        after the grace period; returns the seconds the dlrun took to exit."""
        start = time.monotonic()
        self.pods[i].send_signal(signal.SIGTERM)
        try:
            self.pods[i].wait(POD_GRACE_S)
        except subprocess.TimeoutExpired:
            self.hosts.kill_host(i)
            self.fail(f"pod {i}'s dlrun outlived the grace period:\n{self.logs()}")
        return time.monotonic() - start

    def test_trainer_v2_pods_wait_for_late_names_train_and_stop_on_a_deletion(self):
        def env_of(i):
            return {
                "PET_NNODES": str(PODS),
                "PET_NPROC_PER_NODE": "2",
                "PET_NODE_RANK": str(i),
                "PET_MASTER_ADDR": "job-node-0-0.job",
                "PET_MASTER_PORT": "29500",
            }

        self.start_pods(env_of, ["--allreduce", *STUBBORN, os.path.join(self.out, "stubborn")])
        waiting = self.publish_names_once_awaited(
            "--master-addr",
            "job-node-0-0.job",
            {i: [f"job-node-0-{i}.job", f"job-node-0-{i}"] for i in range(PODS)},
        )
        starts = self.wait_for_starts(0, 2 * PODS)
        self.assertEqual(sorted(int(s["env"]["RANK"]) for s in starts), list(range(2 * PODS)))
        for s in starts:
            self.assertEqual(s["env"]["WORLD_SIZE"], str(2 * PODS))
            self.assertEqual(s["env"]["MASTER_ADDR"], self.hosts.address(0))
            self.assertEqual(s["sum"], sum(range(1, 2 * PODS + 1)))  # every rank's, over gloo
        for i in range(PODS):
            self.assertEqual(self.log(i).count(waiting), 1, self.log(i))
        wait_until(
            lambda: len(glob.glob(os.path.join(self.out, "stubborn.*"))) == 2 * PODS,
            EVENT_TIMEOUT_S,
            "every worker to ignore SIGTERM",
            on_timeout=lambda: f"{os.listdir(self.out)}\n{self.logs()}",
        )
        seconds = self.delete_pod(2)
        self.assertEqual(self.pods[2].returncode, 128 + signal.SIGTERM, self.logs())
        self.assertGreaterEqual(seconds, 25)  # the workers' 25 s, then SIGKILL
        self.assertLess(seconds, POD_GRACE_S)
        self.assertIn("did not stop within 25000 ms; sending SIGKILL", self.log(2))
        self.wait_all([0, 1], 128 + signal.SIGTERM)
        for i in (0, 1):
            self.assertIn("job stopped: SIGTERM on node", self.log(i))
        print(f"test_kubernetes_pods: the deleted pod's dlrun exited after {seconds:.1f} s")

    def test_pytorchjob_v1_static_workers_get_dlruns_ranks_and_a_deletion_stops_the_job(self):
        def env_of(i):
            return {
                "MASTER_ADDR": "job-master-0",
                "MASTER_PORT": "23456",
                "WORLD_SIZE": str(2 * PODS),
                "RANK": str(i),
                "PYTHONUNBUFFERED": "0",
                "PET_NNODES": str(PODS),
                "PET_NODE_RANK": str(i),
                "PET_NPROC_PER_NODE": "2",
                "PET_MASTER_ADDR": "job-master-0",
                "PET_MASTER_PORT": "23456",
            }

        self.start_pods(env_of, ["--allreduce", "--until-file", self.stop_file])
        self.publish_names_once_awaited(
            "--master-addr",
            "job-master-0",
            {0: ["job-master-0"], 1: ["job-worker-0"], 2: ["job-worker-1"]},
        )
        starts = self.wait_for_starts(0, 2 * PODS)
        by_pod_rank = sorted((int(s["env"]["GROUP_RANK"]), int(s["env"]["RANK"])) for s in starts)
        self.assertEqual(by_pod_rank, [(i // 2, i) for i in range(2 * PODS)], self.logs())
        self.assertEqual({s["env"]["WORLD_SIZE"] for s in starts}, {str(2 * PODS)})
        self.assertEqual({s["sum"] for s in starts}, {sum(range(1, 2 * PODS + 1))})
        # The worker pod 1 deleted (its workers heed SIGTERM): the whole job stops, 143.
        self.assertLess(self.delete_pod(1), POD_GRACE_S)
        self.wait_all(range(PODS), 128 + signal.SIGTERM)
        for i in range(PODS):
            self.assertIn("job stopped: SIGTERM on node node1", self.log(i))

    def test_pytorchjob_v1_elastic_pod_deleted_leaves_and_the_others_go_on(self):
        def env_of(i):
            return {
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ENDPOINT": "job-worker-0:23456",
                "PET_NNODES": f"2:{PODS}",
                "PET_NPROC_PER_NODE": "1",
                "PET_MAX_RESTARTS": "3",
                "PYTHONUNBUFFERED": "0",
            }

        self.start_pods(env_of, ["--allreduce", "--until-file", self.stop_file])
        self.publish_names_once_awaited(
            "--rdzv-endpoint host", "job-worker-0", {i: [f"job-worker-{i}"] for i in range(PODS)}
        )
        self.wait_for_starts(0, PODS)
        seconds = self.delete_pod(2)
        start = time.monotonic()
        starts = self.wait_for_starts(1, 2)
        recovered = time.monotonic() - start
        self.assertEqual(sorted(int(s["env"]["RANK"]) for s in starts), [0, 1])
        self.assertEqual({s["env"]["WORLD_SIZE"] for s in starts}, {"2"})
        self.assertEqual({s["sum"] for s in starts}, {1 + 2})  # the 2 left all-reduce
        for i in (0, 1):
            self.assertIn("re-rendezvous: node node2", self.log(i))
            self.assertIn("left the job", self.log(i))
            self.assertNotIn("worker group failed", self.log(i))  # no failure restart used
        with open(self.stop_file, "w"):
            pass
        self.wait_all([0, 1], 0)
        print(
            f"test_kubernetes_pods: the deleted pod's dlrun exited after {seconds:.1f} s "
            f"(code {self.pods[2].returncode}); the others met again in {recovered:.1f} s"
        )

    def test_a_store_whose_pod_is_replaced_is_followed_under_its_name(self):
        """dlrund behind the name store-0 (a headless service): its pod is replaced (SIGKILL,
        a new dlrund in another pod, the name now that pod's address). The agents dial the store
        by its name, so they reach the new one, find their round gone, say so, and meet again:
        one restart, then the job ends with exit 0."""
        self.publish_names({2: ["store-0"]})
        daemon = self.start_dlrund(2)

        def env_of(i):
            return {
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ENDPOINT": "store-0:29400",
                "PET_NNODES": "2",
                "PET_NPROC_PER_NODE": "1",
                "PET_MAX_RESTARTS": "3",
            }

        self.start_pods(env_of, ["--until-file", self.stop_file], pods=[0, 1])
        self.wait_for_starts(0, 2)
        daemon.kill()
        daemon.wait()
        self.move_name("store-0", 0)
        self.start_dlrund(0)
        again = self.wait_for_starts(1, 2)
        self.assertEqual(sorted(int(s["env"]["RANK"]) for s in again), [0, 1])
        with open(self.stop_file, "w"):
            pass
        self.wait_all([0, 1], 0)
        for i in (0, 1):
            self.assertIn("came back without round 0 (it restarted and lost its keys)", self.log(i))


if __name__ == "__main__":
    main()
