"""Stopping a multi-node job on purpose, waiting out loud, and the wrong server at the endpoint.

Several dlrun agents on loopback form one job (the first agent, started alone, serves the store;
each agent has its own 127.0.0.x address, so messages can name nodes apart):
- SIGINT or SIGTERM to any one node stops every node within 2 s: each exits 128 + signal and
  prints the same line, "job stopped: SIGINT on node NAME"; no worker is left.
- --rdzv-conf stop_policy=node: a stopped node leaves an elastic job above its minimum; the
  others go on in a new round of their own, with no failure restart counted.
- A job below its minimum says what it waits for, and when its join timeout ends the wait, it
  names the nodes that did not come back.
- An HTTP server, a silent listener or an echo server at --rdzv-endpoint: one line naming it,
  exit 2, within 5 s.
"""

import http.server
import os
import signal
import socket
import socketserver
import threading
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

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 60
STOP_LIMIT_S = 2.0  # a stop reaches every node within this
WRONG_SERVER_LIMIT_S = 5.0


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class StopTest(unittest.TestCase):
    def start_job(self, count, nnodes, worker_args=("--wait",), conf=()):
        """Starts `count` agents, agent 0 alone first so it serves the store; agent i is node
        127.0.0.(i+1). Returns the agents once every one's worker has started."""
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)
        port = free_port()
        conf = ",".join(["last_call_timeout=0.5", *conf])
        args = [
            f"--nnodes={nnodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=stop{port}",
            f"--rdzv-conf={conf}",
        ]
        tail = [PYTHON, WORKER, self.out, *worker_args]

        def agent(i):
            return Dlrun(self, [*args, f"--local-addr=127.0.0.{i + 1}", *tail], env=clean_env())

        agents = [agent(0)]
        wait_until(
            lambda: port_open(port),
            JOB_TIMEOUT_S,
            "the first agent to serve the store",
            proc=agents[0].proc,
            on_timeout=agents[0].describe,
        )
        agents += [agent(i) for i in range(1, count)]
        self.wait_for_starts(count, agents)
        return agents

    def starts(self):
        return [
            read_json(os.path.join(self.out, name))
            for name in os.listdir(self.out)
            if name.startswith("start_") and name.endswith(".json")
        ]

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

    def assert_job_stopped_everywhere(self, agents, victim, sig):
        stopped_at = time.monotonic()
        agents[victim].signal(sig)
        results = [a.wait(JOB_TIMEOUT_S) for a in agents]
        elapsed = time.monotonic() - stopped_at
        self.assertLess(elapsed, STOP_LIMIT_S, "\n".join(map(repr, results)))
        lines = set()
        for r in results:
            self.assertEqual(r.returncode, 128 + sig, r)
            stopped = [line for line in r.dlrun_lines() if "job stopped:" in line]
            self.assertEqual(len(stopped), 1, r)
            lines.add(stopped[0])
        name = signal.Signals(sig).name
        self.assertEqual(len(lines), 1, lines)  # the same line on every node
        self.assertRegex(lines.pop(), rf"^dlrun: job stopped: {name} on node \S+")
        for s in self.starts():
            self.assertFalse(is_running(s["pid"]), f"worker {s['pid']} is still running")

    def test_sigint_to_one_node_stops_every_node(self):
        self.assert_job_stopped_everywhere(self.start_job(3, "3"), 2, signal.SIGINT)

    def test_sigint_to_the_node_serving_the_store_stops_every_node(self):
        self.assert_job_stopped_everywhere(self.start_job(3, "3"), 0, signal.SIGINT)

    def test_sigterm_to_one_node_stops_every_node(self):
        self.assert_job_stopped_everywhere(self.start_job(3, "3"), 1, signal.SIGTERM)

    def test_a_signal_to_the_store_host_waits_until_the_others_hang_up(self):
        # The node serving the store has ended its part of the job while another node is still
        # connected (here: this test's connection). A SIGTERM now, as scancel's reaches nodes at
        # different times, must not take the store from that node: the host exits with the
        # job's code once the connection closes, not killed by the signal.
        out = temp_dir(self)
        done = os.path.join(out, "done")
        port = free_port()
        host = Dlrun(
            self,
            [
                "--nnodes=1:2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=linger{port}",
                "--rdzv-conf=last_call_timeout=0.1",
                PYTHON,
                WORKER,
                out,
                "--until-file",
                done,
            ],
            env=clean_env(DLRUN_LOG_LEVEL="debug"),
        )
        self.addCleanup(kill_recorded_workers, out)
        wait_until(
            lambda: port_open(port),
            JOB_TIMEOUT_S,
            "the agent to serve the store",
            proc=host.proc,
            on_timeout=host.describe,
        )
        other = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(other.close)
        open(done, "w").close()  # the worker ends: the job succeeds
        wait_until(
            lambda: "connections to the store to close" in host.output()[1],
            JOB_TIMEOUT_S,
            "the agent to wait for the store's connections",
            proc=host.proc,
            on_timeout=host.describe,
        )
        host.signal(signal.SIGTERM)
        other.close()
        result = host.wait(JOB_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)

    def test_with_stop_policy_node_the_others_go_on_without_it(self):
        done = os.path.join(temp_dir(self), "done")
        agents = self.start_job(3, "2:3", ["--until-file", done], conf=["stop_policy=node"])
        agents[2].signal(signal.SIGINT)
        left = agents[2].wait(JOB_TIMEOUT_S)
        self.assertEqual(left.returncode, 130, left)
        self.assertFalse([line for line in left.dlrun_lines() if "job stopped" in line], left)
        # The two others meet in a new round of two, with no failure counted.
        again = self.wait_for_starts(2, agents[:2], attempt=1)
        self.assertEqual(sorted(s["env"]["WORLD_SIZE"] for s in again), ["2", "2"])
        open(done, "w").close()
        for r in [a.wait(JOB_TIMEOUT_S) for a in agents[:2]]:
            self.assertEqual(r.returncode, 0, r)
            self.assertTrue(
                any("127.0.0.3" in line and "left" in line for line in r.dlrun_lines()), r
            )
            self.assertFalse(any("restarting" in line for line in r.dlrun_lines()), r)

    def test_a_job_below_its_minimum_says_what_it_waits_for_and_whom_it_missed(self):
        agents = self.start_job(3, "3", conf=["join_timeout=3"])
        agents[2].kill()  # a node lost, not stopped: the others wait for it to come back
        results = [a.wait(JOB_TIMEOUT_S) for a in agents[:2]]
        codes = {r.returncode for r in results}
        self.assertEqual(len(codes), 1, results)  # one reason, one code
        self.assertNotEqual(codes.pop(), 0, results)
        for r in results:
            lines = r.dlrun_lines()
            self.assertTrue(
                any(
                    "waiting for 1 more node(s): 2 of 3 joined, giving up in" in line
                    for line in lines
                ),
                r,
            )
            missed = [line for line in lines if "did not come" in line]
            self.assertEqual(len(missed), 1, r)
            self.assertIn("127.0.0.3", missed[0])


