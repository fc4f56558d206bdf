"""Multi-node rendezvous on loopback: dlrun against torchrun (torch 1.13), for rdzv_bench.sh.

Each launcher runs on each backend it is given: dlrun on --backends (c10d, etcd), torchrun on
--torchrun-backends (torch 1.13's c10d; its legacy `etcd` backend; `etcd-v2`, its dynamic
rendezvous on etcd; both etcd ones speak etcd's v2 API through Debian's python3-etcd). A
variant is launcher-backend: dlrun-etcd, dlrun-c10d, torchrun-etcd, torchrun-etcd-v2...
Under c10d each run has a fresh store port; under etcd every run of the benchmark uses one etcd
(Debian's /usr/bin/etcd 3.4 with --enable-v2, data on disk, on free loopback ports, started
here through tests/python/etcd_fixture.py and SIGKILLed by PID at the end); every run has a
fresh rendezvous id.

(a) rendezvous: K agents (K = 2, 4, 8, 16, 32 by default) started at once, each
      --nnodes=K --nproc-per-node=1 --rdzv-backend=B --rdzv-endpoint=127.0.0.1:PORT
      --rdzv-id=ID --max-restarts=0 --monitor-interval=0.1 --no-python dlrun-rdzv-probe OUT
    (torchrun gets the underscore spellings, which are all torch 1.13 knows; the monitor interval
    only makes torchrun's agents exit sooner, after the measurement). Every worker (a compiled
    probe, so no tool pays for Python start-ups) records the time at its start with RANK,
    WORLD_SIZE, GROUP_RANK and MASTER_ADDR/PORT, then runs until a stop file appears, which the
    benchmark writes once it has every record: as a job's workers do, they outlive the launch,
    so the first agents' ends (a worker that exited at once had its agent report and leave
    while the last workers started) take no CPU from the window. Measured: from just before the
    first agent is launched to the latest worker start. A run counts when every rank 0..K-1 and
    group rank 0..K-1 started once with WORLD_SIZE K and every agent exited 0. Runs alternate
    between the variants (in reverse order every other round), K ascending. A run still short
    of its K workers after 30 + 3K s is cut there (shown as "> cap"; larger K of that variant
    are not tried).
(c) recovery: 3 agents, --nnodes=2:3 --max-restarts=3 --rdzv-conf=last_call_timeout=1 (or
    --recovery-conf, the same for every variant), whose workers run until a stop file appears.
    Under c10d agent 0 is started first and the other two once the store port listens, so
    agent 0 holds the rendezvous store (torchrun's c10d backend puts it in the first agent that
    binds the port); under etcd all three start at once. Once the workers of all 3 agents run
    with WORLD_SIZE 3, one agent (the victim) and then its workers are SIGKILLed by PID, at
    once; measured: from the kill to the later start of the new workers (records not seen
    before, WORLD_SIZE 2) of both survivors, capped at --recovery-cap seconds. Survivors that
    exit instead have not recovered either. Under dlrun-etcd a SIGKILLed node is noticed when
    its etcd lease lapses: its TTL is keep_alive_interval * keep_alive_max_attempt (whole
    seconds, at least 2; 3 s by default), renewed every third of it from the grant at the
    join, so a kill finds 2/3 to all of it left; a kill soon after the join, as here, nearly
    all: close to the longest recovery. The victim, per --victims:
      store: the node of the workers' store, MASTER_ADDR:MASTER_PORT. When an agent (or a
             process below it) listens on MASTER_PORT, that agent: dlrun-c10d's agent 0 (the
             workers use the rendezvous store), dlrun-etcd's group rank 0 (every agent serves
             an idle store; the workers use group rank 0's). When none does, the agent of group
             rank 0: torchrun's group rank 0 only picks MASTER_PORT and its rank-0 worker
             would serve the store (torch 1.13's workers host it; the probe does not).
      other: a node that serves neither the workers' store nor (c10d) the rendezvous: the
             highest-numbered such agent.

--control on,off: the cost of the control plane instead (issue 13); --metrics on,off: that of
    --metrics-port (issue 15). Only (a), only dlrun-c10d, in the variants dlrun-c10d-FEATURE-on
    and -off. Each run starts a dlrund of its own (--host 127.0.0.1 --port 0 --stats) as the
    rendezvous endpoint, so every agent is one of its clients (each tries to bind the port
    first and loses). --control off: the agents get --no-control-plane and dlrund --no-control.
    --metrics on: the agents and dlrund get --metrics-port=0 --metrics-host=127.0.0.1, and a
    metrics_watch.Watcher (a thread here) scrapes /metrics and polls /api/state of each once a
    second, from the moment dlrund printed its port or an agent logged its own, as Prometheus and
    an open page do. Every worker gets BENCH_SIGNAL_PID (dlrund's
    PID) and sends it SIGUSR1 at its start, so dlrund prints its counts then; the run's
    "start" counts are those of the first such line taken at or after the last worker's start
    (the benchmark sends one more SIGUSR1 when it has seen every record, in case none was), its
    "job" counts the line dlrund prints at its exit (SIGTERM once every agent has exited).
    Reported per K and variant, medians over the runs (FIGURES): the rendezvous time, the
    time to the last agent's exit, requests per agent to the start and for the job,
    connections per agent, the store's requests per second from the launch to that snapshot,
    the CPU of the agents with their workers (RUSAGE_CHILDREN) per agent and per agent and
    second of the job, dlrund's (its threads' schedstat from the launch to the last exit) per
    agent and per request, the watcher's requests answered; the on/off ratio of each, the
    run-by-run on/off ratios of the main ones (PAIRED; the i-th runs of on and off ran next to
    each other: every other round runs them in reverse order), and the requests per agent by
    op.

Every process is stopped by PID in a finally block: each agent, the processes below it (their
PIDs and start times taken just before it is killed), every worker that recorded itself (if
/proc says it still runs the probe), and etcd. They die if this script does: it runs as the
init of a PID namespace of its own where rdzv_bench.sh may make one (root), else agents and etcd
get PR_SET_PDEATHSIG. A failed run prints why (the last line its agent logged) and the
benchmark goes on.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env, free_port  # noqa: E402  (after the path)
from dlrund_fixture import Dlrund, read_line  # noqa: E402
from etcd_fixture import EtcdStartError, launch_etcd  # noqa: E402  (after the path)
from metrics_watch import AGENT_LINE, DLRUND_LINE, Watcher  # noqa: E402

POLL_S = 0.01  # how often a deadline-bounded wait looks again
EXIT_TIMEOUT_S = 30  # agents must exit this long after their workers did
EXIT_POLL_S = 0.005  # how often the agents' exits are looked for
STATS_TIMEOUT_S = 10  # dlrund --stats must print its line this soon after SIGUSR1/SIGTERM
KILL_WAIT_S = 10
WORKER_NAME = b"dlrun-rdzv-probe"

# Runs per K of (a) for each variant of (dlrun, torchrun). torchrun's agents each import torch
# (about 1.5 s of CPU), so its large K are run fewer times; the budget may cut rounds further.
REPEATS = {2: (5, 3), 4: (5, 3), 8: (5, 2), 16: (3, 1), 32: (3, 1)}
DEFAULT_REPEATS = (3, 1)


class Failed(Exception):
    """A run that did not produce a figure; the message says why."""


# Agents die with the benchmark. As the init of a PID namespace of its own (rdzv_bench.sh runs
# it so where it may) it needs nothing for that: when it dies the kernel kills every process
# in the namespace (orphans of killed agents stay zombies until then). Otherwise agents start
# through setpriv, which sets PR_SET_PDEATHSIG and execs the agent (same PID): a preexec_fn
# makes Python fork this whole process for every agent, where without one it uses vfork.
# Starting 32 agents took about 55 ms with a preexec_fn, 13 ms through setpriv and 6 ms bare
# on an idle machine, and the starts compete with the agents already started, inside the
# measured window.
IN_PID_NAMESPACE = os.getpid() == 1 and os.environ.get("RDZV_BENCH_PID_NAMESPACE") == "1"
DIE_WITH_PARENT = [] if IN_PID_NAMESPACE else ["setpriv", "--pdeathsig", "KILL", "--"]


# --control and --metrics: per feature and setting, what the agents' and dlrund's arguments get.
FEATURES = {
    "control": {"on": ([], []), "off": (["--no-control-plane"], ["--no-control"])},
    "metrics": {
        "on": (
            ["--metrics-port=0", "--metrics-host=127.0.0.1"],
            ["--metrics-port", "0", "--metrics-host", "127.0.0.1"],
        ),
        "off": ([], []),
    },
}


class Tool:
    """One variant: a launcher ("dlrun" or "torchrun") on one rendezvous backend. With a
    `feature` of FEATURES (--control, --metrics) and its `setting` ("on" or "off"), dlrun-c10d
    on a dlrund of its own per run (`dlrund`, its path), the feature on or off in both."""

    def __init__(
        self, launcher, backend, prefix, underscores, feature=None, setting=None, dlrund=None
    ):
        self.launcher = launcher
        self.backend = backend
        self.name = f"{launcher}-{backend}" + (f"-{feature}-{setting}" if feature else "")
        self.prefix = prefix
        self.underscores = underscores
        self.feature = feature
        self.setting = setting
        self.dlrund = dlrund
        self.extra, self.dlrund_extra = FEATURES[feature][setting] if feature else ([], [])
        # --metrics on: someone watches each run (metrics_watch.py).
        self.watched = feature == "metrics" and setting == "on"

    def flag(self, name, value):
        return f"--{name.replace('-', '_') if self.underscores else name}={value}"

    def argv(self, nnodes, endpoint, rdzv_id, max_restarts, worker_args, conf=None):
        argv = self.prefix + [
            self.flag("nnodes", nnodes),
            self.flag("nproc-per-node", 1),
            self.flag("rdzv-backend", self.backend),
            self.flag("rdzv-endpoint", endpoint),
            self.flag("rdzv-id", rdzv_id),
            self.flag("max-restarts", max_restarts),
            self.flag("monitor-interval", 0.1),
        ]
        if conf:
            argv.append(self.flag("rdzv-conf", conf))
        return (
            argv + self.extra + ["--no_python" if self.underscores else "--no-python", *worker_args]
        )


# --- processes -----------------------------------------------------------------------------


def stat_fields(pid):
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


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
    """The agents of one run, their logs and their workers' records; stops them all. Its
    rendezvous endpoint: a fresh loopback port under c10d, the benchmark's etcd under etcd, or
    (--control, --metrics) a dlrund of its own, started here with --stats and the variant's
    arguments, whose PID the workers get as BENCH_SIGNAL_PID; when the variant is watched, the
    ports it and the agents serve metrics on (targets())."""

    def __init__(self, scratch, tool, etcd_endpoint):
        self.tool = tool
        self.dir = tempfile.mkdtemp(prefix=f"{tool.name}-", dir=scratch)
        self.out = os.path.join(self.dir, "records")
        os.mkdir(self.out)
        self.parsed = {}  # record file name -> its record: each is read once
        self.stop_file = os.path.join(self.dir, "stop")
        self.agents = []
        self.dlrund = None
        if tool.dlrund:
            self.dlrund = Dlrund("--stats", *tool.dlrund_extra, binary=tool.dlrund)
            self.port = self.dlrund.port
            self.endpoint = f"127.0.0.1:{self.port}"
        elif tool.backend == "c10d":
            self.port = free_port()
            self.endpoint = f"127.0.0.1:{self.port}"
        else:
            self.port = None
            self.endpoint = etcd_endpoint
        self.rdzv_id = f"bench-{uuid.uuid4().hex[:12]}"
        self.metrics_ports = {}  # "dlrund" or an agent's index -> its --metrics-port
        if tool.watched:
            self.metrics_ports["dlrund"] = self.dlrund_metrics_port()

    def start(self, argv):
        index = len(self.agents)
        extra = {"BENCH_SIGNAL_PID": str(self.dlrund.pid)} if self.dlrund else {}
        with open(os.path.join(self.dir, f"agent{index}.log"), "wb") as log:
            self.agents.append(
                subprocess.Popen(
                    DIE_WITH_PARENT + argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=clean_env(
                        GROUP_RANK=None,
                        RDZV_BENCH_PID_NAMESPACE=None,
                        BENCH_AGENT=str(index),
                        TMPDIR=self.dir,
                        **extra,
                    ),
                )
            )

    def dlrund_metrics_port(self, timeout=STATS_TIMEOUT_S):
        """The port dlrund printed for --metrics-port (its lines after the first)."""
        while True:
            try:
                line = read_line(self.dlrund.proc.stdout, timeout).decode()
            except (TimeoutError, EOFError) as why:
                raise Failed(f"no metrics line from dlrund: {why}") from None
            match = DLRUND_LINE.match(line)
            if match:
                return int(match.group(1))

    def targets(self):
        """The metrics ports known so far: dlrund's and those the agents have logged."""
        for index in range(len(self.agents)):
            if index not in self.metrics_ports:
                try:
                    with open(os.path.join(self.dir, f"agent{index}.log"), errors="replace") as f:
                        match = AGENT_LINE.search(f.read())
                except OSError:
                    match = None
                if match:
                    self.metrics_ports[index] = int(match.group(1))
        return list(self.metrics_ports.values())

    def store_snapshot_after(self, when, timeout=STATS_TIMEOUT_S):
        """The first of dlrund's stats lines taken at or after `when` (unix seconds), parsed;
        dlrund is sent SIGUSR1 first, so one is taken now if none was."""
        self.dlrund.proc.send_signal(signal.SIGUSR1)
        while True:
            try:
                line = read_line(self.dlrund.proc.stdout, timeout).decode()
            except (TimeoutError, EOFError) as why:
                raise Failed(f"no stats line from dlrund: {why}") from None
            stats = parse_stats(line)
            if stats and stats["time"] >= when:
                return stats

    def store_totals(self, timeout=STATS_TIMEOUT_S):
        """dlrund's counts at its exit (SIGTERM), parsed."""
        self.dlrund.proc.send_signal(signal.SIGTERM)
        try:
            self.dlrund.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise Failed(f"dlrund still running {timeout} s after SIGTERM") from None
        last = None
        for line in self.dlrund.proc.stdout.read().decode().splitlines(keepends=True):
            last = parse_stats(line) or last
        if last is None:
            raise Failed("dlrund printed no stats line at its exit")
        return last

    def records(self):
        # Polled every POLL_S while the agents start: a record (renamed into place whole,
        # named by its worker's PID, never rewritten) is parsed once, so the benchmark's own
        # CPU stays off the 2 cores the agents share (it parsed up to K files a poll before).
        for name in os.listdir(self.out):
            if name.endswith(".json") and name not in self.parsed:
                with open(os.path.join(self.out, name)) as f:
                    self.parsed[name] = json.load(f)
        return list(self.parsed.values())

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
        """Waits until every agent has exited 0 (Failed when one exits otherwise, or after
        timeout s); returns when the last exit was seen (unix s, to within EXIT_POLL_S)."""
        deadline = time.monotonic() + timeout
        while True:
            codes = [agent.poll() for agent in self.agents]
            for index, code in enumerate(codes):
                if code is not None and code != 0:
                    raise Failed(f"agent {index} exited with {code}: {self.last_log_line(index)}")
            if None not in codes:
                return time.time()
            if time.monotonic() >= deadline:
                raise Failed(
                    f"agent {codes.index(None)} still running {timeout:.0f} s after "
                    "its worker exited"
                )
            time.sleep(EXIT_POLL_S)

    def release_workers(self):
        """Has the workers (given the stop file) exit 0."""
        with open(self.stop_file, "w"):
            pass

    def stop(self):
        self.release_workers()
        for agent in self.agents:
            kill_agent(agent)
        for record in self.records():
            kill_worker(record["pid"])
        if self.dlrund:
            self.dlrund.stop()


