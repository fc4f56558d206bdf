"""Time to a test accuracy, and training throughput: `dlrun --standalone --nproc-per-node=N
train` against torch_ddp_train.py (the same job in PyTorch DDP, gloo, CPU) under torchrun, for
train_bench.sh.

Each launch is one process group started with subprocess.Popen; its stdout is read as it comes
and every line is stamped with the time since the launch began (time.monotonic just before the
Popen), so both systems are timed the same way, as a user watching the launcher's output sees
them, start-up (imports, loading the data, rendezvous) included. Both print the same per-epoch
line after each epoch's evaluation:
  epoch E/EPOCHS: train loss L, test accuracy A, R samples/s, S s
- time to target: the stamp of the first epoch line with A >= --target ("not reached" when no
  epoch gets there);
- samples/s: over all epochs run, evaluation excluded: epochs / sum(1 / R), every epoch having
  the same number of samples (R is each epoch's samples over its training time, as both
  trainers measure it);
- start-up: the stamp of the first epoch line less its S (seconds since training started): the
  launch to the first training step, plus the first epoch's evaluation (S stops before it).
With --stop-at-target, a launch is stopped (SIGTERM to its process group) once its target line
is seen: what is measured is unchanged, samples/s is then over the epochs run until then.

Launches go in rounds, one per repeat: for each N, dlrun then each torch configuration, so slow
drifts in the machine's load touch every column alike; medians over the repeats are reported.
No launch starts once --budget seconds are spent (its row shows "-"), and a launch under way
then is stopped GRACE_S later, keeping what it measured so far (marked "cut" in the table).
"""

import argparse
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

EPOCH_LINE = re.compile(
    r"epoch (\d+)/(\d+): train loss ([-\d.naif]+), test accuracy ([\d.]+), "
    r"([\d.]+) samples/s, ([\d.]+) s"
)
GRACE_S = 20  # how far past the budget a launch under way may run
STOP_WAIT_S = 15  # between SIGTERM to a launch's process group and SIGKILL


class Stopped(Exception):
    pass


def on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """What one launch measured."""

    def __init__(self):
        self.epochs = []  # (epoch, accuracy, samples/s, seconds since training, stamp)
        self.reached = None  # stamp of the first epoch line at the target
        self.why = None  # why it failed, or None
        self.cut = False  # stopped by the budget before it ended

    def samples_per_sec(self):
        rates = [e[2] for e in self.epochs if e[2] > 0]
        return len(rates) / sum(1.0 / r for r in rates) if rates else None

    def startup(self):
        return self.epochs[0][4] - self.epochs[0][3] if self.epochs else None


