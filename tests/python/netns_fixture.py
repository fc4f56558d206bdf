"""Several simulated hosts on one machine for multi-node tests: scripts/netns.sh, from Python.

    with Hosts(3) as hosts:                      # node0 (also "head"), node1, node2
        server = hosts.popen(0, [PYTHON, "server.py"], stdout=subprocess.PIPE)
        result = hosts.run(1, [PYTHON, "client.py", hosts.address(0)], timeout=10)
        hosts.kill_host(2)                       # a crashed node: SIGKILL all inside it
        hosts.link(1, up=False)                  # a silent node: its traffic times out

Host i is the network namespace <prefix>-i with address 10.77.0.(10+i) (address(i)) and
hostname node<i> (hostname(i)); /etc/hosts inside it names every host of the set. The prefix is
unique to this process (t<pid>n<k>), so the sets of tests that ctest runs in parallel never
meet: each set has its own switch, and its 10.77.0.x addresses exist only inside its own
namespaces.

Cleanup: the set is taken down (every process in it SIGKILLed, the namespaces and their
/etc/netns files removed) when the `with` block ends, also by an exception, when the test
process gets SIGTERM or SIGINT (the handler takes every live set down, then lets the signal do
what it did before), and at interpreter exit (atexit). The processes started with popen() are
also killed by PID, and die with the test process (PR_SET_PDEATHSIG) if it is SIGKILLed. A set
left behind by a test process that was SIGKILLed is removed by the next Hosts() of any test
(reap_stale: sets whose owner PID no longer runs).

The guard: nothing in the root network namespace may connect to a 10.77.0.x address -- there it
has no route but the default one, toward the real network. Importing this module wraps
socket.connect and socket.connect_ex of the importing process so that such a connect raises
OutsideNamespaceError unless the process runs inside one of the namespaces in /run/netns. Helper
scripts that run inside hosts import this module too, so they get the same check (and pass it).
This fixture itself never connects to anything; a test reaches a host only through processes
started inside a host (popen, run).
"""

import atexit
import faulthandler
import ipaddress
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

from dlrun_fixture import HANG_LIMIT_S, POLL_S, die_with_parent, is_running

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS_SH = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "netns.sh"))
SUBNET = ipaddress.ip_network("10.77.0.0/24")
FIRST_HOST = 10  # host i is 10.77.0.(FIRST_HOST + i)
SCRIPT_TIMEOUT_S = 30  # the longest one netns.sh call may take (kill waits up to 10 s)
KILL_TIMEOUT_S = 10  # the longest a process started here may take to die of SIGKILL
PREFIX_RE = re.compile(r"^t(\d+)n(\d+)$")  # the prefixes this fixture makes: t<pid>n<k>
CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_live = []  # the sets that are up, for the signal handlers and atexit
_counter = itertools.count()
_previous_handlers = {}


