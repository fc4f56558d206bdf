"""The faults of bench/recovery_bench.py's cases, as recovery_trials.py's Trial deals them:
which worker, host or agent of a running trial is hit (even trials rank 0's, odd another), the
kill or stop itself, stamped right before it; and the cases (the hosts with agents, --nnodes,
the world before and after).
"""

import json
import os
import signal

from chaos_faults import kill_and_reap, signal_pid, wait_for
from rdzv_processes import start_time

SETTLE_S = 2.0  # more steady time where a spare must be in place before the fault
# More steady time before a worker's fault, for every launcher alike: a fault comes minutes into
# a job, by when dlrun's zygote has forked its standbys (one a quiet second) and, with
# --ready-replacements, a worker started ahead waits for each local rank (2 s after the
# round's start, then their own start).
WORKER_SETTLE_S = 4.0
ORPHAN_GRACE_S = 0.5  # an agent's workers still running this long after it was killed
POLL_S = 0.02
HANG_TIMEOUT_S = 5  # the hang case's --hang-timeout


class Case:
    """A fault and the job it hits: the hosts with agents, --nnodes (None: --standalone), the
    world before the fault and after recovery (in nproc units), and the fault itself."""

    def __init__(self, name, title, hosts, nnodes, world, world_after, settle, fault):
        self.name, self.title, self.hosts, self.nnodes = name, title, hosts, nnodes
        self.world, self.world_after, self.settle, self.fault = world, world_after, settle, fault


class Failed(Exception):
    """A trial that failed; `kind` sorts it for the table: "start" (never trained steadily),
    "hang" (no step by the deadline, the agents still running), "exit" (an agent exited before
    recovering), "stop" (no clean exit after the stop file), "twice" (a checkpointed step taken
    again), "replaced" (in process: a survivor's process is gone), "checkpoint" (in process: a
    rank read the checkpoint file after the fault), "setup" (the benchmark's own: no victim, no
    dlrund)."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def running_workers(out):
    """The worker processes of `out` that run now: their procs/ records."""
    found = []
    directory = os.path.join(out, "procs")
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        try:
            with open(os.path.join(directory, name)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if is_worker(record):
            found.append(record)
    return found


def is_worker(record):
    """Whether the worker of `record` still runs (its PID, started when it says: not a reused
    PID)."""
    return start_time(record["pid"]) == record["ticks"]


def host_index(name):
    return int(name[len("node") :]) if name.startswith("node") else None


# --- the faults ------------------------------------------------------------------------------
# Each takes the trial, picks its victim from the trial's number (even: rank 0's, odd: another,
# so both kinds come up alike for every launcher), calls trial.stamp_fault() right before the
# kill, and returns a note or None.


def victim_worker(trial, rank):
    mine = [w for w in running_workers(trial.dir) if w["rank"] == rank]
    if not mine:
        raise Failed("setup", f"no running worker of rank {rank} to kill")
    return mine[0]


def signal_worker(trial, sig):
    """Sends `sig` to rank 0's worker (even trials) or the node's last (odd)."""
    rank = 0 if trial.index % 2 == 0 else trial.nproc - 1
    worker = victim_worker(trial, rank)
    trial.victims.add(worker["pid"])
    trial.stamp_fault()
    signal_pid(worker["pid"], sig)
    return None


def kill_worker(trial):
    return signal_worker(trial, signal.SIGKILL)


def stop_worker(trial):
    """SIGSTOP, as a hang: the launcher's hang watch must find it (--hang-timeout)."""
    return signal_worker(trial, signal.SIGSTOP)


def victim_host(trial):
    """The host of rank 0 (even trials) or another host with running workers (odd)."""
    rank0 = host_index(victim_worker(trial, 0)["host"])
    if trial.index % 2 == 0:
        return rank0
    others = sorted({host_index(w["host"]) for w in running_workers(trial.dir)} - {rank0})
    if not others:
        raise Failed("setup", "no second host with running workers")
    return others[0]


def kill_host(trial):
    host = victim_host(trial)
    pids = trial.hosts.pids(host)
    trial.victims.update(
        w["pid"] for w in running_workers(trial.dir) if host_index(w["host"]) == host
    )
    trial.stamp_fault()
    for pid in pids:  # at once, by PID
        signal_pid(pid, signal.SIGKILL)
    trial.killed.add(host)
    # netns.sh kill makes sure nothing is left (a process forked as they were signalled) once
    # the recovery is measured: a shell looking every 20 ms until the killed processes are gone
    # would take 10-20 ms of the cores the job recovers on.
    trial.sweep.add(host)
    return None


def kill_agent(trial):
    """SIGKILLs the agent alone. A lost node takes its workers with it: those still running
    ORPHAN_GRACE_S later (torchrun's run in sessions of their own, with no PDEATHSIG) are
    SIGKILLed then, and the note says so; the recovery still counts from the agent's kill."""
    host = victim_host(trial)
    workers = [w for w in running_workers(trial.dir) if host_index(w["host"]) == host]
    agent = trial.agents[host]
    trial.victims.update(w["pid"] for w in workers)
    trial.stamp_fault()
    signal_pid(agent.pid, signal.SIGKILL)
    trial.killed.add(host)
    wait_for(lambda: not any(is_worker(w) for w in workers), ORPHAN_GRACE_S, every=POLL_S / 4)
    orphans = [w for w in workers if is_worker(w)]
    for w in orphans:
        signal_pid(w["pid"], signal.SIGKILL)
    kill_and_reap(agent)
    if orphans:
        return f"{len(orphans)} of {len(workers)} workers outlived their agent"
    return None


CASES = {
    "worker": Case(
        "worker", "one worker SIGKILLed", (0,), None, 1, 1, WORKER_SETTLE_S, kill_worker
    ),
    "host": Case(
        "host", "a member host killed, a spare waiting", (0, 1, 2), "2", 2, 2, SETTLE_S, kill_host
    ),
    "agent": Case("agent", "an agent SIGKILLed", (0, 1), "1:2", 2, 1, 0.0, kill_agent),
    "hang": Case(
        "hang",
        f"one worker SIGSTOPped, --hang-timeout={HANG_TIMEOUT_S:g}",
        (0,),
        None,
        1,
        1,
        WORKER_SETTLE_S,
        stop_worker,
    ),
}