def stop_group(process):
    """SIGTERM to the launch's process group (the launcher forwards it), SIGKILL if it stays."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def launch(argv, env, target, deadline, stop_at_target, log):
    """Runs one launch to its end (or the target, or the deadline); returns a Run."""
    run = Run()
    err = tempfile.TemporaryFile()
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            process_group=0,
        )
    except OSError as error:
        run.why = str(error)
        return run
    pending = b""
    try:
        poller = select.poll()
        poller.register(process.stdout, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                run.cut = True
                break
            if not poller.poll(min(left, 1.0) * 1000):
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            stamp = time.monotonic() - start
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                log.write(f"{stamp:8.2f} {line}\n")
                match = EPOCH_LINE.search(line)
                if not match:
                    continue
                epoch, accuracy = int(match[1]), float(match[4])
                run.epochs.append((epoch, accuracy, float(match[5]), float(match[6]), stamp))
                if run.reached is None and accuracy >= target:
                    run.reached = stamp
            log.flush()
            if stop_at_target and run.reached is not None:
                break
        if process.poll() is None:
            stop_group(process)
        else:
            process.wait()
    except BaseException:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        raise
    stopped_by_us = run.cut or (stop_at_target and run.reached is not None)
    if process.returncode != 0 and not stopped_by_us:
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
        run.why = f"exit status {process.returncode}" + (f": {lines[-1][:200]}" if lines else "")
    elif not run.epochs and not run.cut:
        run.why = "printed no epoch line"
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument(
        "--torchrun", required=True, nargs="+", help="argv prefix that runs torchrun"
    )
    parser.add_argument("--torch-script", required=True)
    parser.add_argument(
        "--blas-dir",
        default="",
        help="a directory with an optimised libblas.so.3 (OpenBLAS): adds "
        "torch configurations with it first on LD_LIBRARY_PATH",
    )
    parser.add_argument(
        "--torch-blas",
        default="Debian's libblas.so.3",
        help="what torch does its math with, for the tables' titles",
    )
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--nprocs", default="1,2")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--target", type=float, default=0.88)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--budget", type=float, default=540)
    parser.add_argument("--stop-at-target", action="store_true")
    parser.add_argument(
        "--goal-ratio",
        type=float,
        default=2.0,
        help="the ratio to call met or not (0: report the ratios alone)",
    )
    parser.add_argument("--log", default=os.devnull, help="every output line, time-stamped")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    end = time.monotonic() + args.budget
    nprocs = [int(n) for n in args.nprocs.split(",")]
    train_flags = [
        "--model",
        args.model,
        "--epochs",
        str(args.epochs),
        "--progress-every",
        "1000000",
    ]

    base_env = dict(os.environ)
    configs = [
        (
            "dlrun",
            lambda n: [args.dlrun, "--standalone", f"--nproc-per-node={n}", "train", *train_flags],
            base_env,
        )
    ]

    def torch_command(n):
        # --standalone would put torch 1.13's store on port 29400, which another torchrun on
        # the machine may hold: the same c10d rendezvous on a free port instead.
        return [
            *args.torchrun,
            "--nnodes=1",
            f"--nproc_per_node={n}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}",
            "--rdzv_id=train_bench",
            "--max_restarts=0",
            "--monitor_interval=0.5",
            args.torch_script,
            *train_flags,
        ]

    configs.append(("torch", torch_command, base_env))
    if args.blas_dir:
        blas_env = dict(base_env)
        blas_env["LD_LIBRARY_PATH"] = args.blas_dir + (
            ":" + base_env["LD_LIBRARY_PATH"] if base_env.get("LD_LIBRARY_PATH") else ""
        )
        blas_env["OPENBLAS_NUM_THREADS"] = "1"  # one thread per worker, as torch's own
        configs.append(("torch+blas", torch_command, blas_env))

    runs = {(name, n): [] for name, _, _ in configs for n in nprocs}
    log = open(args.log, "a")
    try:
        for r in range(args.repeats):
            if time.monotonic() >= end:
                print(
                    f"train_bench: stopping after {r} of {args.repeats} rounds (the time "
                    f"budget of {args.budget:.0f} s is spent)",
                    file=sys.stderr,
                )
                break
            for n in nprocs:
                for name, command, env in configs:
                    if time.monotonic() >= end:
                        print(
                            f"train_bench: round {r + 1}, N = {n}, {name}: not started, the "
                            f"time budget is spent",
                            file=sys.stderr,
                            flush=True,
                        )
                        continue
                    argv = command(n)
                    log.write(f"# round {r + 1}, N = {n}, {name}: {' '.join(argv)}\n")
                    run = launch(argv, env, args.target, end + GRACE_S, args.stop_at_target, log)
                    runs[(name, n)].append(run)
                    state = run.why or ("cut short by the budget" if run.cut else "ok")
                    reached = f"{run.reached:.1f} s" if run.reached is not None else "not reached"
                    sps = run.samples_per_sec()
                    print(
                        f"train_bench: round {r + 1}, N = {n}, {name}: {state}; "
                        f"{len(run.epochs)} epochs, target {reached}, "
                        f"{sps:.0f} samples/s"
                        if sps
                        else f"train_bench: round {r + 1}, N = {n}, {name}: {state}",
                        file=sys.stderr,
                        flush=True,
                    )
    except Stopped as stopped:
        print(f"train_bench: stopped by {stopped}", file=sys.stderr)
        return 143
    finally:
        log.close()

    def summary(key):
        """(time-to-target median or None, text), (samples/s median or None, text)."""
        good = [run for run in runs[key] if run.why is None and run.epochs]
        if not runs[key]:
            return (None, "-"), (None, "-")
        if not good:
            return (None, "failed"), (None, "failed")
        reached = [run.reached for run in good if run.reached is not None]
        if len(reached) * 2 > len(good):  # reached in most runs: the median of those
            t = statistics.median(reached)
            t_text = f"{t:.1f}"
        else:
            t = None
            cut = any(run.cut for run in good)
            last = max(run.epochs[-1][4] for run in good)
            t_text = f">{last:.0f} (cut)" if cut else "not reached"
        rates = [run.samples_per_sec() for run in good]
        s = statistics.median(rates)
        return (t, t_text), (s, f"{s:.0f}")

    def ratio(numerator, denominator):
        if numerator is None or denominator is None or denominator <= 0:
            return "n/a"
        return f"{numerator / denominator:.2f}"

    torch_names = [name for name, _, _ in configs if name != "dlrun"]
    verdicts = []
    for torch_name in torch_names:
        label = (
            f"torch ({args.torch_blas})"
            if torch_name == "torch"
            else f"torch with {args.blas_dir}/libblas.so.3"
        )
        print()
        print(f"dlrun vs {label}, {args.epochs} epochs, target test accuracy {args.target}")
        row = "%-3s %10s %10s %7s %11s %11s %7s %9s %9s\n"
        sys.stdout.write(
            row
            % (
                "N",
                "dlrun s",
                "torch s",
                "ratio",
                "dlrun sm/s",
                "torch sm/s",
                "ratio",
                "dlrun up",
                "torch up",
            )
        )
        for n in nprocs:
            (dt, dt_text), (ds, ds_text) = summary(("dlrun", n))
            (tt, tt_text), (ts, ts_text) = summary((torch_name, n))
            ups = []
            for key in (("dlrun", n), (torch_name, n)):
                values = [run.startup() for run in runs[key] if run.why is None and run.epochs]
                ups.append(f"{statistics.median(values):.1f}" if values else "-")
            time_ratio = ratio(tt, dt)
            sps_ratio = ratio(ds, ts)
            sys.stdout.write(
                row % (n, dt_text, tt_text, time_ratio, ds_text, ts_text, sps_ratio, *ups)
            )
            if dt is not None and tt is None and tt_text.startswith(">"):
                time_ratio = f">{float(tt_text[1:].split()[0]) / dt:.2f}"
                print(f"    (torch was stopped by the budget first: time ratio {time_ratio})")
            for what, value in (("time to target", time_ratio), ("samples/s", sps_ratio)):
                if value != "n/a":
                    number = float(value.lstrip(">"))
                    verdicts.append(
                        f"N = {n}, {what} vs {label}: "
                        f"{'met' if number >= args.goal_ratio else 'NOT met'} "
                        f"({value}x)"
                    )
    print()
    print(
        "dlrun s, torch s: launch to the end of the first epoch (evaluation included) whose "
        f"test accuracy is >= {args.target}, start-up included; medians over the runs."
    )
    print(
        "sm/s: training samples per second over the epochs run, evaluation excluded; "
        "up: launch to the first training step, plus one evaluation (s)."
    )
    print(
        "ratio: how many times faster dlrun is (torch's time over dlrun's; dlrun's samples/s "
        "over torch's)."
    )
    if args.stop_at_target:
        print("Runs were stopped at the target, so samples/s is over the epochs until then.")
    if args.goal_ratio > 0:
        print(f"goal: dlrun at least {args.goal_ratio:g}x faster:")
        for verdict in verdicts:
            print(f"  {verdict}")
    print()
    print("per run: N, system: accuracy after each epoch")
    for (name, n), list_ in runs.items():
        for i, run in enumerate(list_):
            accs = " ".join(f"{e[1]:.3f}" for e in run.epochs)
            note = f" ({run.why})" if run.why else (" (cut by the budget)" if run.cut else "")
            print(f"  N = {n}, {name} #{i + 1}: {accs}{note}")
    failed = any(run.why for list_ in runs.values() for run in list_)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
