"""Large launches: launch to the last worker started, dlrun against torchrun (torch 1.13), for
scale_bench.sh.

Shapes K x N (default 1x1024, 2x3000, 4x4000): K agents on loopback started at once, each
    --nnodes=K --nproc-per-node=N --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT
    --rdzv-id=ID --no-python dlrun-rank-probe FILE
(torchrun: the underscore spellings, which are all torch 1.13 knows, and --monitor_interval=0.1
so its agents notice their workers' exits sooner), each agent in a process group of its own,
output to files. Every worker is dlrun-rank-probe (bench/rank_probe.cpp): it appends "RANK
START_NS TF_CONFIG_BYTES" to FILE in one write and exits. Measured, on CLOCK_MONOTONIC: from just
before the first agent is launched to the latest START_NS ("to last start"), and to the last
agent's exit. A run counts when every rank 0..K*N-1 started exactly once and every agent exited
0. Per worker: "to last start" over the K*N ranks. CPU: user and system time of the agents and of
every process they reaped (RUSAGE_CHILDREN), per worker.

dlrun runs each shape --repeats times (medians are shown); torchrun once, cut off after
--torchrun-budget seconds (its row then says how many of its workers had started by then), and
not at all on shapes larger than one it could not finish. A shape is started only while the
overall --budget lasts. The floor row: the probe started N times back to back by this script
(os.posix_spawn), all then waited for: what any launcher pays per worker on this machine.
Every agent is killed by its process group on a timeout and dies with this script
(PR_SET_PDEATHSIG); the probes exit at once.
"""

import argparse
import ctypes
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_of_children():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Run:
    """One launch of K agents; fills in the figures or `failed` (why it did not count)."""

    def __init__(self, launcher, agents, nproc):
        self.launcher = launcher
        self.agents = agents
        self.nproc = nproc
        self.to_last_start = None  # seconds
        self.to_exit = None
        self.cpu = None
        self.failed = None


def launch(run, argv_of_agent, scratch, timeout):
    """Starts run.agents agents (argv_of_agent(i)), waits for them, checks the probes' file."""
    ranks_file = os.path.join(scratch, f"ranks-{uuid.uuid4().hex}.txt")
    logs = [os.path.join(scratch, f"agent-{uuid.uuid4().hex}.log") for _ in range(run.agents)]
    procs = []
    cpu_before = cpu_of_children()
    start_ns = time.monotonic_ns()
    try:
        for i in range(run.agents):
            with open(logs[i], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        argv_of_agent(i, ranks_file),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        process_group=0,
                        preexec_fn=die_with_parent,
                    )
                )
        exit_ns = wait_all(procs, start_ns + int(timeout * 1e9))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    run.cpu = cpu_of_children() - cpu_before
    starts = read_starts(ranks_file)
    if os.path.exists(ranks_file):
        os.unlink(ranks_file)
    total = run.agents * run.nproc
    if exit_ns is None:
        run.failed = (
            f"did not finish within {timeout:.0f} s: {len(starts)} of {total} workers had started"
        )
        return run
    codes = [proc.returncode for proc in procs]
    if any(codes):
        bad = next(i for i, code in enumerate(codes) if code)
        run.failed = f"an agent exited {codes[bad]}: {last_line(logs[bad])}"
        return run
    counts = Counter(rank for rank, _ in starts)
    if sorted(counts) != list(range(total)) or max(counts.values(), default=0) != 1:
        run.failed = f"{len(counts)} distinct ranks of {total} started ({len(starts)} starts)"
        return run
    run.to_last_start = (max(ns for _, ns in starts) - start_ns) / 1e9
    run.to_exit = (exit_ns - start_ns) / 1e9
    return run


def wait_all(procs, deadline_ns):
    """Waits for every process; the monotonic time of the last exit, or None at the deadline."""
    # pidfds: an exit is seen the moment it happens, without polling with sleeps.
    pending = {os.pidfd_open(proc.pid): proc for proc in procs}
    last = None
    try:
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        while pending:
            left_ms = (deadline_ns - time.monotonic_ns()) / 1e6
            if left_ms <= 0:
                return None
            for fd, _ in poller.poll(left_ms):
                pending[fd].wait()
                last = time.monotonic_ns()
                poller.unregister(fd)
                os.close(fd)
                del pending[fd]
    finally:
        for fd in pending:
            os.close(fd)
    return last


def read_starts(path):
    if not os.path.exists(path):
        return []
    starts = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                starts.append((int(parts[0]), int(parts[1])))
    return starts


def last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "(no output)"
    return lines[-1][:200] if lines else "(no output)"


