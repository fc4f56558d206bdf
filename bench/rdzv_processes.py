"""The processes of rdzv_bench.py's runs: a variant's command line (Tool), one run's agents,
their workers' records and dlrund (Job), and what reads /proc about them (start times,
descendants, listening sockets, CPU) or kills them by PID; dlrund --stats's lines parsed.
"""

import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env, free_port  # noqa: E402  (after the path)
from dlrund_fixture import Dlrund, read_line  # noqa: E402
from metrics_watch import AGENT_LINE, DLRUND_LINE  # noqa: E402

POLL_S = 0.01  # how often a deadline-bounded wait looks again
EXIT_POLL_S = 0.005  # how often the agents' exits are looked for
STATS_TIMEOUT_S = 10  # dlrund --stats must print its line this soon after SIGUSR1/SIGTERM
KILL_WAIT_S = 10
WORKER_NAME = b"dlrun-rdzv-probe"


# Here, not in rdzv_bench.py, so the report can show the cap without importing the runs.
def rendezvous_timeout(k):
    return 30 + 3 * k


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
