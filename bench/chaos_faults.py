"""The simulated cluster of bench/chaos_soak.py and the faults it injects (see that file's header).

Cluster: job hosts 0-3 (one dlrun agent each, a small tmpfs each for --log-dir), then the
rendezvous: etcd members on hosts 4-6 (each with its data dir, so a member restarts WITH its
data), or dlrund on host 4; the last host is the observer, which runs etcdctl (every connection
starts inside a namespace; nothing here connects to 10.77.0.x from the root namespace).

EXPECTED below is the table of what each fault may cost: None = any number of restarts, 0 = it
must cost none, 1 = at most one.
"""

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env  # noqa: E402
from dlrund_fixture import stop_process  # noqa: E402
from etcd_fixture import ETCDCTL, member_args  # noqa: E402
from netns_fixture import Hosts  # noqa: E402
from trainer_fixture import descendants  # noqa: E402

JOB_HOSTS = 4
ETCD_MEMBERS = 3
DLRUND_PORT = 29400
TTL_S = 3.0  # the agents' lease: keep_alive_interval (1 s) x keep_alive_max_attempt (3)
SHORT_S = 1.0  # a SIGSTOP / link cut well inside the lease
LONG_S = 6.0  # ... well past it
LOG_TMPFS = "8m"  # each job host's --log-dir: small, so a fault can fill it
START_TIMEOUT_S = 30  # etcd answering, dlrund listening
POLL_S = 0.1

# Fault kind -> (most restarts it may cause (None: any), backends it applies to).
EXPECTED = {
    "agent_kill": (None, ("etcd", "c10d")),  # the node leaves, its new agent joins
    "worker_kill": (None, ("etcd", "c10d")),  # a failed worker group restarts
    "stop_short": (0, ("etcd", "c10d")),  # SIGSTOP agent < lease: nobody notices
    "stop_long": (None, ("etcd", "c10d")),  # SIGSTOP agent > lease: it is dropped
    "link_short": (0, ("etcd", "c10d")),  # link down < lease
    "link_long": (None, ("etcd", "c10d")),  # link down > lease: the node is dropped
    "disk_full": (0, ("etcd", "c10d")),  # a full --log-dir must not stop training
    "late_join": (None, ("etcd", "c10d")),  # a node arriving is admitted at a new round
    "etcd_partition": (0, ("etcd",)),  # agents move to another member
    "etcd_leader_kill": (0, ("etcd",)),  # a new leader is elected
    "etcd_all_down": (0, ("etcd",)),  # a short store outage
    "dlrund_restart": (1, ("c10d",)),  # the store's state is lost: one new round
}
AGENT_LOSS = ("agent_kill", "stop_long", "link_long")  # leave the job with one node fewer


class Agent:
    """One dlrun agent process on a job host."""

    def __init__(self, host, proc, log_path):
        self.host, self.proc, self.log_path = host, proc, log_path
        self.killed = False  # by the injector: its exit code does not count
        self.stopped = False  # SIGSTOPped now

    def alive(self):
        return self.proc.poll() is None


