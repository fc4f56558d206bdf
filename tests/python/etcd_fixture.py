"""Starts one etcd member on loopback for the Python acceptance tests of the etcd backend.

Debian's /usr/bin/etcd (3.4) on two free ports with a data directory of the test's own; a test
that cannot find it fails rather than skips. start_etcd() returns once etcd answers a v3 read
(polled with a deadline, never a fixed sleep) and registers, in the test's cleanups, a SIGKILL
by PID and the wait for it, so etcd goes also when the test fails.
"""
import os
import signal
import socket
import subprocess
import time

from dlrun_fixture import POLL_S, die_with_parent, temp_dir

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
START_TIMEOUT_S = 20


def free_ports(count):
    """`count` distinct free loopback ports (held open together, so none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Etcd:
    def __init__(self, proc, client_port, log_path):
        self.proc = proc
        self.port = client_port
        self.endpoint = f"127.0.0.1:{client_port}"
        self.log_path = log_path

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def keys(self, prefix):
        """The keys under `prefix`, read with etcdctl."""
        result = subprocess.run(
            [ETCDCTL, f"--endpoints={self.endpoint}", "--dial-timeout=2s",
             "--command-timeout=5s", "get", "--prefix", "--keys-only", prefix],
            env={**os.environ, "ETCDCTL_API": "3"}, capture_output=True, text=True,
            timeout=15, check=True)
        return [line for line in result.stdout.splitlines() if line]

    def answers(self):
        """One v3 read through etcdctl, bounded by its own timeouts."""
        try:
            result = subprocess.run(
                [ETCDCTL, f"--endpoints={self.endpoint}", "--dial-timeout=1s",
                 "--command-timeout=1s", "endpoint", "health"],
                env={**os.environ, "ETCDCTL_API": "3"}, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


def start_etcd(test):
    """Starts etcd for `test`; returns an Etcd that answers. Fails the test if it cannot."""
    for path in (ETCD, ETCDCTL):
        if not os.access(path, os.X_OK):
            test.fail(f"{path} is missing: the etcd tests need Debian's etcd-server and "
                      "etcd-client packages")
    directory = temp_dir(test)
    client, peer = free_ports(2)
    log_path = os.path.join(directory, "etcd.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [ETCD, "--name=default", f"--data-dir={directory}/data",
             f"--listen-client-urls=http://127.0.0.1:{client}",
             f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=default=http://127.0.0.1:{peer}",
             f"--initial-cluster-token=dlrun-py-{os.getpid()}-{client}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent)
    etcd = Etcd(proc, client, log_path)
    test.addCleanup(etcd.stop)  # runs before temp_dir's cleanup: etcd stops, then its files go
    deadline = time.monotonic() + START_TIMEOUT_S
    while not etcd.answers():
        if proc.poll() is not None:
            test.fail(f"etcd exited with {proc.returncode} before it answered\n{etcd.log()}")
        if time.monotonic() >= deadline:
            test.fail(f"etcd did not answer within {START_TIMEOUT_S}s\n{etcd.log()}")
        time.sleep(POLL_S)
    return etcd
