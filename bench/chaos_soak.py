"""A seeded chaos soak for dlrun: the bundled trainer, elastic (--nnodes=2:4), on 4 simulated
hosts (network namespaces, scripts/netns.sh), on etcd (3 members on hosts of their own) and/or
on c10d behind dlrund, while a seeded injector applies one fault every --interval seconds.

Jobs run back to back (a new --rdzv-id each, --max-steps sized to about a minute of training)
until --duration is spent; host 3's agent starts late (the late_join fault) and an agent the
injector kills is started again on its host a few seconds later. Faults stop when the duration
ends; the last job must then end within FINISH_S or the soak fails. The faults and what each may
cost are in bench/chaos_faults.py (EXPECTED). Faults are sequential (inject, hold, heal); the
kind is a seeded choice among the kinds valid now with the fewest injections so far, so every
kind comes up. A fault that must cost no restart is only injected while the job trains steadily
(a step within STEADY_S, every live agent in the world), so a restart under way is not charged
to it.

The history checks, per job (see check_job):
- exit: every agent the injector did not SIGKILL exits 0; every agent exits within FINISH_S of
  the job's end (the first exit).
- steps: rank 0 appends a line per step to the metrics file ({"kind":"step","step":N,
  "restart":R,"time":T}). An attempt is a maximal run of step lines with the same "restart" whose
  steps follow each other (N, N+1, ...). A new attempt resumes from the newest checkpoint, which
  is written (--checkpoint-every 1) just after its step's line: it starts at K+1 where K is the
  last step of the attempt before (the checkpoint was written) or K-1 (killed between the line
  and the checkpoint) -- at most REDO_MAX step is taken again, never one skipped. Replaying the
  attempts in order (each truncating the lineage to its first step - 1) must give exactly
  1..--max-steps, each step once.
- restarts: each attempt after the first is one restart (a "restart" going up by k counts k:
  rounds that trained no step). Its time is the first restart line an agent logged (stamped by
  a monitor thread as it appears) after the previous attempt's last step. It is charged to the
  fault in effect then: injected before it and healed less than GRACE_S before it (a restart may
  come a few seconds late: a lease lapsing, a new node's round); a fault that may cost restarts
  is preferred to one that must not, the newest first. A restart charged to a fault of cost 0,
  more than EXPECTED allows for one fault, or to no fault at all (after the first step) fails.
- recovery of a fault: from its injection until training progresses again: the first step line
  of a later attempt for a fault charged a restart, else the first step line after it healed --
  the table's median and worst.
- processes: once a job ended no process is left on the job hosts (netns.sh pids); at the end
  none of the soak's processes runs.
Prints a table (fault kind | count | restarts caused | median | worst recovery) and PASSED, or
FAILED with the failed checks and the command that replays the seed. Needs root.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

from chaos_faults import (
    EXPECTED,
    INJECT,
    JOB_HOSTS,
    TTL_S,
    Cluster,
    Skip,
    live_agents,
    read_from,
    stop_on_sigterm,
    valid_kinds,
    wait_for,
)
from dlrun_fixture import is_running  # chaos_faults puts tests/python on the path

FINISH_S = 120  # the last job ends within this after the faults stop
JOB_STEPS = 8000  # --max-steps of a job: 30-80 s at 2-4 nodes on 2 cores
GRACE_S = 10.0  # a restart this long after a fault healed is still its doing
GRACE_ZERO_S = TTL_S + 3.0  # ... for a fault that must cost none
STEADY_S = 2.0  # a step this recent and every live agent in the world: steady
STEADY_WAIT_S = 30.0  # how long the injector waits for steady training
REDO_MAX = 1  # steps a restart may take again (those after its checkpoint)
MONITOR_S = 0.2
BINARIES = ("dlrun", "dlrund", "dlrun-train", "dlrun-train-avx2.so")
RESTART_LINE = re.compile(
    r"stopping workers|re-rendezvous|worker group failed|restarting|"
    r"lost the rendezvous store"
)


class Job:
    """One dlrun job: its agents, and what the monitor thread has seen of its files."""

    def __init__(self, index, out, prefix, steps, soak_over):
        self.index = index
        self.dir = os.path.join(out, f"job{index}")
        os.makedirs(self.dir)
        self.rdzv_id = f"chaos-{prefix}-{index}"
        self.metrics = os.path.join(self.dir, "metrics.jsonl")
        self.steps = steps
        self.trainer_args = [
            "--synthetic",
            "--hidden",
            "32",
            "--allreduce",
            "gloo",
            "--epochs",
            "100000",
            "--lr-schedule",
            "constant",
            "--batch-size",
            "128",
            "--checkpoint-dir",
            os.path.join(self.dir, "checkpoints"),
            "--checkpoint-every",
            "1",
            "--progress-every",
            "1",
            "--metrics-file",
            self.metrics,
            "--max-steps",
            str(steps),
        ]
        self.agents = []
        self.lines = []  # the metrics file's step lines, parsed
        self.restart_lines = []  # (time, host, line) of agents' restart lines
        self.lock = threading.Lock()
        self.poll_lock = threading.Lock()
        self.offsets = {}
        self.ended_at = None  # time.time() of the first agent exit
        self.soak_over = soak_over

    def pause(self, seconds):
        time.sleep(seconds)  # the injector's own pacing (a fault's hold), not a synchronisation

    def ending(self):
        return self.ended_at is not None or self.soak_over()

    def poll(self):
        """Reads what is new in the metrics file and the agents' logs (the monitor thread, and
        the main thread once the job ended: one at a time, so no line is read twice)."""
        with self.poll_lock:
            self._poll()

    def _poll(self):
        for line in self._new_lines(self.metrics):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "step":
                with self.lock:
                    self.lines.append(record)
        now = time.time()
        for agent in list(self.agents):
            for line in self._new_lines(agent.log_path):
                if RESTART_LINE.search(line):
                    with self.lock:
                        self.restart_lines.append((now, agent.host, line.strip()))
        # The job ended when an agent finished (exit 0); an agent failing is the checks' to say.
        if self.ended_at is None and any(a.proc.poll() == 0 for a in self.agents):
            self.ended_at = now

    def _new_lines(self, path):
        offset = self.offsets.get(path, 0)
        data = read_from(path, offset)
        end = data.rfind(b"\n") + 1
        self.offsets[path] = offset + end
        return data[:end].decode(errors="replace").splitlines()

    def steady(self):
        with self.lock:
            last = self.lines[-1] if self.lines else None
            recent = [t for t, _, _ in self.restart_lines if t > time.time() - STEADY_S - 1]
        live = live_agents(self)
        return (
            last is not None
            and last["time"] > time.time() - STEADY_S
            and not recent
            and last["world_size"] == len(live)
            and last["step"] < self.steps
        )


class Monitor(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.job = None
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(MONITOR_S):
            job = self.job
            if job is not None:
                job.poll()


# --- the injector ----------------------------------------------------------------------------


def choose(kinds, counts, rng):
    """The seeded choice among the valid kinds injected least so far."""
    fewest = min(counts.get(k, 0) for k in kinds)
    return rng.choice(sorted(k for k in kinds if counts.get(k, 0) == fewest))


def inject_faults(cluster, job, rng, interval, counts, faults):
    """Faults into `job` until it ends or the soak's duration is spent."""
    next_at = time.time() + interval
    while not job.ending():
        if not wait_for(lambda: time.time() >= next_at, interval + 1, job.ending, MONITOR_S):
            break
        steady = wait_for(job.steady, STEADY_WAIT_S, job.ending, MONITOR_S)
        if job.ending():
            break
        kinds = valid_kinds(cluster.backend, job, steady)
        if not kinds:
            next_at = time.time() + 1
            continue
        kind = choose(kinds, counts, rng)
        t_inject = time.time()
        try:
            target, t_heal, t_end = INJECT[kind](cluster, job, rng)
        except Skip:
            next_at = time.time() + 1
            continue
        counts[kind] = counts.get(kind, 0) + 1
        faults.append(
            {
                "kind": kind,
                "target": target,
                "backend": cluster.backend,
                "job": job.index,
                "inject": t_inject,
                "heal": t_heal,
                "end": t_end,
                "steady": steady,
                "restarts": 0,
                "recovery": None,
            }
        )
        print(
            f"  {time.strftime('%H:%M:%S')} job{job.index} {kind} {target} "
            f"({t_heal - t_inject:.1f}s)",
            flush=True,
        )
        next_at = max(t_end + 1.0, t_inject + interval)


