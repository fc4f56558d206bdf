"""Starts and stops a dlrund subprocess for the Python integration tests.

The binary comes from the DLRUND environment variable (ctest sets it). Only loopback is used.
"""

import ctypes
import faulthandler
import os
import re
import selectors
import signal
import subprocess
import time
import unittest

STARTUP_TIMEOUT_S = 10
STOP_TIMEOUT_S = 5
HANG_LIMIT_S = 90  # under ctest's TIMEOUT of 120, so a hang reports where it hung
LISTENING_LINE = re.compile(rb"dlrund listening on (127\.0\.0\.1):(\d+)\n")


def dlrund_binary():
    path = os.environ.get("DLRUND")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(f"DLRUND must name the dlrund executable (got {path!r})")
    return path


def main():
    """unittest.main for a test file; exits with every thread's stack if the file hangs."""
    # torch 1.13's client waits forever for some replies (add), so a silent server would hang.
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    unittest.main(module="__main__")


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """Popen preexec_fn: the child is killed if the test process dies without cleaning up."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def read_line(stream, timeout):
    """Reads one line from an unbuffered pipe, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise TimeoutError(f"no complete line within {timeout}s (got {data!r})")
            chunk = os.read(stream.fileno(), 1)  # one byte at a time: never read past the line
            if not chunk:
                raise EOFError(f"stream closed before a complete line (got {data!r})")
            data += chunk
    return data


def stop_process(proc, sig=signal.SIGTERM):
    """Signals `proc` by PID and reaps it, killing it if it outlives STOP_TIMEOUT_S."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()
    return proc.returncode


class Dlrund:
    """A running dlrund on 127.0.0.1 with a kernel-chosen port (or `port`); `binary` defaults
    to dlrund_binary()."""

    def __init__(self, *extra_args, binary=None, port=0):
        # stderr is inherited so the daemon's diagnostics show up in ctest's output.
        self.proc = subprocess.Popen(
            [binary or dlrund_binary(), "--host", "127.0.0.1", "--port", str(port), *extra_args],
            stdout=subprocess.PIPE,
            bufsize=0,
            preexec_fn=die_with_parent,
        )
        try:
            self.first_line = read_line(self.proc.stdout, STARTUP_TIMEOUT_S)
            match = LISTENING_LINE.fullmatch(self.first_line)
            if not match:
                raise RuntimeError(f"unexpected first line from dlrund: {self.first_line!r}")
        except BaseException:
            self.stop()
            raise
        self.host = match.group(1).decode()
        self.port = int(match.group(2))

    @property
    def pid(self):
        return self.proc.pid

    def stop(self, sig=signal.SIGTERM):
        return stop_process(self.proc, sig)


def start_dlrund(test: unittest.TestCase, *extra_args) -> Dlrund:
    """Starts dlrund and registers its stop as a cleanup, so it dies even when the test fails."""
    daemon = Dlrund(*extra_args)
    test.addCleanup(daemon.stop)
    return daemon
