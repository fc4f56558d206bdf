"""Launch-to-exit time of N no-op workers: dlrun against torchrun (torch 1.13), for launch_bench.sh.

Each launch is one child process, timed with time.perf_counter from its start until a pidfd
reports its exit, stdout and stderr sent to /dev/null; it must exit 0: a failed launch marks its
row failed (its reason is taken from one more, untimed launch with stderr kept) and that
configuration is not launched again for that N.
The launches go in rounds; one round is, for every N, dlrun, torchrun, dlrun, torchrun with
--monitor_interval=0.1 (and so on while dlrun has more repeats left), so slow drifts in the
machine's load touch every column alike. A round is started only when the previous one says it
fits in the time left (the first always is), and no launch runs more than GRACE_S past the
budget. A launch that runs past LAUNCH_TIMEOUT_S is killed with its process group and counts as
failed; one cut short by the budget only leaves its row with fewer runs.

Prints one table of medians (milliseconds) with the ratios, and one of CPU time per launch.
"""

import argparse
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import time

LAUNCH_TIMEOUT_S = 60  # at most; less once the run nears its end (see Clock)
GRACE_S = 15  # how far past the budget a launch already under way may run


class Clock:
    """The time budget: rounds stop at budget_s, and no launch runs past budget_s + GRACE_S."""

    def __init__(self, budget_s):
        self.end = time.monotonic() + budget_s

    def left(self):
        return self.end - time.monotonic()

    def timeout(self):
        return max(1.0, min(LAUNCH_TIMEOUT_S, self.left() + GRACE_S))


class Config:
    def __init__(self, name, command, repeats):
        self.name = name
        self.command = command  # command(n) -> argv
        self.repeats = repeats


def launch(argv, timeout):
    """Runs argv once; returns (wall seconds, CPU seconds, None) or (None, None, why)."""
    # In a process group of its own, as a shell runs a job, so that a launch that hangs is
    # killed together with its workers.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )
    except OSError as error:
        return None, None, str(error)
    # Not Popen.wait(timeout=...): that polls with sleeps growing from 0.5 ms to 50 ms and so
    # rounds a 10 ms launch up to 15.5 ms. A pidfd becomes readable the moment the child exits.
    try:
        pidfd = os.pidfd_open(process.pid)
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            exited = poller.poll(timeout * 1000)
        finally:
            os.close(pidfd)
        if not exited:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None, None, f"timed out after {timeout:.0f} s"
        status = process.wait()
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status != 0:
        return None, None, f"exit status {status}"
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu, None


