"""What --hang-timeout (or, with --feature metrics-port, --metrics-port) costs the bundled
trainer: samples/s with and without it, for hang_bench.sh.

Each launch is
    dlrun --standalone --nproc-per-node=N [--hang-timeout=T] train --synthetic --epochs E
          --progress-every 1000000
(--metrics-port=0 --metrics-host=127.0.0.1 in place of --hang-timeout=T with --feature
metrics-port: the agent then serves /metrics and the page and reads the progress board twice a
second, and a metrics_watch.Watcher thread here scrapes /metrics and polls /api/state once a
second each, from the moment the agent prints its port; its last scrape gives the store's
requests, the agent serving the store in process)
in a process group of its own that dies with this script (PR_SET_PDEATHSIG), started from an
environment without PET_*, TORCHELASTIC_* or DLRUN_* variables, so that the launch without the
flag really runs without the watch. With it, the agent makes a progress board and heartbeat
files and looks at them every clamp(T / 10, 50 ms, 400 ms); each worker reports every step and
every all-reduce's entry and exit on the board (a few atomic stores and an increment each).

Measured, from the trainer's own lines (rank 0): each epoch prints
    epoch I/E: train loss L, test accuracy A, R samples/s, S s
where R is that epoch's global samples over its training time (evaluation excluded). The final
JSON summary's samples_per_sec is only the last epoch's R, one epoch, and is not used.

Other work on a shared machine moves R far more than 2%: N workers in lockstep on as many cores
lose half their speed to one other busy process. So each epoch also gets how many CPUs other
work kept busy meanwhile ("other"): when its line arrives this script reads the machine's busy
time (/proc/stat: user, nice, system, irq, softirq, steal) and the CPU time of the launch's
processes and threads (dlrun and its workers, /proc/PID/task/*/schedstat, in ns) and of itself;
other = (machine busy - launch - this script) / wall time, over the time since the line before
(an epoch's training and the evaluation before it). The agent is part of the launch, so what
the watch itself costs is never taken for other work (nor the watcher's: it is this script's).
An epoch is quiet when other is below the CPUs the N workers leave free plus --quiet (0.15:
/proc/stat counts in 10 ms ticks, so a quiet epoch reads 0 to about 0.15; 2 workers on 2 cores
are slower from about there on, and one more busy process reads 0.5 or more). A launch's
figure is the
median R over its quiet epochs, epoch 1 left out (it warms caches and the allocator); one with
fewer than MIN_QUIET_EPOCHS quiet epochs is too busy and has none. Also taken: the CPU time (user
+ system) of the whole launch, agent and workers, start-up included, from RUSAGE_CHILDREN; and
the agent's own CPU per second (its threads' schedstat) from the first epoch line to the last,
which what it does while the workers train decides and other work hardly moves.

Launches go in pairs, one per setting, the order swapping from one pair of an N to the next
(ABBA), so that a drift of the machine (which also comes from outside it: on a virtual machine
quiet launches side by side can differ by 10% and more) touches both settings alike. A pair
counts when both its launches have a figure. Rounds (one pair for each N that still needs one)
go on until every N has --repeats pairs that count, at most MAX_ROUNDS_PER_REPEAT x --repeats
rounds, and no pair starts once --budget seconds are spent. Per N the table shows, over the pairs
that count, the median of each setting, the ratio with / without of those medians, the min and
max, and the median of the per-pair ratios. Verdict: PASS when the ratio of the medians is at
least 1 - GOAL, else FAIL; "(noisy)" when half the interquartile range of the per-pair ratios is
larger than GOAL: there a difference of GOAL is within chance ("(few pairs)": fewer than
MIN_PAIRS_FOR_NOISE pairs counted, too few to tell).

Before timing, one untimed launch per setting checks it: a worker must see DLRUN_PROGRESS_FILE
with the flag and must not without it (a no-python `env`). A launch that fails (non-zero exit,
missing epoch lines) counts as failed; one still running LAUNCH_TIMEOUT_S after its start is
stopped with its process group.
"""

