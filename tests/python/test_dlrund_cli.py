"""dlrund as a user sees it: its first line, signals, --stats, --help/--version and bad input."""

import re
import signal
import socket
import struct
import subprocess
import time
import unittest

from dlrund_fixture import STOP_TIMEOUT_S, dlrund_binary, main, read_line, start_dlrund

# TCPStore V1 (torch 1.x) op codes, spoken raw here so no torch import is needed.
GETNUMKEYS = 6
WAIT = 5


def run_dlrund(*args):
    return subprocess.run([dlrund_binary(), *args], capture_output=True, text=True, timeout=10)


def connect(daemon, source=None):
    """A connected client that the server has demonstrably accepted (one round trip), from
    the numeric address `source` when given (all of 127/8 is loopback on Linux)."""
    sock = socket.create_connection(
        ("127.0.0.1", daemon.port), timeout=5, source_address=(source, 0) if source else None
    )
    sock.sendall(bytes([GETNUMKEYS]))
    reply = b""
    while len(reply) < 8:
        chunk = sock.recv(8 - len(reply))
        if not chunk:
            raise EOFError("dlrund closed the connection instead of answering GETNUMKEYS")
        reply += chunk
    return sock, struct.unpack("<q", reply)[0]


class DlrundCliTest(unittest.TestCase):
    def test_first_line_and_port_accepts_connections(self):
        daemon = start_dlrund(self)
        self.assertTrue(0 < daemon.port < 65536)
        self.assertEqual(
            daemon.first_line.decode(), f"dlrund listening on 127.0.0.1:{daemon.port}\n"
        )
        sock, num_keys = connect(daemon)
        self.addCleanup(sock.close)
        self.assertEqual(num_keys, 0)

    def test_signals_stop_promptly_with_clients_connected(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                daemon = start_dlrund(self)
                idle, _ = connect(daemon)
                self.addCleanup(idle.close)
                waiting, _ = connect(daemon)
                self.addCleanup(waiting.close)
                key = b"never"
                waiting.sendall(struct.pack("<BQQ", WAIT, 1, len(key)) + key)
                start = time.monotonic()
                code = daemon.stop(sig)
                self.assertLess(time.monotonic() - start, 5)
                self.assertEqual(code, 0)

    def test_stats_on_sigusr1_and_at_exit(self):
        daemon = start_dlrund(self, "--stats", "--no-control")

        def stats_line():
            """The counts of the next stats line; its time must be now (wall clock)."""
            line = read_line(daemon.proc.stdout, STOP_TIMEOUT_S).decode()
            match = re.fullmatch(r"dlrund stats: time=(\d+\.\d{6}) (.*)\n", line)
            self.assertTrue(match, line)
            self.assertLess(abs(float(match.group(1)) - time.time()), 60, line)
            return match.group(2)

        daemon.proc.send_signal(signal.SIGUSR1)
        self.assertEqual(stats_line(), "connections=0 foreign=0 requests=0")
        sock, _ = connect(daemon)  # one GETNUMKEYS, answered
        sock.close()
        daemon.proc.send_signal(signal.SIGUSR1)
        self.assertEqual(stats_line(), "connections=1 foreign=0 requests=1 GETNUMKEYS=1")
        self.assertIsNone(daemon.proc.poll(), "SIGUSR1 stopped dlrund")
        daemon.proc.send_signal(signal.SIGTERM)
        self.assertEqual(stats_line(), "connections=1 foreign=0 requests=1 GETNUMKEYS=1")
        # Not daemon.stop(): a second SIGTERM while it exits could find the default action.
        self.assertEqual(daemon.proc.wait(STOP_TIMEOUT_S), 0)

    def test_sigterm_right_after_sigusr1_still_stops_it(self):
        # A stats line already due when SIGTERM comes must not keep dlrund serving (it once
        # did, about one time in five with the control plane on).
        for attempt in range(20):
            with self.subTest(attempt=attempt):
                daemon = start_dlrund(self, "--stats")
                daemon.proc.send_signal(signal.SIGUSR1)
                daemon.proc.send_signal(signal.SIGTERM)
                try:
                    code = daemon.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    code = "still running"
                self.assertEqual(code, 0)

    def test_allow_serves_listed_addresses_and_closes_others_unread(self):
        daemon = start_dlrund(self, "--allow", "127.0.0.2, ::1", "--stats", "--no-control")
        stranger = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
        self.addCleanup(stranger.close)
        self.assertEqual(stranger.recv(1), b"")  # closed before it sent anything
        sock, num_keys = connect(daemon, source="127.0.0.2")
        self.addCleanup(sock.close)
        self.assertEqual(num_keys, 0)
        daemon.proc.send_signal(signal.SIGUSR1)
        line = read_line(daemon.proc.stdout, STOP_TIMEOUT_S).decode()
        self.assertRegex(line, r" connections=1 foreign=0 rejected=1 requests=1 GETNUMKEYS=1\n$")

    def test_help_mentions_every_flag(self):
        result = run_dlrund("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        for flag in (
            "--host",
            "--port",
            "--max-key-bytes",
            "--max-value-bytes",
            "--max-keys-per-op",
            "--max-buffered-bytes",
            "--allow",
            "--stats",
            "--version",
        ):
            self.assertIn(flag, result.stdout)

    def test_version(self):
        result = run_dlrund("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"^dlrund \S+ \(git ([0-9a-f]{12}(-dirty)?|unknown)\)\n$")

    def test_bad_input_exits_2_with_one_line(self):
        cases = {
            ("--port", "abc"): ["--port", "abc"],
            ("--port", "70000"): ["--port", "70000"],
            ("--bogus",): ["--bogus"],
            ("--max-key-bytes", "0"): ["--max-key-bytes"],
            ("--allow", "10.0.0.0/8,node1"): ["--allow", "'node1'"],
            ("--allow", "10.0.0.0/33"): ["--allow", "'10.0.0.0/33'"],
        }
        for args, mentions in cases.items():
            with self.subTest(args=args):
                result = run_dlrund(*args)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertEqual(result.stdout, "")
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                for word in mentions:
                    self.assertIn(word, lines[0])

    def test_port_in_use(self):
        first = start_dlrund(self)
        result = run_dlrund("--host", "127.0.0.1", "--port", str(first.port))
        self.assertNotEqual(result.returncode, 0)
        self.assertNotIn("listening", result.stdout)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(str(first.port), lines[0])
        self.assertIsNone(first.proc.poll(), "the first dlrund died")
        sock, _ = connect(first)
        sock.close()


if __name__ == "__main__":
    main()