# --- the checks ------------------------------------------------------------------------------


def attempts(lines):
    """The step lines cut into attempts: (restart, [lines]) in file order."""
    result = []
    for line in lines:
        if (
            result
            and result[-1][0] == line["restart"]
            and line["step"] == result[-1][1][-1]["step"] + 1
        ):
            result[-1][1].append(line)
        else:
            result.append((line["restart"], [line]))
    return result


def check_steps(job, runs, errors):
    """The lineage: every step 1..S exactly once, at most REDO_MAX redone at a restart."""
    lineage, redone = [], 0
    for restart, lines in runs:
        first = lines[0]["step"]
        if first - 1 > len(lineage):
            errors.append(
                f"job{job.index}: steps {len(lineage) + 1}..{first - 1} skipped "
                f"(attempt restart={restart} starts at {first})"
            )
        elif len(lineage) - (first - 1) > REDO_MAX:
            errors.append(
                f"job{job.index}: attempt restart={restart} redoes "
                f"{len(lineage) - first + 1} steps from {first} (at most {REDO_MAX})"
            )
        redone += max(0, len(lineage) - (first - 1))
        lineage = lineage[: first - 1] + [line["step"] for line in lines]
    if lineage != list(range(1, job.steps + 1)):
        errors.append(
            f"job{job.index}: the lineage has {len(lineage)} steps, ends at "
            f"{lineage[-1] if lineage else None}; want 1..{job.steps} once each"
        )
    return redone