class SilentHandler(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.recv(65536)
        self.server.quiet.wait(30)  # holds the connection open, says nothing


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


class WrongServerTest(unittest.TestCase):
    def serve(self, server):
        server.daemon_threads = True
        server.quiet = threading.Event()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def stop():
            server.quiet.set()
            server.shutdown()
            server.server_close()
            thread.join()

        self.addCleanup(stop)
        return server.server_address[1]

    def assert_named_at_once(self, port, words):
        started = time.monotonic()
        result = Dlrun(
            self,
            [
                "--nnodes=2",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=wrong",
                PYTHON,
                "-c",
                "pass",
            ],
        ).wait(JOB_TIMEOUT_S)
        self.assertLess(time.monotonic() - started, WRONG_SERVER_LIMIT_S, result)
        self.assertEqual(result.returncode, 2, result)
        lines = result.dlrun_lines()
        self.assertEqual(len(lines), 1, result)
        self.assertIn(f"127.0.0.1:{port}", lines[0])
        for word in words:
            self.assertIn(word, lines[0])

    def test_an_http_server_is_named(self):
        port = self.serve(
            http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        )
        self.assert_named_at_once(port, ["not a dlrun store"])

    def test_a_silent_listener_is_named(self):
        port = self.serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), SilentHandler))
        self.assert_named_at_once(port, ["not a dlrun store", "sent nothing"])

    def test_an_echo_server_is_named_by_what_it_answered(self):
        port = self.serve(socketserver.ThreadingTCPServer(("127.0.0.1", 0), EchoHandler))
        self.assert_named_at_once(port, ["not a dlrun store", "answered"])


if __name__ == "__main__":
    main()
