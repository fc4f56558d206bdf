"""Acceptance 4 of issue 15: bad input to --metrics-port.

A port in use, or a value that is no port, is one line and exit 2 (dlrun and dlrund). An HTTP
client that sends garbage, or never finishes its request, does not stall the metrics, the page
or the store for anyone else.
"""

import re
import socket
import subprocess
import time
import unittest

from dlrun_fixture import PYTHON, Dlrun, clean_env, main, run_dlrun
from dlrund_fixture import dlrund_binary, read_line, start_dlrund
from metrics_fixture import http_get, metrics_port

DLRUND_METRICS = re.compile(rb"dlrund serves metrics on http://[^ ]*:(\d+)/metrics")
ANSWER_S = 2  # what a scrape may take while the bad clients are connected


def taken_port(test):
    """A port some other socket listens on, until the test ends."""
    holder = socket.socket()
    test.addCleanup(holder.close)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder.getsockname()[1]


class BadInputTest(unittest.TestCase):
    def test_dlrun_metrics_port_in_use_is_one_line_and_exit_2(self):
        port = taken_port(self)
        result = run_dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=1",
                f"--metrics-port={port}",
                "--metrics-host=127.0.0.1",
                PYTHON,
                "-c",
                "pass",
            ],
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.dlrun_lines()), 1, result)
        self.assertIn(f"--metrics-port {port}", result.dlrun_lines()[0])
        self.assertIn("in use", result.dlrun_lines()[0])

    def test_dlrun_metrics_port_that_is_no_port_is_exit_2(self):
        for value in ("70000", "http"):
            result = run_dlrun(
                self, ["--standalone", f"--metrics-port={value}", PYTHON, "-c", "pass"]
            )
            self.assertEqual(result.returncode, 2, result)
            self.assertEqual(len(result.stderr.strip().splitlines()), 1, result)
            self.assertIn("--metrics-port", result.stderr)

    def test_dlrund_metrics_port_in_use_is_one_line_and_exit_2(self):
        port = taken_port(self)
        result = subprocess.run(
            [
                dlrund_binary(),
                "--host=127.0.0.1",
                "--port=0",
                f"--metrics-port={port}",
                "--metrics-host=127.0.0.1",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result)
        self.assertRegex(result.stderr, rf"^dlrund: error: --metrics-port {port}: .*in use")

    def bad_clients(self, port):
        """One client that sends garbage (closed on it) and one that never finishes its
        request."""
        garbage = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(garbage.close)
        garbage.sendall(b"\x00\xff GARBAGE \r\n\r\n" * 100)
        slow = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(slow.close)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        garbage.settimeout(5)
        self.assertEqual(garbage.recv(4096), b"")  # answered by a close, not a hang

    def assert_answers_quickly(self, port, path):
        started = time.monotonic()
        status, _, body = http_get(port, path, timeout=ANSWER_S)
        self.assertEqual(status, 200)
        self.assertLess(time.monotonic() - started, ANSWER_S)
        return body

    def test_garbage_and_unfinished_requests_do_not_stall_dlrund(self):
        daemon = start_dlrund(self, "--metrics-port", "0")
        lines = [read_line(daemon.proc.stdout, 10) for _ in range(2)]
        port = int(DLRUND_METRICS.match(lines[-1]).group(1))
        self.bad_clients(port)
        self.assertIn("dlrun_store_keys", self.assert_answers_quickly(port, "/metrics"))
        self.assertIn("<html", self.assert_answers_quickly(port, "/"))
        # The store on its own port still answers: a TCPStore 1.x SET then GET.
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as store:
            key, value = b"k", b"v"
            store.sendall(
                bytes([0])
                + len(key).to_bytes(8, "little")
                + key
                + len(value).to_bytes(8, "little")
                + value
            )
            store.sendall(bytes([2]) + len(key).to_bytes(8, "little") + key)
            reply = b""
            while len(reply) < 9:
                reply += store.recv(64)
            self.assertEqual(reply, len(value).to_bytes(8, "little") + value)

    def test_garbage_and_unfinished_requests_do_not_stall_the_agent(self):
        launcher = Dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=1",
                "--metrics-port=0",
                PYTHON,
                "-c",
                "import time; time.sleep(60)",
            ],
            env=clean_env(),
        )
        port = metrics_port(launcher)
        self.bad_clients(port)
        self.assertIn("dlrun_workers_up", self.assert_answers_quickly(port, "/metrics"))
        self.assertIn('"kind":"agent"', self.assert_answers_quickly(port, "/api/state"))
        self.assertEqual(http_get(port, "/api/state")[0], 200)


if __name__ == "__main__":
    main()