def failure_reason(argv, status_text, timeout):
    """One more launch with stderr kept, for the last line it printed."""
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            process_group=0,
        )
    except OSError:
        return status_text
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return status_text
    lines = stderr.decode(errors="replace").strip().splitlines()
    return f"{status_text}: {lines[-1][:200]}" if lines else status_text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--noop", required=True)
    parser.add_argument(
        "--torchrun", required=True, nargs="+", help="argv prefix that runs torchrun"
    )
    parser.add_argument("--nprocs", default="1,2,4,8")
    parser.add_argument("--dlrun-repeats", type=int, default=10)
    parser.add_argument("--torchrun-repeats", type=int, default=5)
    parser.add_argument(
        "--budget",
        type=float,
        default=210,
        help="seconds for the whole run: a round is started only when the "
        "last one says it fits, the first always is; no launch runs more "
        f"than {GRACE_S} s past it",
    )
    parser.add_argument("--goal-n", type=int, default=8)
    parser.add_argument("--goal-ratio", type=float, default=100)
    args = parser.parse_args()
    clock = Clock(args.budget)
    nprocs = [int(n) for n in args.nprocs.split(",")]
    noop = args.noop

    configs = [
        Config(
            "dlrun",
            lambda n: [args.dlrun, "--standalone", f"--nproc-per-node={n}", "--no-python", noop],
            args.dlrun_repeats,
        ),
        # torch 1.13 knows only the underscore spellings of these flags.
        Config(
            "torchrun",
            lambda n: (
                args.torchrun + ["--standalone", f"--nproc_per_node={n}", "--no_python", noop]
            ),
            args.torchrun_repeats,
        ),
        Config(
            "torchrun mi0.1",
            lambda n: (
                args.torchrun
                + [
                    "--standalone",
                    f"--nproc_per_node={n}",
                    "--monitor_interval=0.1",
                    "--no_python",
                    noop,
                ]
            ),
            args.torchrun_repeats,
        ),
    ]
    dl, tr, tr_fast = configs

    # Untimed: fills the page cache (torch's imports above all) and shows early that each
    # configuration runs at all. The default torchrun imports the same files as the fast one.
    # A warm-up that hangs marks its program failed everywhere (both torchrun configurations
    # run the same program), so that a hang costs one timeout, not one per row.
    failed = {}
    for config, same_program in ((dl, [dl]), (tr_fast, [tr, tr_fast])):
        argv = config.command(nprocs[0])
        wall, _, why = launch(argv, clock.timeout())
        if why is None:
            continue
        if why.startswith("timed out"):
            for other in same_program:
                for n in nprocs:
                    failed[(other.name, n)] = f"the warm-up launch of {config.name} {why}"
        else:
            why = failure_reason(argv, why, clock.timeout())
        print(f"launch_bench: warm-up launch of {config.name} failed: {why}", file=sys.stderr)

    floor = []
    for _ in range(10):
        wall, _, why = launch([noop], clock.timeout())
        if why is None:
            floor.append(wall)

    # Per round: the order of launches, dlrun alternating with the torchrun configurations.
    order = []
    torchrun_slots = [tr, tr_fast]
    per_round_dl = max(1, -(-dl.repeats // max(tr.repeats, tr_fast.repeats, 1)))
    for i in range(max(per_round_dl, len(torchrun_slots))):
        if i < per_round_dl:
            order.append(dl)
        if i < len(torchrun_slots):
            order.append(torchrun_slots[i])
    rounds = max(tr.repeats, tr_fast.repeats, -(-dl.repeats // per_round_dl))

    walls = {(c.name, n): [] for c in configs for n in nprocs}
    cpus = {(c.name, n): [] for c in configs for n in nprocs}
    round_seconds = None
    done_rounds = 0
    for _ in range(rounds):
        now = time.monotonic()
        if round_seconds is not None and round_seconds > clock.left():
            print(
                f"launch_bench: stopping after {done_rounds} of {rounds} rounds "
                f"(the time budget of {args.budget:.0f} s is spent)",
                file=sys.stderr,
            )
            break
        for n in nprocs:
            for config in order:
                key = (config.name, n)
                if key in failed or len(walls[key]) >= config.repeats:
                    continue
                if clock.left() + GRACE_S <= 0:
                    break
                argv = config.command(n)
                limit = clock.timeout()
                wall, cpu, why = launch(argv, limit)
                if why is not None:
                    if why.startswith("timed out") and limit < LAUNCH_TIMEOUT_S:
                        break  # cut short by the budget, not a failure of the launcher
                    if not why.startswith("timed out"):
                        why = failure_reason(argv, why, clock.timeout())
                    failed[key] = why
                    continue
                walls[key].append(wall)
                cpus[key].append(cpu)
        round_seconds = time.monotonic() - now
        done_rounds += 1
        print(
            f"launch_bench: round {done_rounds}/{rounds} took {round_seconds:.1f} s",
            file=sys.stderr,
        )

    def median_ms(key):
        if key in failed:
            return None
        return statistics.median(walls[key]) * 1e3 if walls[key] else None

    def cell(key, fmt="%.1f"):
        if key in failed:
            return "failed"
        value = median_ms(key)
        return fmt % value if value is not None else "-"

    def ratio(numerator, denominator):
        if numerator is None or denominator is None or denominator <= 0:
            return "n/a"
        return "%.1f" % (numerator / denominator)

    counts = " / ".join(f"{c.name} {min(len(walls[(c.name, n)]) for n in nprocs)}" for c in configs)
    print(f"runs per row (fewest): {counts}")
    if floor:
        print(
            f"spawn floor: the no-op alone, launched the same way, median "
            f"{statistics.median(floor) * 1e3:.2f} ms"
        )
    print()
    row = "%-3s %10s %12s %15s %10s %10s %10s\n"
    sys.stdout.write(
        row
        % ("N", "dlrun ms", "torchrun ms", "torchrun 0.1 ms", "ratio", "ratio 0.1", "goal ratio")
    )
    goal_value = None
    for n in nprocs:
        d = median_ms(("dlrun", n))
        t = median_ms(("torchrun", n))
        f = median_ms(("torchrun mi0.1", n))
        faster = min([v for v in (t, f) if v is not None], default=None)
        goal = ratio(faster, d)
        if n == args.goal_n and goal != "n/a":
            goal_value = faster / d
        sys.stdout.write(
            row
            % (
                n,
                cell(("dlrun", n), "%.2f"),
                cell(("torchrun", n)),
                cell(("torchrun mi0.1", n)),
                ratio(t, d),
                ratio(f, d),
                goal,
            )
        )
    print()
    row = "%-3s %13s %16s %19s\n"
    sys.stdout.write(row % ("N", "dlrun CPU ms", "torchrun CPU ms", "torchrun 0.1 CPU ms"))
    for n in nprocs:
        cells = []
        for config in configs:
            key = (config.name, n)
            if key in failed:
                cells.append("failed")
            elif cpus[key]:
                cells.append("%.1f" % (statistics.mean(cpus[key]) * 1e3))
            else:
                cells.append("-")
        sys.stdout.write(row % (n, *cells))
    print()
    print(
        "ratio: torchrun's median over dlrun's; ratio 0.1: the same for torchrun with "
        "--monitor_interval=0.1"
    )
    print("(its default is 5 s); goal ratio: the faster torchrun configuration over dlrun.")
    print("CPU ms: mean user+system time per launch of the launcher and the workers it reaped.")
    if goal_value is None:
        print(
            f"goal (N = {args.goal_n}: dlrun at least {args.goal_ratio:g}x faster than "
            f"torchrun): not measured"
        )
    else:
        verdict = "met" if goal_value >= args.goal_ratio else "NOT met"
        print(
            f"goal (N = {args.goal_n}: dlrun at least {args.goal_ratio:g}x faster than the "
            f"faster torchrun): {verdict} ({goal_value:.1f}x)"
        )
    for (name, n), why in sorted(failed.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"N = {n}, {name}: failed: {why}")
    unmeasured = [key for key in walls if key not in failed and not walls[key]]
    if unmeasured:
        print("-: not measured, the time budget ran out first")
    return 1 if failed or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
