"""Runs the dlrun launcher for the Python acceptance tests.

The binary comes from the DLRUN environment variable (ctest sets it). Workers are small scripts
in workers/ run by the interpreter that runs the test: ctest runs each torch test under both
eras' interpreters (Debian's torch 1.13 and the set-up's torch 2.13 environment). Every wait has
a deadline; the events waited for are files that workers create (written to a temporary name, then
renamed, so a file that exists is complete) and process exits. Every process a test starts is
stopped by PID in a cleanup, also when the test fails: dlrun itself, and every worker whose PID file
the test has read (a worker is only killed when /proc says it is still running one of our scripts).
"""

import ctypes
import faulthandler
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

PYTHON = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
RUN_TIMEOUT_S = 20  # the longest any single dlrun run may take before the test fails
EVENT_TIMEOUT_S = 15  # the longest to wait for files that workers write
POLL_S = 0.01  # how often a deadline-bounded wait looks again
HANG_LIMIT_S = 280  # under ctest's TIMEOUT (300), so a hung file reports where it hung
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def main():
    """unittest.main for a test file; exits with every thread's stack if the file hangs."""
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    unittest.main(module="__main__")


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


def free_port():
    return free_ports(1)[0]


def die_with_parent():
    """Popen preexec_fn: dlrun is killed if the test process dies without cleaning up (and its
    workers with it, if dlrun's own PR_SET_PDEATHSIG works)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def binary_from_env(variable, program):
    path = os.environ.get(variable)
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(f"{variable} must name the {program} executable (got {path!r})")
    return path


def dlrun_binary():
    return binary_from_env("DLRUN", "dlrun")


def worker(name):
    return os.path.join(WORKERS, name)


def clean_env(**overrides):
    """The test's environment without anything that would steer dlrun or its workers.

    PET_* variables, the worker variables dlrun sets only by default and the torchelastic
    variables of an enclosing launcher are removed, so every test states what it depends on.
    A value of None removes a variable.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_"))
        and k
        not in (
            "OMP_NUM_THREADS",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "NCCL_ASYNC_ERROR_HANDLING",
            "TF_CONFIG",
            "PYTHON_EXEC",
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "DLRUN_TOKEN",
            "USE_LIBUV",
        )
    }
    env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def is_running(pid):
    """True while /proc/<pid> exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the command name, which is in parentheses and may contain anything.
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state not in (b"Z", b"X")


def runs_our_script(pid):
    """Whether `pid` is still one of our worker scripts (guards against a reused PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return WORKERS.encode() in f.read()
    except OSError:
        return False


def where_it_waits(task):
    """(comm, state, wait channel, system call) of a process or thread (`task`: its /proc
    directory; the syscall's number, "running" or -1 outside one), or None once it is gone."""
    try:
        return (
            Path(task, "comm").read_text().strip(),
            Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0],
            Path(task, "wchan").read_text().strip(),
            Path(task, "syscall").read_text().split()[0],
        )
    except OSError:  # gone meanwhile
        return None


