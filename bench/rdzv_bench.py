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
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from etcd_fixture import EtcdStartError, launch_etcd  # noqa: E402  (after the path)
from metrics_watch import Watcher  # noqa: E402
from rdzv_processes import (  # noqa: E402
    POLL_S,
    Failed,
    Job,
    Tool,
    children_cpu,
    descendants,
    holds_socket,
    kill_agent,
    kill_worker,
    listeners,
    listening,
    process_cpu,
    rendezvous_timeout,
    start_time,
)
from rdzv_report import (  # noqa: E402
    describe,
    report_onoff,
    report_recovery,
    report_rendezvous,
)

EXIT_TIMEOUT_S = 30  # agents must exit this long after their workers did

# Runs per K of (a) for each variant of (dlrun, torchrun). torchrun's agents each import torch
# (about 1.5 s of CPU), so its large K are run fewer times; the budget may cut rounds further.
REPEATS = {2: (5, 3), 4: (5, 3), 8: (5, 2), 16: (3, 1), 32: (3, 1)}
DEFAULT_REPEATS = (3, 1)


# --- (a) rendezvous ------------------------------------------------------------------------


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