STATS_LINE = re.compile(
    r"dlrund stats: time=(\S+) connections=(\d+) foreign=(\d+) "
    r"requests=(\d+)((?: [A-Z_]+=\d+)*)\n"
)


def parse_stats(line):
    """A line of dlrund --stats as {"time", "connections", "foreign", "requests", "ops": {op:
    count}}; None for any other line."""
    match = STATS_LINE.fullmatch(line)
    if not match:
        return None
    ops = {
        name: int(count) for name, count in (field.split("=") for field in match.group(5).split())
    }
    return {
        "time": float(match.group(1)),
        "connections": int(match.group(2)),
        "foreign": int(match.group(3)),
        "requests": int(match.group(4)),
        "ops": ops,
    }


def listeners(port):
    """The socket inodes listening on TCP port `port` (read from /proc/net/tcp, no connect)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found.add(fields[9])
        except OSError:
            continue
    return found


def listening(port):
    return bool(listeners(port))


def holds_socket(pid, inodes):
    """Whether process pid has one of the sockets `inodes` open (from /proc/<pid>/fd)."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue
    return False


# --- (a) rendezvous ------------------------------------------------------------------------


def children_cpu():
    """CPU seconds (user + system) of every child of this process reaped so far, with the
    descendants each reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid):
    """CPU seconds used so far by the threads of process pid that still run (the sum of the
    nanoseconds in /proc/<pid>/task/*/schedstat); 0 if it is gone."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def rendezvous_run(tool, k, worker, scratch, etcd_endpoint, timeout):
    """Seconds from launching the first of k agents to the last worker's start, and under
    --control or --metrics the store's counts: {"t0": the launch (unix s), "start": the first
    snapshot at or after the last worker's start, "total": at dlrund's exit, after every
    agent's, "rdzv": the seconds above, "job": seconds from the launch to the last agent's exit,
    "agents_cpu": CPU seconds of the agents and their workers, "store_cpu": dlrund's from the
    launch to every agent's exit, "watched": HTTP requests the watcher got answered (from just
    before the launch to the last exit; 0 when not watched)}; else None."""
    job = Job(scratch, tool, etcd_endpoint)
    watcher = Watcher(job.targets) if tool.watched else None
    try:
        argv = tool.argv(k, job.endpoint, job.rdzv_id, 0, [worker, job.out, job.stop_file])
        cpu0 = children_cpu()
        store_cpu0 = process_cpu(job.dlrund.pid) if job.dlrund else 0
        t0 = time.time()
        if watcher:
            watcher.start()
        for _ in range(k):
            job.start(argv)
        records = job.wait_for(
            lambda rs: rs if len(rs) >= k else None, timeout, f"{k} workers to start", zero_ok=True
        )
        if len(records) > k:
            raise Failed(f"{len(records)} workers started, not {k}")
        for key, want in (
            ("rank", list(range(k))),
            ("group_rank", list(range(k))),
            ("world_size", [k] * k),
        ):
            got = [r[key] for r in records]  # None: not set
            if None in got or sorted(got) != want:
                raise Failed(f"the workers' {key.upper()} values were {got}, not {want}")
        seconds = max(r["time"] for r in records) - t0
        job.release_workers()
        stats = None
        if job.dlrund:
            stats = {"t0": t0, "rdzv": seconds, "start": job.store_snapshot_after(t0 + seconds)}
        exited = job.wait_exits(EXIT_TIMEOUT_S)
        if watcher:
            watcher.stop()
        if job.dlrund:
            stats["watched"] = watcher.requests if watcher else 0
            stats["job"] = exited - t0
            stats["store_cpu"] = process_cpu(job.dlrund.pid) - store_cpu0
            stats["agents_cpu"] = children_cpu() - cpu0  # each agent reaped its worker
            stats["total"] = job.store_totals()
        return seconds, stats
    finally:
        if watcher and watcher.is_alive():
            watcher.stop()
        job.stop()


def rendezvous_timeout(k):
    return 30 + 3 * k


def run_rendezvous(tools, ks, worker, scratch, etcd_endpoint, budget_s, dlrun_repeats=None):
    """Runs (a); returns {(tool name, k): [seconds]}, {(tool name, k): why it failed}, the
    keys that got fewer runs than planned because the budget ran out, and {(tool name, k):
    [the store's counts, see rendezvous_run]} (--control, --metrics). A run cut at its
    timeout is a failure whose reason starts with "timed out". dlrun_repeats: dlrun's runs per
    K, instead of REPEATS's. Every other round runs the variants in reverse order."""
    end = time.monotonic() + budget_s
    times = {(t.name, k): [] for t in tools for k in ks}
    store = {(t.name, k): [] for t in tools for k in ks}
    failed, short = {}, set()
    hung = {}  # tool name -> the K at which a run timed out: larger K are not tried
    last_run = {}  # (tool name, k) -> seconds the last run took
    for k in ks:
        repeats = dict(zip(("dlrun", "torchrun"), REPEATS.get(k, DEFAULT_REPEATS)))
        if dlrun_repeats:
            repeats["dlrun"] = dlrun_repeats
        for round_ in range(max(repeats[t.launcher] for t in tools)):
            for tool in tools if round_ % 2 == 0 else tools[::-1]:
                key = (tool.name, k)
                if key in failed or round_ >= repeats[tool.launcher]:
                    continue
                if tool.name in hung:
                    failed[key] = f"not run: a run timed out at K={hung[tool.name]}"
                    continue
                # The first run of each K starts while time is left, later ones if the last
                # run of the same K would still fit (none: the first did not start either).
                if time.monotonic() + last_run.get(key, 0) > end:
                    short.add(key)
                    continue
                started = time.monotonic()
                try:
                    seconds, stats = rendezvous_run(
                        tool, k, worker, scratch, etcd_endpoint, rendezvous_timeout(k)
                    )
                    times[key].append(seconds)
                    if stats:
                        store[key].append(stats)
                    print(
                        f"rdzv_bench: {tool.name} K={k}: {times[key][-1] * 1e3:.0f} ms",
                        file=sys.stderr,
                    )
                except Failed as why:
                    failed[key] = str(why)
                    if str(why).startswith("timed out"):
                        hung[tool.name] = k
                    print(f"rdzv_bench: {tool.name} K={k} failed: {why}", file=sys.stderr)
                last_run[key] = time.monotonic() - started
    return times, failed, short, store


# --- (c) recovery --------------------------------------------------------------------------


class Outcome:
    """One recovery run: seconds (None: no recovery), the victim in words, and why there was no
    recovery: "cap" (nothing within the cap) or what ended the survivors."""

    def __init__(self, seconds, victim, why=None):
        self.seconds = seconds
        self.victim = victim
        self.why = why


def pick_victim(job, running, kind):
    """The index of the agent to kill (see the module's doc) and a few words on why."""
    ports = {r["master_port"] for r in running}
    if len(ports) != 1 or None in ports:
        raise Failed(f"the workers' MASTER_PORT values were {sorted(map(str, ports))}, not one")
    port = ports.pop()
    inodes = listeners(port)
    store, why = None, ""
    if inodes:
        for index, agent in enumerate(job.agents):
            if any(
                holds_socket(pid, inodes)
                for pid in [agent.pid] + [p for p, _ in descendants(agent.pid)]
            ):
                store, why = index, f"listens on MASTER_PORT {port}"
                break
    if store is None:
        store = next(int(r["agent"]) for r in running if r["group_rank"] == 0)
        why = f"group rank 0; nothing listens on MASTER_PORT {port}"
    group_rank = {int(r["agent"]): r["group_rank"] for r in running}
    if kind == "store":
        return store, f"agent {store} (group rank {group_rank[store]}): {why}"
    # c10d's agent 0 serves the rendezvous (it bound the port first).
    others = [
        i
        for i in range(len(job.agents))
        if i != store and not (job.tool.backend == "c10d" and i == 0)
    ]
    if not others:
        raise Failed(f"no agent other than the store's ({store}) and the rendezvous's")
    return others[-1], f"agent {others[-1]} (group rank {group_rank[others[-1]]})"


def recovery_run(tool, victim_kind, worker, scratch, etcd_endpoint, conf, cap_s, timeout):
    """An Outcome: seconds from SIGKILL of one of 3 agents (chosen by victim_kind) to the start
    of both survivors' new workers; None if they did not start within cap_s or exited."""
    job = Job(scratch, tool, etcd_endpoint)
    try:
        argv = tool.argv(
            "2:3", job.endpoint, job.rdzv_id, 3, [worker, job.out, job.stop_file], conf=conf
        )
        job.start(argv)
        deadline = time.monotonic() + timeout
        while job.port is not None and not listening(job.port):
            job.check_agents()
            if time.monotonic() >= deadline:
                raise Failed(f"agent 0 did not listen on port {job.port} within {timeout} s")
            time.sleep(POLL_S)
        job.start(argv)
        job.start(argv)

        def all_three(records):
            running = [r for r in records if r["world_size"] == 3 and start_time(r["pid"])]
            return running if {r["agent"] for r in running} == {"0", "1", "2"} else None

        running = job.wait_for(
            all_three, timeout, "the workers of all 3 agents to run with WORLD_SIZE 3"
        )

        index, victim_note = pick_victim(job, running, victim_kind)
        survivors = {str(i) for i in range(3) if i != index}
        seen = {r["uid"] for r in job.records()}
        killed_at = time.time()
        kill_agent(job.agents[index])
        for record in job.records():
            if record["agent"] == str(index):
                kill_worker(record["pid"])

        def survivors_restarted(records):
            new = [
                r
                for r in records
                if r["uid"] not in seen and r["agent"] in survivors and r["world_size"] == 2
            ]
            return new if {r["agent"] for r in new} == survivors else None

        try:
            new = job.wait_for(
                survivors_restarted, cap_s, "the survivors' new workers", may_exit=(index,)
            )
        except Failed as why:
            if str(why).startswith("timed out"):
                return Outcome(None, victim_note, "cap")
            return Outcome(
                None, victim_note, f"{time.time() - killed_at:.1f} s after the kill, {why}"
            )
        return Outcome(max(r["time"] for r in new) - killed_at, victim_note)
    finally:
        job.stop()


def run_recovery(tools, victims, worker, scratch, etcd_endpoint, conf, cap_s, repeats):
    """Runs (c); returns {(victim kind, tool name): [Outcome]} and
    {(victim kind, tool name): why a run failed}."""
    results, failed = {}, {}
    for kind in victims:
        for round_ in range(max(repeats[t.launcher] for t in tools)):
            for tool in tools:
                key = (kind, tool.name)
                if key in failed or round_ >= repeats[tool.launcher]:
                    continue
                try:
                    outcome = recovery_run(
                        tool, kind, worker, scratch, etcd_endpoint, conf, cap_s, timeout=60
                    )
                except Failed as why:
                    failed[key] = str(why)
                    print(
                        f"rdzv_bench: recovery ({kind}), {tool.name} failed: {why}", file=sys.stderr
                    )
                    continue
                results.setdefault(key, []).append(outcome)
                print(
                    f"rdzv_bench: recovery ({kind}), {tool.name}: {describe(outcome, cap_s)}; "
                    f"victim {outcome.victim}",
                    file=sys.stderr,
                )
    return results, failed


# --- report --------------------------------------------------------------------------------


def describe(outcome, cap_s):
    if outcome.seconds is not None:
        return f"{outcome.seconds * 1e3:.0f} ms"
    if outcome.why == "cap":
        return f"did not recover within {cap_s:.0f} s"
    return f"did not recover: {outcome.why}"


def median(values):
    return statistics.median(values) if values else None


def ms(value):
    return "-" if value is None else f"{value * 1e3:.0f}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.1f}"


def ratio_pairs(tools):
    """The (numerator, denominator) variant names worth a ratio: each torchrun variant over
    dlrun on the same kind of backend (torchrun-etcd-v2 over dlrun-etcd), and
    dlrun-etcd/dlrun-c10d."""
    names = [t.name for t in tools]
    pairs = []
    for tool in tools:
        same = "dlrun-" + ("c10d" if tool.backend == "c10d" else "etcd")
        if tool.launcher == "torchrun" and same in names:
            pairs.append((tool.name, same))
    if "dlrun-etcd" in names and "dlrun-c10d" in names:
        pairs.append(("dlrun-etcd", "dlrun-c10d"))
    return pairs


def report_rendezvous(tools, ks, times, failed, short):
    names = [t.name for t in tools]
    pairs = ratio_pairs(tools)
    print(
        "(a) rendezvous: launch of the first of K agents to the last worker's start, "
        "median ms (runs)"
    )
    header = "%-4s" + " %16s" * len(names) + " %27s" * len(pairs)
    print(header % ("K", *names, *(f"{a}/{b}" for a, b in pairs)))
    for k in ks:
        cells, value = [], {}  # value: name -> (median or the cap, whether it is the cap)
        for name in names:
            key = (name, k)
            if key in failed and failed[key].startswith("timed out"):
                cells.append(f"> {rendezvous_timeout(k) * 1e3:.0f}")
                value[name] = (rendezvous_timeout(k), True)
            elif key in failed:
                cells.append("failed")
            else:
                cells.append(f"{ms(median(times[key]))} ({len(times[key])})")
                value[name] = (median(times[key]), False)
        for a, b in pairs:
            (num, capped), (den, _) = value.get(a, (None, False)), value.get(b, (None, False))
            cells.append(("> " if capped else "") + ratio(num, den))
        print(header % (k, *cells))
    print_shortfalls(failed, short)


def print_shortfalls(failed, short):
    """The runs of (a) that failed, and the variants the budget cut short."""
    for (name, k), why in sorted(failed.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  K={k}, {name}: failed: {why}")
    if short:
        print(
            "  the time budget ran out first: fewer runs (or none, -) for "
            + ", ".join(f"{name} K={k}" for name, k in sorted(short, key=lambda x: x[1]))
        )


# --control and --metrics: each run's figures, (heading, its second line, format, the value of
# a run of K agents, see rendezvous_run).
FIGURES = (
    ("rdzv", "ms", "{:.0f}", lambda run, k: run["rdzv"] * 1e3),
    ("job", "ms", "{:.0f}", lambda run, k: run["job"] * 1e3),
    ("req/agent", "start", "{:.1f}", lambda run, k: run["start"]["requests"] / k),
    ("req/agent", "job", "{:.1f}", lambda run, k: run["total"]["requests"] / k),
    ("conn/agent", "job", "{:.2f}", lambda run, k: run["total"]["connections"] / k),
    (
        "store req/s",
        "start",
        "{:.0f}",
        lambda run, k: run["start"]["requests"] / (run["start"]["time"] - run["t0"]),
    ),
    ("agent CPU", "ms/agent", "{:.1f}", lambda run, k: run["agents_cpu"] * 1e3 / k),
    ("agent CPU", "ms/s/agent", "{:.1f}", lambda run, k: run["agents_cpu"] * 1e3 / k / run["job"]),
    ("store CPU", "us/agent", "{:.0f}", lambda run, k: run["store_cpu"] * 1e6 / k),
    (
        "store CPU",
        "us/req",
        "{:.2f}",
        lambda run, k: run["store_cpu"] * 1e6 / run["total"]["requests"],
    ),
    ("http", "req/run", "{:.0f}", lambda run, k: run["watched"]),
)
# The figures whose run-by-run on/off ratio is printed.
PAIRED = (
    "rdzv ms",
    "agent CPU ms/agent",
    "agent CPU ms/s/agent",
    "store req/s start",
    "store CPU us/req",
)


def report_onoff(tools, ks, failed, short, store):
    """--control's or --metrics's table: per K and variant, medians of FIGURES, then on/off;
    the run-by-run on/off ratios of PAIRED; and the requests per agent by op."""
    feature = tools[0].feature
    figures = [f for f in FIGURES if feature == "metrics" or f[0] != "http"]  # only it watches
    print(
        f"(a) rendezvous, {feature} on and off: K dlrun-c10d agents on a dlrund --stats of "
        "their own per run"
    )
    if feature == "control":
        print("    (off: dlrun --no-control-plane, dlrund --no-control); medians over the runs.")
    else:
        print(
            "    (on: dlrun and dlrund --metrics-port=0, each scraped (/metrics) and polled "
            "(/api/state)"
        )
        print(
            "    once a second from its first line on, as Prometheus and an open page do; "
            "'http': those"
        )
        print("    requests answered); medians over the runs.")
    print("    'start': from the launch to dlrund's first snapshot after the last worker's start;")
    print("    'job': to every agent's exit.")
    header = "%-4s %-7s %4s" + " %11s" * len(figures)
    print(header % ("K", feature, "runs", *(name for name, _, _, _ in figures)))
    print(header % ("", "", "", *(unit for _, unit, _, _ in figures)))
    for k in ks:
        row = {}
        for tool in tools:
            key = (tool.name, k)
            runs = store[key]
            if key in failed or not runs:
                why = f"failed: {failed[key]}" if key in failed else "not run"
                print(f"{k:<4} {tool.setting:<7} {why}")
                continue
            row[tool.setting] = [
                median([value(run, k) for run in runs]) for _, _, _, value in figures
            ]
            print(
                header
                % (
                    k,
                    tool.setting,
                    len(runs),
                    *(form.format(v) for (_, _, form, _), v in zip(figures, row[tool.setting])),
                )
            )
        if "on" in row and "off" in row:
            print(
                header
                % (
                    k,
                    "on/off",
                    "",
                    *(f"{on / off:.3f}" if off else "-" for on, off in zip(row["on"], row["off"])),
                )
            )
    # Runs alternate, so the i-th runs of on and off ran side by side: their ratio cancels
    # most of the load that other work puts on the machine meanwhile.
    names = {tool.setting: tool.name for tool in tools}
    if "on" in names and "off" in names:
        print("  on/off run by run (the i-th of each, next to each other), median [middle half]:")
        for k in ks:
            pairs = list(zip(store[(names["on"], k)], store[(names["off"], k)]))
            if not pairs:
                continue
            cells = []
            for name, unit, _, value in figures:
                if f"{name} {unit}" in PAIRED:
                    ratios = sorted(value(on, k) / value(off, k) for on, off in pairs)
                    quarter = len(ratios) // 4
                    cells.append(
                        f"{name} {unit} {statistics.median(ratios):.3f} "
                        f"[{ratios[quarter]:.3f}-{ratios[len(ratios) - 1 - quarter]:.3f}]"
                    )
            print(f"    K={k} ({len(pairs)} pairs): " + "; ".join(cells))
    print("  requests per agent by op, medians (start | job):")
    for k in ks:
        for tool in tools:
            runs = store[(tool.name, k)]
            if not runs:
                continue
            ops = sorted(
                {op for run in runs for what in ("start", "total") for op in run[what]["ops"]}
            )
            cells = [
                f"{op} {median([r['start']['ops'].get(op, 0) / k for r in runs]):.1f}"
                f" | {median([r['total']['ops'].get(op, 0) / k for r in runs]):.1f}"
                for op in ops
            ]
            print(f"    K={k} {tool.setting}: " + ", ".join(cells))
    print_shortfalls(failed, short)


def report_recovery(tools, victims, results, failed, conf, cap_s):
    print(
        f"(c) recovery: 3 agents --nnodes=2:3 --max-restarts=3 --rdzv-conf={conf} "
        "(torch 1.13 takes whole seconds); one agent and its workers SIGKILLed;"
    )
    print("    time from the kill to the start of both survivors' new workers (WORLD_SIZE 2)")
    for kind in victims:
        print(
            f"  victim: {'the node of the workers store' if kind == 'store' else 'another node'}"
            f" ({kind})"
        )
        medians = {}
        for tool in tools:
            key = (kind, tool.name)
            if key in failed:
                print(f"    {tool.name}: failed: {failed[key]}")
                continue
            runs = results.get(key, [])
            recovered = [o.seconds for o in runs if o.seconds is not None]
            if not runs:
                print(f"    {tool.name}: not measured")
                continue
            if not recovered:
                print(f"    {tool.name}: {describe(runs[-1], cap_s)} ({len(runs)} runs)")
                if all(o.why == "cap" for o in runs):
                    medians[tool.name] = (cap_s, True)
            else:
                lost = [o for o in runs if o.seconds is None]
                note = f"; {len(lost)} did not recover: {describe(lost[-1], cap_s)}" if lost else ""
                medians[tool.name] = (median(recovered), False)
                print(
                    f"    {tool.name}: median {ms(median(recovered))} ms, "
                    f"{ms(min(recovered))}-{ms(max(recovered))} ({len(recovered)} runs{note})"
                )
            print(f"      victim: {runs[-1].victim}")
        for a, b in ratio_pairs(tools):
            if a in medians and b in medians and not medians[b][1]:
                (num, capped), (den, _) = medians[a], medians[b]
                print(f"    {a}/{b}: {'at least ' if capped else ''}{ratio(num, den)}")


def exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # so that the finally blocks stop every process


def start_etcd(scratch):
    """The benchmark's etcd (v2 API on, for torchrun's etcd backend); SystemExit if it fails."""
    directory = tempfile.mkdtemp(prefix="etcd-", dir=scratch)
    try:
        etcd = launch_etcd(directory, extra_args=["--enable-v2"])
    except EtcdStartError as why:
        raise SystemExit(f"rdzv_bench: {why}") from None
    print(f"rdzv_bench: etcd (pid {etcd.pid}) on {etcd.endpoint}", file=sys.stderr)
    return etcd


def main():
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--torchrun", nargs="+", help="argv prefix that runs torchrun")
    parser.add_argument(
        "--worker",
        required=True,
        help="the worker executable (dlrun-rdzv-probe), the same for every tool",
    )
    parser.add_argument(
        "--backends",
        default="c10d",
        help="dlrun's rendezvous backends, comma-separated: c10d, etcd",
    )
    parser.add_argument(
        "--torchrun-backends", help="torchrun's backends (c10d, etcd, etcd-v2); default: --backends"
    )
    parser.add_argument("--ks", default="2,4,8,16,32")
    parser.add_argument("--only", choices=("rendezvous", "recovery"))
    parser.add_argument(
        "--budget",
        type=float,
        default=200,
        help="seconds for (a): a run is started only if the last one of its "
        "kind says it fits (the first of each K always starts in time)",
    )
    parser.add_argument("--recovery-cap", type=float, default=60)
    parser.add_argument("--recovery-repeats", default="3,1", help="recovery runs of dlrun,torchrun")
    parser.add_argument(
        "--recovery-conf",
        default="last_call_timeout=1",
        help="(c)'s --rdzv-conf, the same for every variant",
    )
    parser.add_argument(
        "--victims", default="other", help="whom (c) kills, comma-separated: store, other"
    )
    parser.add_argument(
        "--control",
        help="on,off: (a) alone, dlrun-c10d on a dlrund --stats per run with "
        "the control plane on and/or off, and the store's counts; no torchrun",
    )
    parser.add_argument(
        "--metrics",
        help="on,off: as --control, for --metrics-port on the agents and dlrund "
        "(on: each scraped and its page polled once a second)",
    )
    parser.add_argument("--dlrund", help="the dlrund executable (--control, --metrics)")
    parser.add_argument(
        "--repeats",
        type=int,
        help="dlrun's runs of (a) per K and variant (default: 5 up to K = 8, then 3)",
    )
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    backends = args.backends.split(",")
    torchrun_backends = (args.torchrun_backends or args.backends).split(",")
    victims = args.victims.split(",")
    for value in backends:
        if value not in ("c10d", "etcd"):
            parser.error(f"unknown backend {value!r} for dlrun (c10d, etcd)")
    for value in torchrun_backends:
        if value not in ("c10d", "etcd", "etcd-v2"):
            parser.error(f"unknown backend {value!r} for torchrun (c10d, etcd, etcd-v2)")
    for value in victims:
        if value not in ("store", "other"):
            parser.error(f"unknown victim {value!r} (store, other)")
    if args.control and args.metrics:
        parser.error("--control and --metrics: one at a time")
    feature = "control" if args.control else "metrics" if args.metrics else None
    settings = (args.control or args.metrics).split(",") if feature else []
    for value in settings:
        if value not in ("on", "off"):
            parser.error(f"unknown --{feature} value {value!r} (on, off)")
    if feature and (
        backends != ["c10d"] or args.torchrun or args.only == "recovery" or not args.dlrund
    ):
        parser.error(f"--{feature} takes dlrun on c10d alone, no torchrun, (a) alone, and --dlrund")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    tools = [Tool("dlrun", b, [args.dlrun], underscores=False) for b in backends]
    if feature:
        tools = [
            Tool(
                "dlrun",
                "c10d",
                [args.dlrun],
                underscores=False,
                feature=feature,
                setting=setting,
                dlrund=args.dlrund,
            )
            for setting in settings
        ]
    if args.torchrun:
        tools += [Tool("torchrun", b, args.torchrun, underscores=True) for b in torchrun_backends]
    scratch = tempfile.mkdtemp(prefix="rdzv-bench-")
    etcd = None
    try:
        if any(t.backend != "c10d" for t in tools):
            etcd = start_etcd(scratch)
        endpoint = etcd.endpoint if etcd else None
        if args.only in (None, "rendezvous"):
            times, failed, short, store = run_rendezvous(
                tools, ks, args.worker, scratch, endpoint, args.budget, args.repeats
            )
            if feature:
                report_onoff(tools, ks, failed, short, store)
            else:
                report_rendezvous(tools, ks, times, failed, short)
        if args.only in (None, "recovery") and not feature:
            dl, tr = (int(x) for x in args.recovery_repeats.split(","))
            results, failed = run_recovery(
                tools,
                victims,
                args.worker,
                scratch,
                endpoint,
                args.recovery_conf,
                args.recovery_cap,
                {"dlrun": dl, "torchrun": tr},
            )
            report_recovery(tools, victims, results, failed, args.recovery_conf, args.recovery_cap)
    finally:
        if etcd:
            etcd.stop()
        if os.environ.get("RDZV_BENCH_KEEP"):
            print(f"rdzv_bench: agent logs and worker records kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