def kill_if_ours(pid):
    if is_running(pid) and runs_our_script(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_shared(f):
    """All that `f` holds, read without moving its offset. A child writes its stdout or stderr
    through the same open file (one offset): a seek back here would have its next line overwrite
    what was already written."""
    chunks, offset = [], 0
    while chunk := os.pread(f.fileno(), 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks).decode(errors="replace")


def wait_until(predicate, timeout, what, proc=None, on_timeout=None):
    """Polls `predicate` until it is true; fails after `timeout` s or when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if proc is not None and proc.poll() is not None and not predicate():
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"dlrun exited with {proc.returncode} before {what}\n{detail}")
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")
        time.sleep(POLL_S)


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    def __repr__(self):
        return f"exit {self.returncode}\n--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"

    def dlrun_lines(self):
        """dlrun's own diagnostics on stderr (worker lines carry a rank prefix instead)."""
        return [line for line in self.stderr.splitlines() if line.startswith("dlrun:")]


class Dlrun:
    """One dlrun process; output goes to files so nothing blocks on a full pipe."""

    def __init__(self, test, args, env=None, cwd=None, wrapper=()):
        """`wrapper`: a command that execs dlrun in its place (the PID stays dlrun's)."""
        self.test = test
        self.worker_pids = []
        env = dict(env if env is not None else clean_env())
        # dlrun's own temporary files (the error-file root) stay inside the test's directory, so
        # a dlrun killed by a test leaves nothing behind in /tmp.
        env["TMPDIR"] = temp_dir(test)
        self._out = tempfile.TemporaryFile()
        self._err = tempfile.TemporaryFile()
        test.addCleanup(self._out.close)
        test.addCleanup(self._err.close)
        self.proc = subprocess.Popen(
            [*wrapper, dlrun_binary(), *args],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            preexec_fn=die_with_parent,
        )
        # Cleanups run last-in first-out: this one runs before the files are closed.
        test.addCleanup(self.kill)

    @property
    def pid(self):
        return self.proc.pid

    def output(self):
        return read_shared(self._out), read_shared(self._err)

    def describe(self):
        out, err = self.output()
        return f"--- dlrun stdout ---\n{out}--- dlrun stderr ---\n{err}"

    def wait(self, timeout=RUN_TIMEOUT_S):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            where = self.where_they_wait()  # before the kill: what each process waited on
            self.kill()
            raise AssertionError(
                f"dlrun still running after {timeout}s\n{where}{self.describe()}"
            ) from None
        out, err = self.output()
        return Result(code, out, err)

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def where_they_wait(self):
        """dlrun's threads and the workers this test knows: each one's state, wait channel and
        system call (/proc; the syscall's number, "running" or -1 outside one), a line each."""
        lines = []
        for pid in (self.proc.pid, *self.worker_pids):
            for task in sorted(glob.glob(f"/proc/{pid}/task/*")):
                if not (seen := where_it_waits(task)):
                    continue
                comm, state, wchan, call = seen
                lines.append(
                    f"pid {pid} task {os.path.basename(task)} ({comm}): {state}, wchan {wchan}, "
                    f"syscall {call}\n"
                )
            if not os.path.exists(f"/proc/{pid}"):
                lines.append(f"pid {pid}: gone\n")
        return "--- where they wait ---\n" + "".join(lines)

    def watch_workers(self, pids):
        """Workers this test knows by PID: they are killed in the cleanup if still running."""
        self.worker_pids.extend(pids)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.worker_pids:
            kill_if_ours(pid)


def run_dlrun(test, args, env=None, timeout=RUN_TIMEOUT_S, cwd=None):
    """Runs dlrun to completion and returns its Result."""
    return Dlrun(test, args, env=env, cwd=cwd).wait(timeout)


def run_control(*args, env=None):
    """`dlrun status|events|stop ARGS` to completion: (exit code, stdout, stderr)."""
    result = subprocess.run(
        [dlrun_binary(), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env if env is not None else clean_env(),
    )
    return result.returncode, result.stdout, result.stderr


def temp_dir(test):
    d = tempfile.TemporaryDirectory(prefix="dlrun-test-")
    test.addCleanup(d.cleanup)
    return d.name


def log_tails(directory, pattern="*.log", tail=4000):
    """Each log in `directory` under its name (its last `tail` characters; None: all), for
    failure messages."""
    text = ""
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        with open(path, errors="replace") as f:
            content = f.read()
        text += f"--- {os.path.basename(path)} ---\n{content[-tail:] if tail else content}"
    return text


def worker_starts(directory, attempt=None):
    """The start records elastic_worker.py wrote in `directory` (of one attempt, or all), in
    RANK order."""
    pattern = os.path.join(directory, f"start_{'*' if attempt is None else attempt}_*.json")
    records = [read_json(p) for p in glob.glob(pattern)]
    return sorted(records, key=lambda r: int(r["env"]["RANK"]))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def kill_recorded_workers(directory):
    """Kills (if still running our scripts) every worker whose JSON record in `directory` has a
    "pid": for tests whose workers record themselves rather than write pid_<rank> files."""
    for name in os.listdir(directory):
        if name.endswith(".json"):
            try:
                pid = read_json(os.path.join(directory, name)).get("pid")
            except (OSError, ValueError):
                continue
            if isinstance(pid, int):
                kill_if_ours(pid)


def wait_for_pid_files(test, launcher, directory, count, timeout=EVENT_TIMEOUT_S):
    """Waits for pid_<rank> files of ranks 0..count-1; returns {rank: pid} and watches them."""
    paths = {rank: os.path.join(directory, f"pid_{rank}") for rank in range(count)}
    wait_until(
        lambda: all(os.path.exists(p) for p in paths.values()),
        timeout,
        f"{count} workers to write their PID files in {directory}",
        proc=launcher.proc,
        on_timeout=launcher.describe,
    )
    pids = {}
    for rank, path in paths.items():
        with open(path) as f:
            pids[rank] = int(f.read())
    launcher.watch_workers(pids.values())
    return pids