def floor_per_worker(probe, count, scratch):
    """Seconds per worker when this script starts `count` probes back to back, then reaps them."""
    ranks_file = os.path.join(scratch, "floor.txt")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    start = time.monotonic()
    pids = []
    for rank in range(count):
        env["RANK"] = str(rank)
        pids.append(os.posix_spawn(probe, [probe, ranks_file], env))
    for pid in pids:
        os.waitpid(pid, 0)
    elapsed = time.monotonic() - start
    os.unlink(ranks_file)
    return elapsed / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--torchrun", nargs="+", help="argv prefix that runs torchrun")
    parser.add_argument("--shapes", default="1x1024,2x3000,4x4000")
    parser.add_argument("--repeats", type=int, default=3, help="dlrun runs per shape")
    parser.add_argument(
        "--torchrun-budget", type=float, default=60, help="seconds torchrun gets per shape"
    )
    parser.add_argument("--dlrun-timeout", type=float, default=60)
    parser.add_argument(
        "--budget",
        type=float,
        default=270,
        help="seconds for everything: no shape starts after this",
    )
    parser.add_argument("--goal-seconds", type=float, default=10)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    deadline = time.monotonic() + args.budget
    scratch = tempfile.mkdtemp(prefix="scale-bench-")

    def dlrun_argv(agents, nproc, port, run_id):
        return lambda i, out: [
            args.dlrun,
            f"--nnodes={agents}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={run_id}",
            "--no-python",
            args.probe,
            out,
        ]

    def torchrun_argv(agents, nproc, port, run_id):
        return lambda i, out: [
            *args.torchrun,
            f"--nnodes={agents}",
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            f"--rdzv_id={run_id}",
            "--monitor_interval=0.1",
            "--no_python",
            args.probe,
            out,
        ]

    floor = floor_per_worker(args.probe, 1024, scratch)
    rows = []  # (shape, launcher, [Run])
    torchrun_out = None  # why torchrun is not run on larger shapes
    for agents, nproc in shapes:
        if time.monotonic() >= deadline:
            rows.append(((agents, nproc), "dlrun", "not run: the overall budget was spent"))
            continue
        dl_runs, tr_runs = [], []
        for repeat in range(args.repeats):
            port, run_id = free_port(), uuid.uuid4().hex[:12]
            run = launch(
                Run("dlrun", agents, nproc),
                dlrun_argv(agents, nproc, port, run_id),
                scratch,
                args.dlrun_timeout,
            )
            dl_runs.append(run)
            print(
                f"scale_bench: dlrun {agents} x {nproc}: "
                f"{run.failed or f'{run.to_last_start:.2f} s to last start'}",
                file=sys.stderr,
            )
            # torchrun after dlrun's first run, so both meet the machine in a similar state.
            if repeat != 0 or not args.torchrun:
                continue
            budget = min(args.torchrun_budget, deadline - time.monotonic())
            if torchrun_out:
                tr_runs = torchrun_out
            elif budget < 5:
                tr_runs = "not run: the overall budget was spent"
            else:
                port, run_id = free_port(), uuid.uuid4().hex[:12]
                run = launch(
                    Run("torchrun", agents, nproc),
                    torchrun_argv(agents, nproc, port, run_id),
                    scratch,
                    budget,
                )
                tr_runs = [run]
                print(
                    f"scale_bench: torchrun {agents} x {nproc}: "
                    f"{run.failed or f'{run.to_last_start:.2f} s to last start'}",
                    file=sys.stderr,
                )
                if run.failed:
                    torchrun_out = f"not run: torchrun did not finish {agents} x {nproc}"
        rows.append(((agents, nproc), "dlrun", dl_runs))
        if args.torchrun:
            rows.append(((agents, nproc), "torchrun", tr_runs))
    shutil.rmtree(scratch, ignore_errors=True)

    header = "%-10s %6s %-9s %4s %14s %9s %13s %7s %13s\n"
    sys.stdout.write(
        header
        % (
            "shape",
            "ranks",
            "launcher",
            "runs",
            "to last start",
            "to exit",
            "per worker",
            "CPU",
            "CPU/worker",
        )
    )
    figures, cpus = {}, {}
    for (agents, nproc), name, runs in rows:
        shape = f"{agents} x {nproc}"
        ranks = agents * nproc
        if isinstance(runs, str):
            sys.stdout.write(f"{shape:<10} {ranks:6} {name:<9} {runs}\n")
            continue
        good = [r for r in runs if not r.failed]
        if not good:
            why = runs[0].failed if runs else "not run"
            sys.stdout.write(f"{shape:<10} {ranks:6} {name:<9} failed: {why}\n")
            continue
        last = statistics.median(r.to_last_start for r in good)
        exit_s = statistics.median(r.to_exit for r in good)
        cpu = statistics.median(r.cpu for r in good)
        figures[(name, ranks)] = last
        cpus[(name, ranks)] = cpu
        sys.stdout.write(
            header
            % (
                shape,
                ranks,
                name,
                len(good),
                f"{last:.2f} s",
                f"{exit_s:.2f} s",
                f"{last / ranks * 1e6:.0f} us",
                f"{cpu:.1f} s",
                f"{cpu / ranks * 1e6:.0f} us",
            )
        )
        for r in runs:
            if r.failed:
                sys.stdout.write(f"{'':10} {'':6} {name:<9} one run failed: {r.failed}\n")
    print(
        f"floor: the probe started 1024 times back to back by os.posix_spawn from Python and "
        f"then reaped: {floor * 1e6:.0f} us per worker"
    )
    print(
        "per worker: launch to the last worker's start over the ranks (medians of the runs); "
        "CPU: user+system of the agents and every process they reaped"
    )
    dl = sorted((ranks, s) for (name, ranks), s in figures.items() if name == "dlrun")
    if len(dl) >= 2:
        (small, small_s), (big, big_s) = dl[0], dl[-1]
        ratio = (big_s / big) / (small_s / small)
        cpu_ratio = (cpus[("dlrun", big)] / big) / (cpus[("dlrun", small)] / small)
        print(
            f"goal (per-worker cost flat from {small} to {big} ranks): "
            f"{small_s / small * 1e6:.0f} us -> {big_s / big * 1e6:.0f} us per worker "
            f"(x{ratio:.2f}); CPU per worker x{cpu_ratio:.2f}"
        )
    if ("dlrun", 16000) in figures:
        s = figures[("dlrun", 16000)]
        verdict = "met" if s <= args.goal_seconds else "NOT met"
        print(f"goal (4 x 4000 within {args.goal_seconds:g} s): {verdict} ({s:.2f} s)")
    failed = any(
        isinstance(runs, list) and any(r.failed for r in runs)
        for _, name, runs in rows
        if name == "dlrun"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