import argparse
import ctypes
import glob
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# train_bench.py runs the same trainer: its epoch line pattern, and its way of stopping a launch
# (imported without leaving a __pycache__ in the source tree).
sys.dont_write_bytecode = True
from metrics_watch import AGENT_LINE, Watcher, metric_sum  # noqa: E402
from train_bench import EPOCH_LINE, Stopped, on_signal, stop_group  # noqa: E402

LAUNCH_TIMEOUT_S = 120
MIN_QUIET_EPOCHS = 5  # a launch with fewer quiet epochs does not count
MAX_ROUNDS_PER_REPEAT = 4  # at most this many pairs run per pair that must count
MIN_PAIRS_FOR_NOISE = 3  # fewer pairs that count tell nothing of the noise
PR_SET_PDEATHSIG = 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def clean_env():
    """This environment without anything that steers dlrun or its workers (PET_HANG_TIMEOUT
    above all, which would turn the watch on in the launches without the flag)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "DLRUN_"))
        and k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "GROUP_RANK",
        )
    }


# --- who else uses the machine ---------------------------------------------------------------


def machine_busy():
    """CPU seconds the whole machine has spent busy, all CPUs together (/proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (
            int(x) for x in f.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def tasks_cpu(pid):
    """CPU seconds of every thread of pid now, and the PIDs of its children."""
    total, children = 0, []
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/schedstat") as f:
                total += int(f.read().split()[0])
            with open(f"{task}/children") as f:
                children += [int(child) for child in f.read().split()]
        except (OSError, ValueError, IndexError):
            pass  # the thread or the process has just ended
    return total / 1e9, children


def launch_cpu(pid):
    """CPU seconds of pid and of every process below it, their threads that still run."""
    total, pending = 0.0, [pid]
    while pending:
        seconds, children = tasks_cpu(pending.pop())
        total += seconds
        pending += children
    return total


class Sample:
    def __init__(self, pid):
        self.wall = time.monotonic()
        self.busy = machine_busy()
        self.launch = launch_cpu(pid)
        self.agent = tasks_cpu(pid)[0]
        self.own = time.process_time()

    def other_since(self, before):
        """CPUs other work kept busy on average since `before`; None over too short a time."""
        wall = self.wall - before.wall
        if wall < 0.05:
            return None
        mine = (self.launch - before.launch) + (self.own - before.own)
        return max(0.0, (self.busy - before.busy - mine) / wall)


# --- launches --------------------------------------------------------------------------------


class Output:
    """What a launch printed and measured."""

    def __init__(self):
        self.lines = []
        self.epochs = []  # (samples/s, other CPUs or None), one per epoch line
        self.samples = []  # the Sample taken at each epoch line
        self.cpu = None  # CPU seconds of the whole launch
        self.store_rate = None  # watched: the store's requests/s from the launch to the last scrape
        self.why = None  # why it failed, or None


def run_once(argv, env, log, watched=False):
    """Runs argv to its end, sampling the machine at each epoch line; returns an Output.
    watched: a metrics_watch.Watcher scrapes and polls the port the agent prints."""
    out = Output()
    err = tempfile.TemporaryFile()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=err,
        env=env,
        process_group=0,
        preexec_fn=die_with_parent,
    )

    def targets():
        # pread: the launch shares the file's offset, which a read would move under it.
        match = AGENT_LINE.search(os.pread(err.fileno(), 1 << 16, 0).decode(errors="replace"))
        return [int(match.group(1))] if match else []

    watcher = Watcher(targets) if watched else None
    if watcher:
        watcher.start()

    def overrun():
        out.why = f"still running after {LAUNCH_TIMEOUT_S} s"
        stop_group(process)

    watchdog = threading.Timer(LAUNCH_TIMEOUT_S, overrun)
    watchdog.start()
    last = Sample(process.pid)
    read_all = False
    try:
        for raw in process.stdout:  # each line as soon as it is written
            line = raw.decode(errors="replace").rstrip("\n")
            out.lines.append(line)
            log.write(line + "\n")
            match = EPOCH_LINE.search(line)
            if match:
                now = Sample(process.pid)
                other = now.other_since(last)
                out.epochs.append((float(match[5]), other))
                out.samples.append(now)
                log.write(f"#   other work: {'-' if other is None else f'{other:.2f}'} CPUs\n")
                last = now
        read_all = True
    finally:
        if watcher:
            watcher.stop()
        watchdog.cancel()
        watchdog.join()
        if not read_all:  # a signal or an error here: the launch goes with this script
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
        process.stdout.close()
        log.flush()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.why is None and process.returncode != 0:
        err.seek(0)
        text = err.read().decode(errors="replace").strip().splitlines()
        out.why = f"exit status {process.returncode}" + (f": {text[-1][:200]}" if text else "")
    if out.why is None:
        out.cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if watcher and watcher.last:
        when, text = next(iter(watcher.last.values()))
        out.store_rate = metric_sum(text, "dlrun_store_requests_total") / (when - started)
    return out


class Run:
    """One timed launch."""

    def __init__(self, out, epochs, quiet):
        self.why = out.why
        if self.why is None and len(out.epochs) != epochs:
            self.why = f"printed {len(out.epochs)} of {epochs} epoch lines"
        self.cpu = out.cpu
        self.store_rate = out.store_rate
        # The agent's CPU per second while training: from the first epoch line to the last.
        first, last = (out.samples[0], out.samples[-1]) if out.samples else (None, None)
        self.agent_cpu = (
            (last.agent - first.agent) / (last.wall - first.wall)
            if first and last.wall > first.wall
            else None
        )
        later = out.epochs[1:]
        self.quiet = [rate for rate, other in later if other is not None and other < quiet]
        self.epochs = len(later)
        others = [other for _, other in later if other is not None]
        self.other = statistics.mean(others) if others else 0.0

    def figure(self):
        """The median samples/s over the quiet epochs after the first; None: not counted."""
        if self.why or len(self.quiet) < MIN_QUIET_EPOCHS:
            return None
        return statistics.median(self.quiet)

    def describe(self):
        if self.why:
            return f"failed: {self.why}"
        figure = self.figure()
        rate = f"{figure:.0f} samples/s" if figure is not None else "too busy"
        return (
            f"{rate}, {len(self.quiet)}/{self.epochs} quiet epochs, other work "
            f"{self.other:.2f} CPUs, {self.cpu:.2f} s CPU, agent {self.agent_cpu * 1e3:.2f} "
            "ms CPU/s"
        )


def dlrun_argv(dlrun, n, flags, *command):
    return [dlrun, "--standalone", f"--nproc-per-node={n}", *flags, *command]


def launch(dlrun, n, flags, epochs, quiet, env, log):
    """One timed launch; with --metrics-port among `flags`, a watched one."""
    argv = dlrun_argv(
        dlrun,
        n,
        flags,
        "train",
        "--synthetic",
        "--epochs",
        str(epochs),
        "--progress-every",
        "1000000",
    )
    log.write(f"# {' '.join(argv)}\n")
    watched = any(flag.startswith("--metrics-port") for flag in flags)
    return Run(run_once(argv, env, log, watched), epochs, quiet)


def check_setting(dlrun, flags, env, log):
    """None if a worker sees DLRUN_PROGRESS_FILE exactly when the feature's flags are given
    (both set the board up), else why."""
    argv = dlrun_argv(dlrun, 1, flags, "--no-python", "env")
    log.write(f"# {' '.join(argv)}\n")
    out = run_once(argv, env, log)
    if out.why:
        return out.why
    board = any(line.startswith("[0]:DLRUN_PROGRESS_FILE=") for line in out.lines)
    if board != bool(flags):
        return (
            "the worker got no DLRUN_PROGRESS_FILE"
            if flags
            else "the worker got DLRUN_PROGRESS_FILE without the flag"
        )
    return None


def spread(values):
    """Half the interquartile range (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--nprocs", default="2,1")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="pairs that count, per N")
    parser.add_argument(
        "--feature",
        choices=("hang-timeout", "metrics-port"),
        default="hang-timeout",
        help="what the launches with it get: "
        "--hang-timeout=T, or --metrics-port=0 (watched, see metrics_watch.py)",
    )
    parser.add_argument("--hang-timeout", type=float, default=60)
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.15,
        help="an epoch is quiet while other work keeps fewer CPUs busy than "
        "this, on top of those the N workers leave free",
    )
    parser.add_argument("--budget", type=float, default=480)
    parser.add_argument(
        "--goal", type=float, default=0.02, help="the largest slowdown that passes (a fraction)"
    )
    parser.add_argument("--log", default=os.devnull, help="every output line of every launch")
    args = parser.parse_args()
    if args.epochs < MIN_QUIET_EPOCHS + 1:
        parser.error(f"--epochs must be at least {MIN_QUIET_EPOCHS + 1}")
    signal.signal(signal.SIGTERM, on_signal)
    end = time.monotonic() + args.budget
    nprocs = [int(n) for n in args.nprocs.split(",")]
    cpus = os.cpu_count() or 1
    env = clean_env()
    flags = (
        [f"--hang-timeout={args.hang_timeout:g}"]
        if args.feature == "hang-timeout"
        else ["--metrics-port=0", "--metrics-host=127.0.0.1"]
    )
    what = " ".join(flags)
    settings = (("without", []), ("with", flags))
    pairs = {n: [] for n in nprocs}  # per N: {setting: Run}, in order

    def counts(pair):
        return all(run.figure() is not None for run in pair.values())

    def counted(n):
        return [pair for pair in pairs[n] if counts(pair)]

    log = open(args.log, "a")
    try:
        for name, setting in settings:
            why = check_setting(args.dlrun, setting, env, log)
            if why:
                print(
                    f"hang_bench: the launch {name} {what} is not what it should be: {why}",
                    file=sys.stderr,
                )
                return 1
        # Untimed: fills the page cache and shows early that the trainer runs at all.
        warm = launch(args.dlrun, max(nprocs), [], MIN_QUIET_EPOCHS + 1, 0, env, log)
        if warm.why:
            print(f"hang_bench: the warm-up launch failed: {warm.why}", file=sys.stderr)
            return 1
        for r in range(MAX_ROUNDS_PER_REPEAT * args.repeats):
            todo = [n for n in nprocs if len(counted(n)) < args.repeats]
            if not todo or time.monotonic() >= end:
                break
            for n in todo:
                if time.monotonic() >= end:
                    break
                quiet = max(0, cpus - n) + args.quiet
                pair = {}
                for name, setting in settings if len(pairs[n]) % 2 == 0 else settings[::-1]:
                    pair[name] = launch(args.dlrun, n, setting, args.epochs, quiet, env, log)
                    print(
                        f"hang_bench: round {r + 1}, N = {n}, {name:7s} {what}: "
                        f"{pair[name].describe()}",
                        file=sys.stderr,
                        flush=True,
                    )
                pairs[n].append(pair)
        if time.monotonic() >= end:
            print(
                f"hang_bench: stopped starting launches: the time budget of "
                f"{args.budget:.0f} s is spent",
                file=sys.stderr,
            )
    except Stopped as stopped:
        print(f"hang_bench: stopped by {stopped}", file=sys.stderr)
        return 143
    finally:
        log.close()

    print()
    print(
        f"trainer samples/s, {what} against none, {cpus} CPUs: per launch the median over "
        f"its quiet epochs (2..{args.epochs}); medians over the pairs that count"
    )
    row = "%-3s %6s %9s %9s %7s %8s %15s %15s %6s %8s %8s %9s %9s %8s %9s  %s\n"
    sys.stdout.write(
        row
        % (
            "N",
            "pairs",
            "without",
            "with",
            "ratio",
            "pair med",
            "without min-max",
            "with min-max",
            "noise",
            "CPU s wo",
            "CPU s w",
            "agent wo",
            "agent w",
            "pair med",
            "store w",
            "verdict",
        )
    )
    sys.stdout.write(
        row % ("", "", "", "", "", "", "", "", "", "", "", "ms/s", "ms/s", "agent", "req/s", "")
    )
    failed = any(run.why for list_ in pairs.values() for pair in list_ for run in pair.values())
    unmeasured = noisy = False
    verdicts = []
    for n in nprocs:
        good = counted(n)
        count = f"{len(good)}/{len(pairs[n])}"
        if not good:
            sys.stdout.write(row % (n, count, *["-"] * 13, "not measured"))
            unmeasured = True
            continue
        fig = {name: [pair[name].figure() for pair in good] for name, _ in settings}
        med = {name: statistics.median(v) for name, v in fig.items()}
        cpu = {name: statistics.median(pair[name].cpu for pair in good) for name, _ in settings}
        agent = {
            name: statistics.median(pair[name].agent_cpu for pair in good) for name, _ in settings
        }
        agent_ratios = [pair["with"].agent_cpu / pair["without"].agent_cpu for pair in good]
        store = [pair["with"].store_rate for pair in good if pair["with"].store_rate is not None]
        ratios = [pair["with"].figure() / pair["without"].figure() for pair in good]
        ratio = med["with"] / med["without"]
        noise = spread(ratios)
        ok = ratio >= 1 - args.goal
        verdicts.append(ok)
        few = len(good) < MIN_PAIRS_FOR_NOISE
        flag = " (few pairs)" if few else " (noisy)" if noise > args.goal else ""
        noisy |= bool(flag)
        sys.stdout.write(
            row
            % (
                n,
                count,
                f"{med['without']:.0f}",
                f"{med['with']:.0f}",
                f"{ratio:.3f}",
                f"{statistics.median(ratios):.3f}",
                f"{min(fig['without']):.0f}-{max(fig['without']):.0f}",
                f"{min(fig['with']):.0f}-{max(fig['with']):.0f}",
                "-" if few else f"{noise * 100:.1f}%",
                f"{cpu['without']:.2f}",
                f"{cpu['with']:.2f}",
                f"{agent['without'] * 1e3:.2f}",
                f"{agent['with'] * 1e3:.2f}",
                f"{statistics.median(agent_ratios):.3f}",
                f"{statistics.median(store):.2f}" if store else "-",
                ("PASS" if ok else "FAIL") + flag,
            )
        )
    print()
    print(
        f"pairs: pairs that count (both launches with at least {MIN_QUIET_EPOCHS} quiet "
        "epochs) / pairs run; ratio: median with / median without; pair med: the median of "
        "each pair's with / without; noise: half the interquartile range of those per-pair "
        "ratios; CPU s: user + system seconds of a whole launch (agent and workers, start-up "
        "included), medians; agent ms/s: the agent's own CPU per second from the first epoch "
        "line to the last, medians, and the median of the per-pair ratios with / without; "
        "store req/s: the requests the agent's store served from the launch to the last "
        "scrape, from its /metrics (watched launches only)."
    )
    verdict = "not measured" if unmeasured else ("PASS" if all(verdicts) else "FAIL")
    print(
        f"goal: with {what} at least {1 - args.goal:.2f} of the samples/s without "
        f"(within {args.goal * 100:g}%): {verdict}"
    )
    if noisy:
        print(
            f"noisy: launches side by side differ by more than the goal here (or too few "
            f"pairs counted to tell), so a difference of {args.goal * 100:g}% is within "
            "chance: run it again when the machine is quieter, or with more REPEATS."
        )
    print()
    print(
        "per pair, in order: samples/s without and with (the median over the quiet epochs, "
        f"'busy' with fewer than {MIN_QUIET_EPOCHS} of them), how many epochs were quiet"
    )
    for n in nprocs:
        for k, pair in enumerate(pairs[n]):
            text = ", ".join(
                f"{name} failed"
                if run.why
                else f"{name} {run.figure():.0f} ({len(run.quiet)} quiet)"
                if run.figure() is not None
                else f"{name} busy ({len(run.quiet)} quiet)"
                for name, run in sorted(pair.items(), key=lambda item: item[0] == "with")
            )
            print(f"  N = {n} #{k + 1}: {text}{'' if counts(pair) else ' (not counted)'}")
    if failed or unmeasured:
        return 1
    return 0 if all(verdicts) else 3


if __name__ == "__main__":
    sys.exit(main())
