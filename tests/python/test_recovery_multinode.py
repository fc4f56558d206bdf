"""A torch 2.13 job of two nodes comes back after a worker is killed, on each rendezvous backend.

The job is recovery_fixture's (a checkpointed DDP job over gloo, workers/recovery_train.py); a
worker of the second node is SIGKILLed mid-training in attempts 0, 1 and 2 under
--max-restarts=3, and the job must exit 0 on both nodes, having taken every step once
(RecoveryCase.assert_recovered). MASTER_PORT may differ from one attempt to the next.

- c10d through a dlrund on two simulated hosts (network namespaces; needs root): the agents and
  dlrund run inside the hosts, the victim's pid is killed from here (only the network is
  namespaced, so its pid is ours).
- etcd (one member on loopback, etcd_fixture) with two agents on 127.0.0.1 and 127.0.0.2.
- c10d through a dlrund on loopback with --store-proxy=on: the workers reach the store through
  their agent's proxy.
- Key isolation through dlrund: two agents on loopback, 11 attempts of workers/store_isolation.py
  (each but the last exits 1); no attempt reads an earlier attempt's key, num_keys() stays the
  same, and dlrund's own key count (its /api/state, --metrics-port; the agents' control plane
  off, whose event log is kept as keys) does not grow with attempts.

Runs under torch 2.13's interpreter (ctest: python_recovery_multinode) and as root.
"""

import re

from dlrun_fixture import PYTHON, temp_dir, worker
from dlrund_fixture import read_line, start_dlrund
from etcd_fixture import start_etcd
from launcher_fixture import RDZV_PORT, dlrund_in
from netns_fixture import Hosts, main
from recovery_fixture import MAX_RESTARTS, RecoveryCase, dlrun_argv, train_argv

START_TIMEOUT_S = 30
STORE_ISOLATION = worker("store_isolation.py")
RESTARTS = 10  # key isolation through dlrund: 11 attempts
ISOLATION_TIMEOUT_S = 150
METRICS_LINE = re.compile(r"dlrund serves metrics on http://([\d.]+:\d+)/metrics")


def two_nodes(backend, endpoint, run_id, nproc=1):
    """dlrun's flags for one of two nodes."""
    return [
        "--nnodes=2",
        f"--nproc-per-node={nproc}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--max-restarts={MAX_RESTARTS}",
    ]


class MultiNodeRecoveryTest(RecoveryCase):
    def test_c10d_through_dlrund_on_two_simulated_hosts(self):
        nproc = 2
        out = self.out_dir()
        with Hosts(2) as hosts:
            # Not among self.launchers: it runs on after the agents; only they must not exit.
            dlrund_in(self, hosts, self.env(), self.logs)
            flags = two_nodes("c10d", f"{hosts.address(0)}:{RDZV_PORT}", "recovery", nproc)
            agents = [
                self.launch(
                    f"dlrun{i}",
                    dlrun_argv(*flags, *train_argv(out, victim=2 * nproc - 1)),
                    self.env(GLOO_SOCKET_IFNAME="eth0"),
                    hosts=hosts,
                    host=i,
                )
                for i in range(2)
            ]
            self.run_killed_job(agents, out)
        done = self.assert_recovered(out, 2 * nproc)
        self.assertEqual({d["master"].rsplit(":", 1)[0] for d in done}, {hosts.address(0)})

    def test_etcd_two_nodes_on_loopback(self):
        etcd = start_etcd(self)
        out = self.out_dir()
        flags = two_nodes("etcd", etcd.endpoint, f"recovery{etcd.port}")
        agents = [
            self.launch(
                f"dlrun{i}",
                dlrun_argv(*flags, f"--local-addr={address}", *train_argv(out, victim=1)),
                self.env(),
            )
            for i, address in enumerate(["127.0.0.1", "127.0.0.2"])
        ]
        self.run_killed_job(agents, out)
        done = self.assert_recovered(out, 2)
        # Group rank 0 (127.0.0.1) serves the workers' store.
        self.assertEqual({d["master"].rsplit(":", 1)[0] for d in done}, {"127.0.0.1"})

    def test_store_proxy_through_dlrund_on_loopback(self):
        dlrund = start_dlrund(self)
        out = self.out_dir()
        flags = two_nodes("c10d", f"127.0.0.1:{dlrund.port}", "recovery-proxy")
        agents = [
            self.launch(
                f"dlrun{i}",
                dlrun_argv(*flags, "--store-proxy=on", *train_argv(out, victim=1)),
                self.env(),
            )
            for i in range(2)
        ]
        self.run_killed_job(agents, out)
        self.assert_recovered(out, 2)
        for agent in agents:
            self.assertIn("store proxy: this node's workers reach the store at", agent.output())


class DlrundKeyIsolationTest(RecoveryCase):
    def metrics_address(self, dlrund):
        """The HOST:PORT of dlrund's --metrics-port, from the lines after its first."""
        for _ in range(3):
            line = read_line(dlrund.proc.stdout, START_TIMEOUT_S).decode()
            match = METRICS_LINE.search(line)
            if match:
                return match.group(1)
        self.fail("dlrund printed no metrics address")

    def test_no_attempt_sees_an_earlier_attempts_keys_and_dlrunds_keys_stay_flat(self):
        dlrund = start_dlrund(self, "--metrics-port", "0")
        url = f"http://{self.metrics_address(dlrund)}/api/state"
        out = temp_dir(self)
        # No control plane: it keeps the job's events in the store (ctl/ev/N), a log that grows
        # by design.
        flags = [
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--rdzv-endpoint=127.0.0.1:{dlrund.port}",
            "--rdzv-id=isolation",
            f"--max-restarts={RESTARTS}",
            "--no-control-plane",
        ]
        agents = [
            self.launch(
                f"dlrun{i}",
                dlrun_argv(*flags, PYTHON, STORE_ISOLATION, out, str(RESTARTS), url),
                self.env(),
            )
            for i in range(2)
        ]
        codes = [agent.wait(ISOLATION_TIMEOUT_S) for agent in agents]
        records = self.isolation_records(out, RESTARTS, 2, max(codes))
        counts = [rs[0]["num_keys"] for rs in records.values()]
        self.assertEqual(set(counts), {counts[0]}, f"num_keys by attempt: {counts}")
        # dlrund also keeps the rendezvous' newest rounds (the first rounds hold fewer): the
        # later half of the attempts holds no more keys than the first half did.
        server = [rs[0]["server_keys"] for rs in records.values()]
        print(f"num_keys by attempt: {counts}; dlrund's keys: {server}")
        half = len(server) // 2
        self.assertLessEqual(
            max(server[half:]), max(server[1:half]), f"dlrund's keys by attempt: {server}"
        )


if __name__ == "__main__":
    main()
