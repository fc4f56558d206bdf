"""In-process recovery (issue 55) across hosts: two simulated hosts (network namespaces; needs
root) of 2 workers each, through a dlrund, and a third agent waiting as a spare. A worker
SIGKILLed on one host (rank 3, at step 9) is replaced there; every other worker on both hosts
keeps its process, the spare stays a spare, each rank takes every step once, the weights are,
bit for bit, those of the fault-free run (made on one node: the same ranks, data and sums), and
all three agents exit 0.

Runs under torch 2.13's interpreter (ctest: python_inprocess_recovery_hosts) and as root.
"""
import os

from dlrun_fixture import PYTHON, binary_from_env, clean_env, read_json, temp_dir, wait_until
from netns_fixture import Hosts, main
from test_inprocess_recovery import STEPS, TIMEOUT_S, TRAIN, WORLD, InProcessCase
from test_torch2_elastic import Launcher

RDZV_PORT = 29400


class Output:
    """What check_recovered reads of a run: the agents' output together."""

    def __init__(self, launchers):
        self.stderr = "".join(one.describe() for one in launchers)

    def __repr__(self):
        return self.stderr[-6000:]


class TwoHostsWithASpareTest(InProcessCase):
    def test_a_killed_worker_is_replaced_on_its_host_and_the_spare_stays_a_spare(self):
        self.reference()
        out, logs = temp_dir(self), temp_dir(self)
        env = clean_env(PYTHON_EXEC=PYTHON, TMPDIR=logs, GLOO_SOCKET_IFNAME="eth0")
        with Hosts(4) as hosts:
            dlrund = Launcher(self, "dlrund", [binary_from_env("DLRUND", "dlrund"), "--host",
                                               "0.0.0.0", "--port", str(RDZV_PORT)], env, logs,
                              hosts=hosts, host=0)
            wait_until(lambda: "dlrund listening on" in dlrund.output(), 30, "dlrund to listen",
                       proc=dlrund.proc, on_timeout=dlrund.describe)
            flags = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint={hosts.address(0)}:{RDZV_PORT}", "--rdzv-id=inproc",
                     "--max-restarts=3", "--recovery=in-process"]
            # All three at once: the round closes as the second arrives (--nnodes=2), and the
            # third waits as a spare.
            agents = [Launcher(self, f"dlrun{host}", [binary_from_env("DLRUN", "dlrun"), *flags,
                                                      PYTHON, TRAIN, out, str(STEPS), "3:9"],
                               env, logs, hosts=hosts, host=host) for host in (1, 2, 3)]
            codes = [agent.wait(TIMEOUT_S) for agent in agents]
        result = Output(agents)
        self.assertEqual(codes, [0, 0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.check_recovered(out, finals, result, victim=3)
        spares = [one.name for one in agents if "waiting as a spare" in one.output()]
        self.assertEqual(len(spares), 1, result)


if __name__ == "__main__":
    main()
