"""Multi-node rendezvous on loopback: dlrun against torchrun (torch 1.13), for rdzv_bench.sh.

(a) rendezvous: K agents (K = 2, 4, 8, 16, 32 by default) started at once, each
      --nnodes=K --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT
      --rdzv-id=ID --max-restarts=0 --monitor-interval=0.1 --no-python dlrun-rdzv-probe OUT
    (torchrun gets the underscore spellings, which are all torch 1.13 knows; the monitor interval
    only makes torchrun's agents exit sooner, after the measurement). Every worker (a compiled
    probe, so no tool pays for Python start-ups) records the time at its start with RANK, WORLD_SIZE and GROUP_RANK, then exits 0. Measured: from
    just before the first agent is launched to the latest worker start. A run counts when every
    rank 0..K-1 and group rank 0..K-1 started once with WORLD_SIZE K and every agent exited 0.
    Each run has a fresh port and rendezvous id. Runs alternate between the tools, K ascending.
(c) recovery: 3 agents, --nnodes=2:3 --max-restarts=3 --rdzv-conf=last_call_timeout=1, whose
    workers run until a stop file appears. Agent 0 is started first and the other two once the
    store port listens, so agent 0 holds the store (torchrun's c10d backend puts it in the first
    agent that binds the port) and is never the victim. Once the workers of all 3 agents run
    with WORLD_SIZE 3, agent 2 and then its workers are SIGKILLed by PID; measured: from the
    kill to the later start of the new workers (records not seen before, WORLD_SIZE 2) of both
    survivors, capped at --recovery-cap seconds.

Every process is stopped by PID in a finally block: each agent, the processes below it (their
PIDs and start times taken just before it is killed), and every worker that recorded itself
(if /proc says it still runs the probe). Agents get PR_SET_PDEATHSIG, so they die if this
script does. A failed run prints why (the last line its agent logged) and the benchmark goes on.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
POLL_S = 0.01             # how often a deadline-bounded wait looks again
EXIT_TIMEOUT_S = 30       # agents must exit this long after their workers did
KILL_WAIT_S = 10
PR_SET_PDEATHSIG = 1
WORKER_NAME = b"dlrun-rdzv-probe"
_libc = ctypes.CDLL(None, use_errno=True)

# Runs per K of (a): (dlrun, torchrun). torchrun's agents each import torch (about 1.5 s of CPU),
# so its large K are run fewer times; the budget may cut rounds further.
REPEATS = {2: (5, 3), 4: (5, 3), 8: (5, 2), 16: (3, 1), 32: (3, 1)}
DEFAULT_REPEATS = (3, 1)


class Failed(Exception):
    """A run that did not produce a figure; the message says why."""


def die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def clean_env(**extra):
    """This environment without anything that steers a launcher or its workers."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "GROUP_RANK", "PYTHON_EXEC")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


class Tool:
    def __init__(self, name, prefix, underscores):
        self.name = name
        self.prefix = prefix
        self.underscores = underscores

    def flag(self, name, value):
        return f"--{name.replace('-', '_') if self.underscores else name}={value}"

    def argv(self, nnodes, port, rdzv_id, max_restarts, worker_args, conf=None):
        argv = self.prefix + [
            self.flag("nnodes", nnodes), self.flag("nproc-per-node", 1),
            self.flag("rdzv-backend", "c10d"), self.flag("rdzv-endpoint", f"127.0.0.1:{port}"),
            self.flag("rdzv-id", rdzv_id), self.flag("max-restarts", max_restarts),
            self.flag("monitor-interval", 0.1)]
        if conf:
            argv.append(self.flag("rdzv-conf", conf))
        return argv + ["--no_python" if self.underscores else "--no-python", *worker_args]


# --- processes -----------------------------------------------------------------------------

def stat_fields(pid):
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def start_time(pid):
    """The process's start time in clock ticks (tells a reused PID apart); None if gone or a
    zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def descendants(pid):
    """Every process below pid now, as (pid, start time), from one pass over /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append((child, start_time(child)))
        todo.extend(children.get(child, []))
    return found


