"""dlrund as a user sees it: its first line, signals, --help/--version and bad input."""
import signal
import socket
import struct
import subprocess
import time
import unittest

from dlrund_fixture import dlrund_binary, main, start_dlrund

# TCPStore V1 (torch 1.x) op codes, spoken raw here so no torch import is needed.
GETNUMKEYS = 6
WAIT = 5


def run_dlrund(*args):
    return subprocess.run([dlrund_binary(), *args], capture_output=True, text=True, timeout=10)


def connect(daemon):
    """A connected client that the server has demonstrably accepted (one round trip)."""
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
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
        self.assertEqual(daemon.first_line.decode(),
                         f"dlrund listening on 127.0.0.1:{daemon.port}\n")
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

    def test_help_mentions_every_flag(self):
        result = run_dlrund("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        for flag in ("--host", "--port", "--max-key-bytes", "--max-value-bytes",
                     "--max-keys-per-op", "--max-buffered-bytes", "--version"):
            self.assertIn(flag, result.stdout)

    def test_version(self):
        result = run_dlrund("--version")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"^dlrund \S+\n$")

    def test_bad_input_exits_2_with_one_line(self):
        cases = {("--port", "abc"): ["--port", "abc"],
                 ("--port", "70000"): ["--port", "70000"],
                 ("--bogus",): ["--bogus"],
                 ("--max-key-bytes", "0"): ["--max-key-bytes"]}
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