class Cluster:
    def __init__(self, backend, out, bindir):
        self.backend, self.out, self.bindir = backend, out, bindir
        self.n = JOB_HOSTS + (ETCD_MEMBERS if backend == "etcd" else 1) + 1
        self.observer = self.n - 1
        self.hosts = Hosts(self.n)
        self.members = {}  # etcd member host -> Popen
        self.dlrund = None
        self.mounts = []
        self.cuts = []  # host pairs cut from each other (netns.sh heal ends a cut)
        try:
            self._mount_log_disks()
            self.start_etcd() if backend == "etcd" else self.start_dlrund()
        except BaseException:
            self.close()
            raise

    # --- hosts, disks -------------------------------------------------------------------------

    def log_disk(self, host):
        return os.path.join(self.out, f"logdisk{host}")

    def _mount_log_disks(self):
        for host in range(JOB_HOSTS):
            path = self.log_disk(host)
            os.makedirs(path, exist_ok=True)
            self.mounts.append(path)  # first: a signal right after the mount must not leak it
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={LOG_TMPFS}", "tmpfs", path],
                check=True,
                capture_output=True,
                timeout=10,
            )

    def popen(self, host, argv, log_path, env=None):
        log = open(log_path, "ab")
        try:
            return self.hosts.popen(host, argv, stdout=log, stderr=log, env=env)
        finally:
            log.close()

    def close(self):
        """Stops every process by PID, takes the hosts down, unmounts the disks. Idempotent;
        a second SIGTERM or SIGINT waits until it is done (as Hosts.close)."""
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))
        try:
            for proc in list(self.members.values()) + ([self.dlrund] if self.dlrund else []):
                kill_and_reap(proc)
            self.hosts.close()
            for path in self.mounts:
                subprocess.run(["umount", "-l", path], capture_output=True, timeout=10)
            self.mounts = []
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def leftover_pids(self, hosts):
        return {h: pids for h in hosts if (pids := self.hosts.pids(h))}

    # --- etcd ---------------------------------------------------------------------------------

    def member_hosts(self):
        return list(range(JOB_HOSTS, JOB_HOSTS + ETCD_MEMBERS))

    def endpoint(self):
        if self.backend == "etcd":
            return ",".join(f"{self.hosts.address(m)}:2379" for m in self.member_hosts())
        return f"{self.hosts.address(JOB_HOSTS)}:{DLRUND_PORT}"

    def start_member(self, m):
        addresses = {h: self.hosts.address(h) for h in self.member_hosts()}
        self.members[m] = self.popen(
            m,
            member_args(m, addresses, f"{self.out}/etcd{m}", f"chaos-{self.hosts.prefix}"),
            os.path.join(self.out, f"etcd{m}.log"),
        )

    def start_etcd(self):
        for m in self.member_hosts():
            self.start_member(m)
        self.wait_healthy()

    def kill_member(self, m):
        kill_and_reap(self.members[m])

    def etcdctl(self, members, *args):
        endpoints = ",".join(f"{self.hosts.address(m)}:2379" for m in members)
        return self.hosts.run(
            self.observer,
            [
                ETCDCTL,
                f"--endpoints={endpoints}",
                "--dial-timeout=1s",
                "--command-timeout=2s",
                *args,
            ],
            timeout=15,
            env={**os.environ, "ETCDCTL_API": "3"},
        )

    def healthy(self):
        return self.etcdctl(self.member_hosts(), "endpoint", "health").returncode == 0

    def wait_healthy(self, timeout=START_TIMEOUT_S):
        if not wait_for(self.healthy, timeout):
            raise RuntimeError(f"etcd not healthy within {timeout}s")

    def leader(self):
        """The member host every member names as leader, else None (mid-election)."""
        result = self.etcdctl(self.member_hosts(), "endpoint", "status", "-w", "json")
        if result.returncode != 0:
            return None
        statuses = json.loads(result.stdout)
        leaders = {s["Status"].get("leader", 0) for s in statuses}  # 0 (left out): none
        if len(leaders) != 1 or 0 in leaders or len(statuses) != ETCD_MEMBERS:
            return None
        for s in statuses:
            if s["Status"]["header"]["member_id"] in leaders:
                address = s["Endpoint"].split("//")[-1].rsplit(":", 1)[0]
                return next(m for m in self.member_hosts() if self.hosts.address(m) == address)
        return None

    def wait_leader(self, timeout=START_TIMEOUT_S):
        leader = None

        def found():
            nonlocal leader
            leader = self.leader()
            return leader is not None

        wait_for(found, timeout)
        return leader

    def cut(self, i, j):
        self.hosts.cut(i, j)
        self.cuts.append((i, j))

    def heal_cuts(self):
        for i, j in self.cuts:
            self.hosts.heal(i, j)
        self.cuts = []

    # --- dlrund -------------------------------------------------------------------------------

    def start_dlrund(self):
        log_path = os.path.join(self.out, "dlrund.log")
        start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        self.dlrund = self.popen(
            JOB_HOSTS,
            [
                os.path.join(self.bindir, "dlrund"),
                "--host",
                self.hosts.address(JOB_HOSTS),
                "--port",
                str(DLRUND_PORT),
            ],
            log_path,
        )
        if not wait_for(
            lambda: b"listening on" in read_from(log_path, start),
            START_TIMEOUT_S,
            lambda: self.dlrund.poll() is not None,
            every=POLL_S / 10,
        ):
            raise RuntimeError(f"dlrund did not start: {read_from(log_path, start)!r}")

    def restart_dlrund(self):
        kill_and_reap(self.dlrund)
        self.start_dlrund()

    # --- agents -------------------------------------------------------------------------------

    def start_agent(self, host, job):
        conf = "join_timeout=300" + (",is_host=0" if self.backend == "c10d" else "")
        log_dir = os.path.join(self.log_disk(host), f"job{job.index}")
        argv = [
            os.path.join(self.bindir, "dlrun"),
            "--nnodes=2:4",
            "--nproc-per-node=1",
            f"--rdzv-backend={self.backend}",
            f"--rdzv-endpoint={self.endpoint()}",
            f"--rdzv-id={job.rdzv_id}",
            "--max-restarts=1000",
            f"--rdzv-conf={conf}",
            f"--log-dir={log_dir}",
            "--tee=3",
            "--stop-timeout=5",
            "train",
            *job.trainer_args,
        ]
        env = clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=job.dir)
        count = sum(1 for a in job.agents if a.host == host)
        log_path = os.path.join(job.dir, f"agent{host}-{count}.log")
        agent = Agent(host, self.popen(host, argv, log_path, env=env), log_path)
        job.agents.append(agent)
        return agent

    def workers(self, agent):
        """The trainer processes under an agent (their exe is dlrun-train)."""
        train = os.path.realpath(os.path.join(self.bindir, "dlrun-train"))
        return [p for p in descendants(agent.proc.pid) if exe_of(p) == train]

    def link(self, host, up):
        self.hosts.link(host, up)