def kill_pid(pid, started):
    """SIGKILLs pid if it is still the process that started at `started`."""
    if started is not None and start_time(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_agent(agent):
    """SIGKILLs an agent (our child) and every process below it, by PID."""
    below = descendants(agent.pid) if agent.poll() is None else []
    if agent.poll() is None:
        agent.kill()
    for pid, started in below:
        kill_pid(pid, started)
    try:
        agent.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        print(f"rdzv_bench: agent {agent.pid} still running after SIGKILL", file=sys.stderr)


def kill_worker(pid):
    """SIGKILLs pid if /proc says it still runs the probe worker (not a reused PID)."""
    started = start_time(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            ours = WORKER_NAME in f.read()
    except OSError:
        ours = False
    if ours:
        kill_pid(pid, started)


class Job:
    """The agents of one run, their logs and their workers' records; stops them all."""

    def __init__(self, scratch, tool):
        self.tool = tool
        self.dir = tempfile.mkdtemp(prefix=f"{tool.name}-", dir=scratch)
        self.out = os.path.join(self.dir, "records")
        os.mkdir(self.out)
        self.stop_file = os.path.join(self.dir, "stop")
        self.agents = []
        self.port = free_port()
        self.rdzv_id = f"bench-{uuid.uuid4().hex[:12]}"

    def start(self, argv):
        index = len(self.agents)
        with open(os.path.join(self.dir, f"agent{index}.log"), "wb") as log:
            self.agents.append(subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=clean_env(BENCH_AGENT=str(index), TMPDIR=self.dir),
                preexec_fn=die_with_parent))

    def records(self):
        found = []
        for name in os.listdir(self.out):
            if name.endswith(".json"):
                with open(os.path.join(self.out, name)) as f:
                    found.append(json.load(f))
        return found

    def last_log_line(self, index):
        try:
            with open(os.path.join(self.dir, f"agent{index}.log"), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def check_agents(self, may_exit=(), zero_ok=False, codes=None):
        """Raises Failed when an agent has exited (fine for those in may_exit, and with status
        0 if zero_ok), or when every agent has. codes: their exit statuses polled earlier."""
        if codes is None:
            codes = [agent.poll() for agent in self.agents]
        for index, code in enumerate(codes):
            if code is not None and index not in may_exit and not (zero_ok and code == 0):
                raise Failed(f"agent {index} exited with {code}: {self.last_log_line(index)}")
        if None not in codes:
            raise Failed(f"every agent exited (status {codes})")

    def wait_for(self, predicate, timeout, what, may_exit=(), zero_ok=False):
        """Polls predicate(records) until it returns something true; returns that. Fails when
        an agent exits first (see check_agents) or after timeout s (Failed, with `what`)."""
        deadline = time.monotonic() + timeout
        while True:
            # Exits polled before the records are read: an agent that had exited then had
            # all its workers' records written, so a failure seen here is real.
            codes = [agent.poll() for agent in self.agents]
            value = predicate(self.records())
            if value:
                return value
            self.check_agents(may_exit, zero_ok, codes)
            if time.monotonic() >= deadline:
                raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(POLL_S)

    def wait_exits(self, timeout):
        deadline = time.monotonic() + timeout
        for index, agent in enumerate(self.agents):
            try:
                code = agent.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise Failed(f"agent {index} still running {timeout:.0f} s after its worker "
                             "exited") from None
            if code != 0:
                raise Failed(f"agent {index} exited with {code}: {self.last_log_line(index)}")

    def stop(self):
        with open(self.stop_file, "w"):
            pass
        for agent in self.agents:
            kill_agent(agent)
        for record in self.records():
            kill_worker(record["pid"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether something listens on TCP port `port` (read from /proc/net/tcp, no connect)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue
    return False


# --- (a) rendezvous ------------------------------------------------------------------------

def rendezvous_run(tool, k, worker, scratch, timeout):
    """Seconds from launching the first of k agents to the last worker's start."""
    job = Job(scratch, tool)
    try:
        argv = tool.argv(k, job.port, job.rdzv_id, 0, [worker, job.out])
        t0 = time.time()
        for _ in range(k):
            job.start(argv)
        records = job.wait_for(lambda rs: rs if len(rs) >= k else None, timeout,
                               f"{k} workers to start", zero_ok=True)
        if len(records) > k:
            raise Failed(f"{len(records)} workers started, not {k}")
        for key, want in (("rank", list(range(k))), ("group_rank", list(range(k))),
                          ("world_size", [k] * k)):
            got = [r[key] for r in records]  # None: not set
            if None in got or sorted(got) != want:
                raise Failed(f"the workers' {key.upper()} values were {got}, not {want}")
        seconds = max(r["time"] for r in records) - t0
        job.wait_exits(EXIT_TIMEOUT_S)
        return seconds
    finally:
        job.stop()


def run_rendezvous(tools, ks, worker, scratch, budget_s):
    """Runs (a); returns {(tool name, k): [seconds]}, {(tool name, k): why it failed} and the
    keys that got fewer runs than planned because the budget ran out."""
    end = time.monotonic() + budget_s
    times = {(t.name, k): [] for t in tools for k in ks}
    failed, short = {}, set()
    hung = {}  # tool name -> the K at which a run timed out: larger K are not tried
    last_run = {}  # (tool name, k) -> seconds the last run took
    for k in ks:
        repeats = dict(zip(("dlrun", "torchrun"), REPEATS.get(k, DEFAULT_REPEATS)))
        for round_ in range(max(repeats[t.name] for t in tools)):
            for tool in tools:
                key = (tool.name, k)
                if key in failed or round_ >= repeats[tool.name]:
                    continue
                if tool.name in hung:
                    failed[key] = f"not run: a run timed out at K={hung[tool.name]}"
                    continue
                # The first run of each K starts while time is left, later ones if the last
                # run of the same K would still fit.
                if time.monotonic() + (last_run[key] if round_ else 0) > end:
                    short.add(key)
                    continue
                started = time.monotonic()
                try:
                    times[key].append(rendezvous_run(tool, k, worker, scratch, 30 + 3 * k))
                    print(f"rdzv_bench: {tool.name} K={k}: {times[key][-1] * 1e3:.0f} ms",
                          file=sys.stderr)
                except Failed as why:
                    failed[key] = str(why)
                    if str(why).startswith("timed out"):
                        hung[tool.name] = k
                    print(f"rdzv_bench: {tool.name} K={k} failed: {why}", file=sys.stderr)
                last_run[key] = time.monotonic() - started
    return times, failed, short


# --- (c) recovery --------------------------------------------------------------------------

RECOVERY_CONF = "last_call_timeout=1"


def recovery_run(tool, worker, scratch, cap_s, timeout):
    """Seconds from SIGKILL of one of 3 agents to the start of both survivors' new workers, or
    None if they did not start within cap_s."""
    job = Job(scratch, tool)
    try:
        argv = tool.argv("2:3", job.port, job.rdzv_id, 3,
                         [worker, job.out, job.stop_file], conf=RECOVERY_CONF)
        job.start(argv)
        deadline = time.monotonic() + timeout
        while not listening(job.port):
            job.check_agents()
            if time.monotonic() >= deadline:
                raise Failed(f"agent 0 did not listen on port {job.port} within {timeout} s")
            time.sleep(POLL_S)
        job.start(argv)
        job.start(argv)

        def all_three(records):
            running = [r for r in records if r["world_size"] == 3 and start_time(r["pid"])]
            return running if {r["agent"] for r in running} == {"0", "1", "2"} else None
        job.wait_for(all_three, timeout, "the workers of all 3 agents to run with WORLD_SIZE 3")

        victim = job.agents[2]
        seen = {r["uid"] for r in job.records()}
        killed_at = time.time()
        kill_agent(victim)
        for record in job.records():
            if record["agent"] == "2":
                kill_worker(record["pid"])

        def survivors_restarted(records):
            new = [r for r in records
                   if r["uid"] not in seen and r["agent"] in ("0", "1") and r["world_size"] == 2]
            return new if {r["agent"] for r in new} == {"0", "1"} else None
        try:
            new = job.wait_for(survivors_restarted, cap_s,
                               "the survivors' new workers", may_exit=(2,))
        except Failed as why:
            if str(why).startswith("timed out"):
                return None
            raise
        return max(r["time"] for r in new) - killed_at
    finally:
        job.stop()


def run_recovery(tools, worker, scratch, cap_s, repeats):
    results, failed = {}, {}
    for round_ in range(max(repeats[t.name] for t in tools)):
        for tool in tools:
            if tool.name in failed or round_ >= repeats[tool.name]:
                continue
            try:
                seconds = recovery_run(tool, worker, scratch, cap_s, timeout=60)
            except Failed as why:
                failed[tool.name] = str(why)
                print(f"rdzv_bench: recovery, {tool.name} failed: {why}", file=sys.stderr)
                continue
            results.setdefault(tool.name, []).append(seconds)
            shown = "did not recover" if seconds is None else f"{seconds * 1e3:.0f} ms"
            print(f"rdzv_bench: recovery, {tool.name}: {shown}", file=sys.stderr)
    return results, failed


# --- report --------------------------------------------------------------------------------

def median(values):
    return statistics.median(values) if values else None


def ms(value):
    return "-" if value is None else f"{value * 1e3:.0f}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.1f}"


def report_rendezvous(tools, ks, times, failed, short):
    names = [t.name for t in tools]
    print("(a) rendezvous: launch of the first of K agents to the last worker's start, "
          "median ms (runs)")
    both = len(names) == 2
    header = "%-4s" + " %18s" * len(names) + (" %16s" if both else "")
    print(header % ("K", *names, *(["torchrun/dlrun"] if both else [])))
    for k in ks:
        cells = []
        for name in names:
            key = (name, k)
            if key in failed:
                cells.append("failed")
            else:
                cells.append(f"{ms(median(times[key]))} ({len(times[key])})")
        if both:
            cells.append(ratio(median(times[("torchrun", k)]), median(times[("dlrun", k)])))
        print(header % (k, *cells))
    for (name, k), why in sorted(failed.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  K={k}, {name}: failed: {why}")
    if short:
        print("  the time budget ran out first: fewer runs (or none, -) for "
              + ", ".join(f"{name} K={k}" for name, k in sorted(short, key=lambda x: x[1])))


def report_recovery(tools, results, failed, cap_s):
    print(f"(c) recovery: 3 agents --nnodes=2:3 --max-restarts=3 --rdzv-conf={RECOVERY_CONF} "
          "(torch 1.13 takes whole seconds); one non-store agent and its workers SIGKILLed;")
    print("    time from the kill to the start of both survivors' new workers (WORLD_SIZE 2)")
    medians = {}
    for tool in tools:
        name = tool.name
        if name in failed:
            print(f"  {name}: failed: {failed[name]}")
            continue
        runs = results.get(name, [])
        recovered = [s for s in runs if s is not None]
        if not runs:
            print(f"  {name}: not measured")
        elif not recovered:
            print(f"  {name}: did not recover within {cap_s:.0f} s ({len(runs)} runs)")
            medians[name] = ("cap", cap_s)
        else:
            note = f", {len(runs) - len(recovered)} did not recover within {cap_s:.0f} s" \
                if len(recovered) < len(runs) else ""
            medians[name] = ("value", median(recovered))
            print(f"  {name}: median {ms(median(recovered))} ms ({len(recovered)} runs{note})")
    if "dlrun" in medians and "torchrun" in medians:
        kind, t = medians["torchrun"]
        _, d = medians["dlrun"]
        bound = "at least " if kind == "cap" else ""
        print(f"  torchrun/dlrun: {bound}{ratio(t, d)}")


def exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # so that the finally blocks stop every process


def main():
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--torchrun", nargs="+", help="argv prefix that runs torchrun")
    parser.add_argument("--worker", required=True,
                        help="the worker executable (dlrun-rdzv-probe), the same for every tool")
    parser.add_argument("--ks", default="2,4,8,16,32")
    parser.add_argument("--only", choices=("rendezvous", "recovery"))
    parser.add_argument("--budget", type=float, default=200,
                        help="seconds for (a): a run is started only if the last one of its "
                        "kind says it fits (the first of each K always starts in time)")
    parser.add_argument("--recovery-cap", type=float, default=60)
    parser.add_argument("--recovery-repeats", default="3,1",
                        help="recovery runs of dlrun,torchrun")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    tools = [Tool("dlrun", [args.dlrun], underscores=False)]
    if args.torchrun:
        tools.append(Tool("torchrun", args.torchrun, underscores=True))
    scratch = tempfile.mkdtemp(prefix="rdzv-bench-")
    try:
        if args.only in (None, "rendezvous"):
            times, failed, short = run_rendezvous(tools, ks, args.worker, scratch, args.budget)
            report_rendezvous(tools, ks, times, failed, short)
        if args.only in (None, "recovery"):
            dl, tr = (int(x) for x in args.recovery_repeats.split(","))
            results, failed = run_recovery(tools, args.worker, scratch, args.recovery_cap,
                                           {"dlrun": dl, "torchrun": tr})
            report_recovery(tools, results, failed, args.recovery_cap)
    finally:
        if os.environ.get("RDZV_BENCH_KEEP"):
            print(f"rdzv_bench: agent logs and worker records kept in {scratch}",
                  file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