def restart_events(job, runs):
    """(time, count) of each restart: attempt boundaries, timed by the agents' restart lines."""
    events = []
    with job.lock:
        stamps = sorted(job.restart_lines)
    for (r0, before), (r1, after) in zip(runs, runs[1:]):
        last = before[-1]["time"]
        later = [(t, f"host{h}: {line}") for t, h, line in stamps if last < t <= after[0]["time"]]
        when, why = later[0] if later else (last, "no agent said why")
        events.append((when, r1 - r0 if r1 > r0 else 1, why))
    return events


def charge(faults, when):
    """The fault a restart at `when` is charged to, or None."""

    def grace(f):
        return GRACE_ZERO_S if EXPECTED[f["kind"]][0] == 0 else GRACE_S

    in_effect = [f for f in faults if f["inject"] <= when <= f["end"] + grace(f)]
    allowed = [f for f in in_effect if EXPECTED[f["kind"]][0] != 0]
    pool = allowed or in_effect
    return max(pool, key=lambda f: f["inject"]) if pool else None


def recovery(fault, runs):
    """Seconds from injection until training progresses again: for a fault charged a restart,
    the first step of a later attempt than the one at its injection; else the first step after
    the fault healed."""
    attempt_at = 0
    for i, (_, lines) in enumerate(runs):
        if lines[0]["time"] <= fault["inject"]:
            attempt_at = i
    for i, (_, lines) in enumerate(runs):
        if fault["restarts"] and i <= attempt_at:
            continue
        after = fault["inject"] if fault["restarts"] else fault["heal"]
        for line in lines:
            if line["time"] > after:
                return line["time"] - fault["inject"]
    return None


def check_job(cluster, job, faults, errors):
    with job.lock:
        lines = list(job.lines)
    runs = attempts(lines)
    redone = check_steps(job, runs, errors)
    job_faults = [f for f in faults if (f["backend"], f["job"]) == (cluster.backend, job.index)]
    restarts = 0
    for when, count, why in restart_events(job, runs):
        restarts += count
        fault = charge(job_faults, when)
        if fault is None:
            errors.append(
                f"job{job.index}: {count} restart(s) at "
                f"{time.strftime('%H:%M:%S', time.localtime(when))} with no fault "
                f"in effect ({why})"
            )
            continue
        fault["restarts"] += count
        fault.setdefault("why", why)
    for fault in job_faults:
        fault["recovery"] = recovery(fault, runs)
        cost = EXPECTED[fault["kind"]][0]
        if cost is not None and fault["restarts"] > cost:
            errors.append(
                f"job{job.index}: {fault['kind']} on {fault['target']} at "
                f"{time.strftime('%H:%M:%S', time.localtime(fault['inject']))} "
                f"caused {fault['restarts']} restart(s); at most {cost} expected "
                f"(first: {fault['why']})"
            )
    for agent in job.agents:
        if not agent.killed and agent.proc.returncode != 0:
            errors.append(
                f"job{job.index}: the agent on host{agent.host} exited with "
                f"{agent.proc.returncode} ({agent.log_path})"
            )
    print(
        f"  job{job.index}: {len(lines)} step lines, {len(runs)} attempts, {restarts} "
        f"restarts, {redone} steps redone, {len(job.agents)} agents",
        flush=True,
    )


def finish_job(cluster, job, errors):
    """Waits for every agent to exit (FINISH_S after the first exit, or after the soak's end)."""
    wait_for(lambda: job.ended_at is not None, FINISH_S)
    wait_for(lambda: all(a.proc.poll() is not None for a in job.agents), FINISH_S)
    for agent in job.agents:
        if agent.proc.poll() is None:
            errors.append(
                f"job{job.index}: the agent on host{agent.host} still runs "
                f"{FINISH_S}s after the job ended ({agent.log_path}); killed"
            )
            agent.killed = True
            agent.proc.kill()
            agent.proc.wait(10)
    hosts = range(JOB_HOSTS)
    if not wait_for(lambda: not cluster.leftover_pids(hosts), 10):
        errors.append(
            f"job{job.index}: processes left on the job hosts: {cluster.leftover_pids(hosts)}"
        )
    job.poll()
    for host in hosts:  # the small log disks hold one job's logs at a time
        shutil.rmtree(os.path.join(cluster.log_disk(host), f"job{job.index}"), ignore_errors=True)


