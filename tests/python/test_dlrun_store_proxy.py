"""--store-proxy (issue 32): two agents on this host meet through a dlrund, and each node's
workers (dlrun-barrier-probe: one store barrier as torch's init_process_group does, through
MASTER_ADDR) reach the store through their agent's proxy. Every worker passes the barrier; the
store sees a few connections per agent instead of one per worker, and no worker's WAIT; with
the proxy off, one connection per worker. dlrund's own counts (--stats at exit) say so."""

import re
import signal
import subprocess
import unittest

from dlrun_fixture import binary_from_env, clean_env, die_with_parent, dlrun_binary, main, temp_dir
from dlrund_fixture import start_dlrund, stop_process

PER_NODE = 32
RUN_TIMEOUT_S = 120


def barrier_probe():
    return binary_from_env("DLRUN_BARRIER_PROBE", "dlrun-barrier-probe")


class StoreProxyTest(unittest.TestCase):
    def run_job(self, proxy):
        """Two agents of PER_NODE workers each through one dlrund; returns (the agents' outputs,
        dlrund's counts at exit)."""
        dlrund = start_dlrund(self, "--stats")
        agents = []
        for _ in range(2):
            agents.append(
                subprocess.Popen(
                    [
                        dlrun_binary(),
                        "--nnodes=2",
                        f"--nproc-per-node={PER_NODE}",
                        f"--rdzv-endpoint=127.0.0.1:{dlrund.port}",
                        f"--rdzv-id=proxy-{proxy}",
                        f"--store-proxy={proxy}",
                        "--no-control-plane",
                        barrier_probe(),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=clean_env(),
                    cwd=temp_dir(self),
                    preexec_fn=die_with_parent,
                )
            )
            self.addCleanup(stop_process, agents[-1])
        outputs = []
        for agent in agents:
            out, _ = agent.communicate(timeout=RUN_TIMEOUT_S)
            self.assertEqual(agent.returncode, 0, out)
            outputs.append(out)
        dlrund.proc.send_signal(signal.SIGTERM)
        stats = dlrund.proc.stdout.read().decode()
        self.assertEqual(dlrund.stop(), 0)
        line = next(s for s in stats.splitlines() if s.startswith("dlrund stats:"))
        return outputs, {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}

    def test_workers_reach_the_store_through_their_agents_proxy(self):
        outputs, counts = self.run_job("on")
        for out in outputs:
            self.assertRegex(
                out,
                r"store proxy: this node's workers reach the store at "
                r"127\.0\.0\.1:\d+ through 127\.0\.0\.1:\d+",
            )
        # Each agent: its rendezvous client, the proxy's shared connection and a few for
        # waits; never one per worker.
        self.assertLessEqual(counts["connections"], 2 * 8, counts)
        # The workers' WAITs came grouped (the agents' rendezvous WAITs a few times itself), and
        # their ADDs, arriving together, partly folded.
        self.assertGreaterEqual(counts.get("GROUP_WAIT", 0), 1, counts)
        self.assertLess(counts.get("WAIT", 0), PER_NODE // 4, counts)
        self.assertLess(counts.get("ADD", 0), 2 * PER_NODE, counts)

    def test_without_the_proxy_each_worker_connects_itself(self):
        outputs, counts = self.run_job("off")
        for out in outputs:
            self.assertNotIn("store proxy", out)
        self.assertGreaterEqual(counts["connections"], 2 * PER_NODE, counts)
        self.assertGreaterEqual(counts.get("WAIT", 0), 2 * PER_NODE, counts)
        self.assertEqual(counts.get("GROUP_WAIT", 0), 0, counts)


# A worker that connects to its store from 127.0.0.2 (no address of the allowed list) and
# from 127.0.0.1 (loopback, always allowed), and says what became of each.
ADMISSION_WORKER = """
import os, socket, sys
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
def fate(source):
    s = socket.create_connection(addr, timeout=10, source_address=(source, 0))
    try:
        s.sendall(b"\\x00\\xce\\xf7\\x85\\x3c\\x07")  # VALIDATE, then GETNUMKEYS
        data = s.recv(8)
    except ConnectionResetError:
        data = b""
    return "served" if len(data) == 8 else "closed"
print(fate("127.0.0.2"), fate("127.0.0.1"), flush=True)
"""


class StoreAllowTest(unittest.TestCase):
    def test_a_host_outside_the_list_is_refused(self):
        # The agent's store whatever the machine's torch (Debian 13's, without libuv, would
        # have rank 0 serve the store): the worker is no torch program.
        result = subprocess.run(
            [
                dlrun_binary(),
                "--standalone",
                "--store-allow=10.9.9.0/24",
                "--no-control-plane",
                "--worker-store=agent",
                "/usr/bin/python3",
                "-c",
                ADMISSION_WORKER,
            ],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=RUN_TIMEOUT_S,
            preexec_fn=die_with_parent,
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertIn("[0]:closed served", result.stdout, result)
        self.assertIn("refused a connection from 127.0.0.2", result.stderr, result)

    def test_a_bad_list_is_one_line(self):
        result = subprocess.run(
            [dlrun_binary(), "--store-allow=10.9.9.0/99", "/bin/true"],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=10,
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.stderr.splitlines()), 1, result)
        self.assertIn("--store-allow", result.stderr)


if __name__ == "__main__":
    main()