def main(hang_limit_s=HANG_LIMIT_S):
    """unittest.main for a test file that uses Hosts. A file still running after hang_limit_s
    (keep it under the ctest TIMEOUT) prints every thread's stack and then gets SIGTERM, so its
    sets are taken down (faulthandler's own exit would skip that)."""
    faulthandler.dump_traceback_later(hang_limit_s)
    timer = threading.Timer(hang_limit_s + 1, os.kill, (os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    unittest.main(module="__main__")


class OutsideNamespaceError(PermissionError):
    """A connect to a simulated host's address from outside the simulated hosts. An OSError, so
    socket.create_connection closes its socket and raises it as it is."""


def netns_sh(*args, timeout=SCRIPT_TIMEOUT_S, check=True):
    """Runs scripts/netns.sh with args; returns its stdout."""
    result = subprocess.run(
        ["bash", NETNS_SH, *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"netns.sh {' '.join(map(str, args))} failed with "
            f"{result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def existing_sets():
    """The prefixes of the sets that exist now (of any owner)."""
    return netns_sh("list", check=False).split()


def reap_stale():
    """Takes down the sets this fixture made in processes that no longer run."""
    for prefix in existing_sets():
        match = PREFIX_RE.match(prefix)
        if match and int(match.group(1)) != os.getpid() and not is_running(int(match.group(1))):
            netns_sh("down", prefix, check=False)


# --- the guard -----------------------------------------------------------------------------


def inside_simulated_host():
    """Whether this process's network namespace is one of those named in /run/netns."""
    try:
        own = os.stat("/proc/self/ns/net")
        names = os.listdir("/run/netns")
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(os.path.join("/run/netns", name))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            return True
    return False


def check_destination(address):
    """Raises OutsideNamespaceError for a 10.77.0.x destination outside the simulated hosts."""
    if not isinstance(address, tuple) or not address or not isinstance(address[0], str):
        return  # a Unix socket path or the like
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return  # a name: resolved by connect through the root namespace's /etc/hosts
    if ip in SUBNET and not inside_simulated_host():
        raise OutsideNamespaceError(
            f"connect to {address[0]} from the root network namespace: simulated hosts are "
            "reached only from processes started inside one (Hosts.popen / Hosts.run)"
        )


def _install_guard():
    if getattr(socket.socket.connect, "_netns_guard", False):
        return
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded_connect(self, address):
        check_destination(address)
        return connect(self, address)

    def guarded_connect_ex(self, address):
        check_destination(address)
        return connect_ex(self, address)

    guarded_connect._netns_guard = True
    socket.socket.connect = guarded_connect
    socket.socket.connect_ex = guarded_connect_ex


_install_guard()


# --- cleanup on every way out --------------------------------------------------------------


def _close_all():
    for hosts in list(_live):
        hosts.close()


def _on_signal(signum, frame):
    _close_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)  # SIGINT's default raises KeyboardInterrupt
    elif previous == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # ends the process as the signal would have


def _install_cleanup_handlers():
    if _previous_handlers:
        return
    atexit.register(_close_all)
    for signum in CLEANUP_SIGNALS:
        try:
            _previous_handlers[signum] = signal.signal(signum, _on_signal)
        except ValueError:
            pass  # not the main thread: atexit and the with block still clean up


class Hosts:
    """N simulated hosts (network namespaces on one bridge); a context manager."""

    def __init__(self, n):
        self.n = n
        self.prefix = f"t{os.getpid()}n{next(_counter)}"
        self.processes = []
        self.closed = False
        _install_cleanup_handlers()
        reap_stale()
        _live.append(self)  # before `up`, so a signal during `up` takes the half-made set down
        try:
            netns_sh("down", self.prefix, check=False)  # left by an earlier process with our PID
            netns_sh("up", self.prefix, n)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def namespace(self, i):
        return f"{self.prefix}-{self._index(i)}"

    def address(self, i):
        return str(SUBNET.network_address + FIRST_HOST + self._index(i))

    def hostname(self, i):
        return f"node{self._index(i)}"

    def exec_argv(self, i, argv):
        """The argv that runs argv on host i (it keeps the PID of the process started)."""
        return ["bash", NETNS_SH, "exec", self.prefix, str(self._index(i)), *argv]

    def popen(self, i, argv, **popen_kwargs):
        """Starts argv inside host i; the process is killed by PID when the set goes down. It
        dies with the test process unless popen_kwargs gives its own preexec_fn."""
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        popen_kwargs.setdefault("preexec_fn", die_with_parent)
        process = subprocess.Popen(self.exec_argv(i, argv), **popen_kwargs)
        self.processes.append(process)
        return process

    def run(self, i, argv, timeout, **run_kwargs):
        """Runs argv inside host i to completion (killed after timeout s, which raises
        subprocess.TimeoutExpired); returns the CompletedProcess, output captured as text."""
        run_kwargs.setdefault("stdin", subprocess.DEVNULL)
        if "stdout" not in run_kwargs and "stderr" not in run_kwargs:
            run_kwargs.setdefault("capture_output", True)
        run_kwargs.setdefault("text", True)
        run_kwargs.setdefault("preexec_fn", die_with_parent)
        return subprocess.run(self.exec_argv(i, argv), timeout=timeout, **run_kwargs)

    def pids(self, i):
        """The PIDs of the processes inside host i now."""
        return [int(p) for p in netns_sh("pids", self.prefix, self._index(i)).split()]

    def kill_host(self, i):
        """SIGKILLs everything inside host i (a crashed node); returns once nothing is left."""
        netns_sh("kill", self.prefix, self._index(i))
        self._reap()

    def link(self, i, up):
        """Host i's eth0 up or down (down: a silent node, whose traffic times out)."""
        netns_sh("link", self.prefix, self._index(i), "up" if up else "down")

    def cut(self, i, j):
        """Hosts i and j no longer reach each other (a partition); each reaches every other host."""
        netns_sh("cut", self.prefix, self._index(i), self._index(j))

    def heal(self, i, j):
        """Hosts i and j reach each other again (the cut between them ends)."""
        netns_sh("heal", self.prefix, self._index(i), self._index(j))

    def slow(self, i, rate):
        """What host i sends leaves at `rate` at most (tc's units, "20mbit"); "off" ends it."""
        netns_sh("slow", self.prefix, self._index(i), rate)

    def close(self):
        """Kills the processes started here, then takes the set down. Idempotent."""
        if self.closed:
            return
        self.closed = True
        # SIGTERM and SIGINT wait until the set is down: their handler would find it closing
        # and end the process half-way. (netns.sh inherits the mask; it ends on its own.)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, CLEANUP_SIGNALS)
        try:
            # Not Popen.wait: close() may run in a signal handler that interrupted a wait() on
            # one of these, whose lock then stays taken. An unreaped child keeps its PID, so
            # kill and /proc are safe; a zombie counts as gone.
            for process in self.processes:
                if process.returncode is None:
                    process.kill()
            deadline = time.monotonic() + KILL_TIMEOUT_S
            for process in self.processes:
                while process.returncode is None and is_running(process.pid):
                    if time.monotonic() >= deadline:
                        print(
                            f"netns_fixture: PID {process.pid} still running after SIGKILL",
                            file=sys.stderr,
                        )
                        break
                    time.sleep(POLL_S)
                process.poll()
        finally:
            try:
                netns_sh("down", self.prefix, check=False)
            finally:
                if self in _live:
                    _live.remove(self)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _reap(self):
        for process in self.processes:
            process.poll()

    def _index(self, i):
        if not isinstance(i, int) or not 0 <= i < self.n:
            raise IndexError(f"host {i!r} is not in 0..{self.n - 1}")
        return i