# --- one backend -----------------------------------------------------------------------------


def soak_backend(backend, args, out, bindir, counts, faults, errors):
    rng = random.Random(f"{args.seed}-{backend}")
    out = os.path.join(out, backend)
    os.makedirs(out)
    monitor = Monitor()
    monitor.start()
    pids = []
    cluster = Cluster(backend, out, bindir)
    try:
        pids += [p.pid for p in cluster.members.values()]
        deadline = time.time() + args.duration_per_backend
        index = 0
        while time.time() < deadline:
            job = Job(index, out, cluster.hosts.prefix, args.steps, lambda: time.time() >= deadline)
            monitor.job = job
            for host in range(JOB_HOSTS - 1):  # host 3 joins late (a fault)
                cluster.start_agent(host, job)
            inject_faults(cluster, job, rng, args.interval, counts, faults)
            finish_job(cluster, job, errors)
            check_job(cluster, job, faults, errors)
            pids += [a.proc.pid for a in job.agents]
            index += 1
    finally:
        monitor.done.set()
        if cluster.dlrund is not None:
            pids.append(cluster.dlrund.pid)
        pids += [p.pid for p in cluster.members.values()]
        cluster.close()
    left = [p for p in pids if is_running(p)]
    if left:
        errors.append(f"{backend}: processes of the soak still run: {left}")


# --- the report ------------------------------------------------------------------------------


def seconds(value):
    return "-" if value is None else f"{value:.1f}s"


def table(faults):
    rows = [
        ("fault kind", "count", "restarts caused", "expected", "median recovery", "worst recovery")
    ]
    for kind, (cost, _) in EXPECTED.items():
        mine = [f for f in faults if f["kind"] == kind]
        if not mine:
            continue
        recoveries = [f["recovery"] for f in mine if f["recovery"] is not None]
        rows.append(
            (
                kind,
                str(len(mine)),
                str(sum(f["restarts"] for f in mine)),
                "any" if cost is None else f"<= {cost} each",
                seconds(statistics.median(recoveries) if recoveries else None),
                seconds(max(recoveries) if recoveries else None),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--duration", type=float, default=600, help="seconds of faults")
    parser.add_argument("--backend", choices=("etcd", "c10d", "both"), default="both")
    parser.add_argument("--interval", type=float, default=6.0, help="seconds between faults")
    parser.add_argument("--steps", type=int, default=JOB_STEPS, help="--max-steps of a job")
    parser.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    parser.add_argument("--out", help="the logs' directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    parser.add_argument("--json", help="also write the faults and checks to this file")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    backends = ("etcd", "c10d") if args.backend == "both" else (args.backend,)
    args.backends = backends
    args.duration_per_backend = args.duration / len(backends)
    return args


def snapshot(bindir, into):
    """Copies of the binaries the soak runs: one build throughout, even when the build directory
    is rebuilt meanwhile (an executable half-written by the linker fails with 126)."""
    os.makedirs(into, exist_ok=True)
    for name in BINARIES:
        source = os.path.join(bindir, name)
        if os.path.exists(source):
            shutil.copy2(source, os.path.join(into, name))
    return into


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if os.geteuid() != 0:
        print("chaos_soak: needs root (network namespaces)", file=sys.stderr)
        return 2
    out = args.out or tempfile.mkdtemp(prefix="dlrun-chaos-")
    os.makedirs(out, exist_ok=True)
    bindir = snapshot(os.path.join(args.build, "bin"), os.path.join(out, "bin"))
    replay = (
        f"bench/chaos_soak.sh --seed {args.seed} --duration {args.duration:g} "
        f"--backend {args.backend}"
    )
    print(
        f"chaos soak: seed {args.seed}, {args.duration:g}s on {', '.join(args.backends)}, "
        f"a fault every {args.interval:g}s, logs in {out}",
        flush=True,
    )
    counts, faults, errors = {}, [], []
    try:
        for backend in args.backends:
            print(f"{backend}:", flush=True)
            soak_backend(backend, args, out, bindir, counts, faults, errors)
    except Exception as e:  # a soak that could not run is a failure with its seed too
        errors.append(f"the soak itself failed: {type(e).__name__}: {e}")
    print(f"\nseed {args.seed}, {len(faults)} faults\n{table(faults)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "faults": faults, "errors": errors}, f, indent=1)
    if errors:
        print("\n".join(["", "checks failed:", *(f"  {e}" for e in errors)]))
        print(f"FAILED (replay: {replay}); logs kept in {out}", flush=True)
        return 1
    print(
        "PASSED: every agent exited 0, every step once, no process left, no restart beyond "
        "its fault's cost",
        flush=True,
    )
    if not args.keep and not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