# --- processes -------------------------------------------------------------------------------


def stop_on_sigterm(signum, frame):
    """A bench's SIGTERM handler: raised in the main thread, so every finally runs (processes
    killed by PID, hosts down, disks unmounted); netns_fixture's own handler, installed after
    this one, takes the hosts down first, then calls it."""
    raise SystemExit(143)


def kill_and_reap(proc):
    if proc is not None:
        stop_process(proc, signal.SIGKILL)


def signal_pid(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def exe_of(pid):
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return None


def wait_for(predicate, timeout, stop=lambda: False, every=POLL_S):
    """Polls `predicate` until it holds (True), or `timeout` s pass or `stop` holds (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline or stop():
            return False
        time.sleep(every)
    return True


def read_from(path, offset):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


def fill_disk(path):
    """Writes zeros to path/fill until the tmpfs is full (ENOSPC); returns the file's path."""
    target = os.path.join(path, "fill")
    chunk = b"\0" * (1 << 20)
    with open(target, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:  # the last partial MiB too, so not one more block is free
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return target


# --- the faults ------------------------------------------------------------------------------
# Each takes (cluster, job, rng), injects, holds, heals, and returns (target, t_heal, t_end):
# t_heal the wall time (time.time()) the fault ended, t_end when its last effect began (a killed
# agent's replacement starting; else t_heal); the soak stamps the injection itself.
# They raise Skip when the state offers no target.


class Skip(Exception):
    pass


def twice(t):
    return t, t


def live_agents(job):
    """The agents a fault may hit: running, neither killed nor being stopped."""
    return [a for a in job.agents if a.alive() and not a.killed and not a.stopped]


def pick_agent(job, rng):
    agents = live_agents(job)
    if not agents:
        raise Skip("no agent")
    return rng.choice(agents)


def agent_kill(cluster, job, rng):
    agent = pick_agent(job, rng)
    agent.killed = True
    workers = cluster.workers(agent)
    kill_and_reap(agent.proc)
    # The real node loss takes its workers too (dlrun's own PDEATHSIG should already have).
    for pid in workers:
        signal_pid(pid, signal.SIGKILL)
    t_heal = time.time()
    job.pause(rng.uniform(2.0, 5.0))
    if not job.ending():
        cluster.start_agent(agent.host, job)  # the node comes back: a new agent process
    return f"host{agent.host}", t_heal, time.time()


def worker_kill(cluster, job, rng):
    candidates = [(a, w) for a in live_agents(job) for w in cluster.workers(a)]
    if not candidates:
        raise Skip("no worker")
    agent, pid = rng.choice(candidates)
    signal_pid(pid, signal.SIGKILL)
    return f"host{agent.host}", *twice(time.time())


def _stop(cluster, job, rng, seconds):
    agent = pick_agent(job, rng)
    agent.stopped = True
    signal_pid(agent.proc.pid, signal.SIGSTOP)
    try:
        job.pause(seconds)
    finally:
        signal_pid(agent.proc.pid, signal.SIGCONT)
        agent.stopped = False
    return f"host{agent.host}", *twice(time.time())


def stop_short(cluster, job, rng):
    return _stop(cluster, job, rng, SHORT_S)


def stop_long(cluster, job, rng):
    return _stop(cluster, job, rng, LONG_S)


def _link(cluster, job, rng, seconds):
    agent = pick_agent(job, rng)
    cluster.link(agent.host, up=False)
    try:
        job.pause(seconds)
    finally:
        cluster.link(agent.host, up=True)
    return f"host{agent.host}", *twice(time.time())


def link_short(cluster, job, rng):
    return _link(cluster, job, rng, SHORT_S)


def link_long(cluster, job, rng):
    return _link(cluster, job, rng, LONG_S)


def disk_full(cluster, job, rng):
    agent = pick_agent(job, rng)
    path = fill_disk(cluster.log_disk(agent.host))
    try:
        job.pause(rng.uniform(3.0, 6.0))
    finally:
        os.unlink(path)
    return f"host{agent.host}", *twice(time.time())


def late_join(cluster, job, rng):
    free = [h for h in range(JOB_HOSTS) if not any(a.host == h for a in job.agents)]
    if not free:
        raise Skip("every host has joined")
    host = rng.choice(free)
    cluster.start_agent(host, job)
    return f"host{host}", *twice(time.time())


def etcd_partition(cluster, job, rng):
    members = cluster.member_hosts()
    m = rng.choice(members)
    for other in members:
        if other != m:
            cluster.cut(m, other)
    try:
        job.pause(rng.uniform(3.0, 6.0))
    finally:
        cluster.heal_cuts()
    cluster.wait_healthy()
    return f"m{m}", *twice(time.time())


def etcd_leader_kill(cluster, job, rng):
    leader = cluster.wait_leader()
    if leader is None:
        raise Skip("no leader")
    cluster.kill_member(leader)
    job.pause(rng.uniform(1.0, 3.0))
    cluster.start_member(leader)  # with its data dir
    cluster.wait_healthy()
    return f"m{leader}", *twice(time.time())


def etcd_all_down(cluster, job, rng):
    for m in cluster.member_hosts():
        cluster.kill_member(m)
    job.pause(rng.uniform(3.0, 8.0))
    for m in cluster.member_hosts():
        cluster.start_member(m)
    cluster.wait_healthy()
    return "all", *twice(time.time())


def dlrund_restart(cluster, job, rng):
    cluster.restart_dlrund()
    return "dlrund", *twice(time.time())


INJECT = {name: globals()[name] for name in EXPECTED}


def valid_kinds(backend, job, steady):
    """The fault kinds that may be injected now: never fewer than 2 agents left; a fault that must
    cost no restart only while the job trains steadily (so a restart under way is not charged to
    it); late_join only while a host has not joined."""
    live = live_agents(job)
    kinds = []
    for kind, (cost, backends) in EXPECTED.items():
        if backend not in backends:
            continue
        if kind in AGENT_LOSS and len(live) < 3:
            continue
        if cost == 0 and not steady:
            continue
        if kind == "late_join" and all(
            any(a.host == h for a in job.agents) for h in range(JOB_HOSTS)
        ):
            continue
        if not live:
            continue
        kinds.append(kind)
    return kinds
