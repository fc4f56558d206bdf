"""Bytes on the wire per step under the trainer's two strategies, beside the formulas, for
strategies.sh.

Launches, each for a number of steps S (--max-steps S, --epochs 1: S must end before the epoch
does, which the script checks against the steps the trainer reports):
    ps:        dlrun --standalone --roles=ps:P,worker:N train --strategy ps
    allreduce: dlrun --standalone --nproc-per-node=N train --allreduce gloo
(the ring over TCP: the default shared-memory all-reduce of one machine sends nothing). Every
launch prints, per process, bytes_sent and bytes_received: a worker's are what the kernel counted
on its TCP sockets (TCP payload, acknowledged or received; headers of TCP and IP are not
counted), a server's what it wrote and read on its workers' connections (the same bytes: it has
no other). Under allreduce only rank 0 prints its own; every rank of a ring sends and receives
the same.

Per step: each setting runs twice, S1 and S2 steps, and bytes per step = (bytes after S2 -
bytes after S1) / (S2 - S1), so what a launch moves once (the dlrun store, Gloo's connections,
the chief's Init of the servers, every worker's first pull, the end-of-run evaluation's counts,
Done) cancels out. A server's step is a round, one step of every worker: N pushes (the server
counts them; the script checks it took N (S2 - S1) more).

Formulas, with K the model's parameter bytes (4 x 235,146 for the default MLP) and per direction:
- allreduce, each worker: sends and receives 2(N-1)K/N (Gloo's ring: a reduce-scatter then an
  all-gather, each N-1 chunks of K/N). The all-reduce carries K + 8 bytes (the loss and the stop
  vote ride along), and Gloo's transport puts a 48-byte header on every message, its segments'
  and the notifications that a receiver is ready.
- ps, each server (a 1/P range of the parameters): per round receives NK/P (the N gradients'
  ranges) and sends NK/P (the N fresh ranges back), 2NK/P on its link. The textbook's 2(N-1)K
  (one server, N workers) has one of the N machines act as the server, so its own gradient never
  crosses the wire; here every server is a process of its own and all N workers' traffic does,
  so the textbook's figure is off by N/(N-1) by construction: the table shows that ratio apart.
- ps, each worker: sends K (its gradient, split over the servers) and receives K per step,
  whatever N and P. On top: 44 bytes a push and 16 a reply per server (ps_wire.h's header, the
  learning rate, the position).

samples/s: the chief's summary over the S2 run's steps (global samples: under ps, its own pace
times N). The launches share the machine's cores, so these are only indicative here; the bytes
do not depend on the pace.

Exit status: 0 when every measured figure is within --tolerance of its formula, 3 when one is
not, 1 when a launch failed or the budget ran out before every setting was measured.
"""

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time

# The helpers of the other trainer benchmarks (imported without leaving a __pycache__).
sys.dont_write_bytecode = True
from hang_bench import clean_env, die_with_parent  # noqa: E402
from train_bench import Stopped, on_signal, stop_group  # noqa: E402

WIDTHS = (784, 256, 128, 10)  # the trainer's default MLP on 28x28 images, 10 classes
LAUNCH_TIMEOUT_S = 180


def parameter_bytes():
    return 4 * sum((a + 1) * b for a, b in zip(WIDTHS, WIDTHS[1:]))


def launch(argv, env, log):
    """Runs argv to its end; returns the JSON lines its processes printed, or raises
    RuntimeError with why it failed."""
    err = tempfile.TemporaryFile()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=err,
        env=env,
        process_group=0,
        preexec_fn=die_with_parent,
    )
    try:
        out, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(process)
        raise RuntimeError(f"{' '.join(argv)}: still running after {LAUNCH_TIMEOUT_S} s") from None
    except Stopped:
        stop_group(process)
        raise
    text = out.decode(errors="replace")
    log.write(f"# {' '.join(argv)}\n{text}")
    if process.returncode != 0:
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(argv)}: exit {process.returncode}\n{tail}")
    # Lines come as "[local rank]:text" from dlrun.
    found = []
    for line in text.splitlines():
        body = line.split(":", 1)[1] if line.startswith("[") else line
        if body.startswith("{"):
            found.append(json.loads(body))
    return found


class Measured:
    """One launch's traffic, per process: {(kind, index): (sent, received, count)}, count
    being steps (workers) or pushes (servers); and the chief's samples/s."""

    def __init__(self, lines, strategy, steps):
        self.processes = {}
        self.samples_per_sec = None
        self.parameters = 0  # the servers' ranges together
        for o in lines:
            if "test_accuracy" in o:  # the chief's (rank 0's) summary
                if o["strategy"] != strategy or o["steps"] != steps:
                    raise RuntimeError(
                        f"rank 0 ran {o['steps']} steps of {o['strategy']}, "
                        f"not {steps} of {strategy}"
                    )
                self.samples_per_sec = o["samples_per_sec"]
                self.processes[("worker", 0)] = (o["bytes_sent"], o["bytes_received"], steps)
            elif o.get("role") == "worker":
                self.processes[("worker", o["index"])] = (
                    o["bytes_sent"],
                    o["bytes_received"],
                    o["steps"],
                )
            elif o.get("role") == "ps":
                self.processes[("ps", o["index"])] = (
                    o["bytes_sent"],
                    o["bytes_received"],
                    o["pushes"],
                )
                self.parameters += o["parameters"]
        if self.samples_per_sec is None:
            raise RuntimeError("no summary from rank 0")


class Row:
    """One kind of process in one setting: bytes per step (a round, for servers) each way, the
    formula per direction, and each process's ratios."""

    def __init__(self, strategy, n, p, kind, formula_name, formula):
        self.strategy, self.n, self.p, self.kind = strategy, n, p, kind
        self.formula_name, self.formula = formula_name, formula
        self.per_step = []  # (sent, received) per process
        self.samples_per_sec = None

    def ratios(self):
        return [x / self.formula for pair in self.per_step for x in pair]

    def worst(self):
        return max(self.ratios(), key=lambda r: abs(r - 1))


def measure(strategy, n, p, steps, env, dlrun, log):
    """Runs one setting at both step counts; returns its rows."""
    k = parameter_bytes()
    if strategy == "ps":
        argv = [dlrun, "--standalone", f"--roles=ps:{p},worker:{n}", "train", "--strategy", "ps"]
        rows = {
            "ps": Row(strategy, n, p, "server", "NK/P", n * k / p),
            "worker": Row(strategy, n, p, "worker", "K", k),
        }
    else:
        argv = [dlrun, "--standalone", f"--nproc-per-node={n}", "train", "--allreduce", "gloo"]
        rows = {"worker": Row(strategy, n, p, "worker", "2(N-1)K/N", 2 * (n - 1) * k / n)}
    runs = []
    for s in steps:
        runs.append(
            Measured(
                launch(
                    argv + ["--epochs", "1", "--max-steps", str(s), "--progress-every", "1000000"],
                    env,
                    log,
                ),
                strategy,
                s,
            )
        )
    short, long = runs
    if strategy == "ps" and long.parameters * 4 != k:
        raise RuntimeError(f"the servers hold {long.parameters} parameters, not {k // 4}")
    expected = {"ps": p, "worker": n} if strategy == "ps" else {"worker": 1}
    for kind, count in expected.items():
        indices = sorted(i for (what, i) in long.processes if what == kind)
        if indices != list(range(count)):
            raise RuntimeError(f"{kind} lines from {indices}, not 0..{count - 1}")
    for (kind, index), (sent, received, count) in sorted(long.processes.items()):
        sent0, received0, count0 = short.processes[(kind, index)]
        # A server's count is pushes: N of them make one round.
        rounds = (count - count0) / n if kind == "ps" else count - count0
        if rounds != steps[1] - steps[0]:
            raise RuntimeError(
                f"{kind} {index} took {rounds} more steps, not {steps[1] - steps[0]}"
            )
        rows[kind].per_step.append(((sent - sent0) / rounds, (received - received0) / rounds))
    for row in rows.values():
        row.samples_per_sec = long.samples_per_sec
    return list(rows.values())


def setting(strategy, n, p):
    return f"{strategy} N={n}" + (f" P={p}" if strategy == "ps" else "")


def kb(x):
    return f"{x / 1000:.1f}"


def print_table(rows, k):
    print(
        f"K = {k:,} bytes ({k // 4:,} float32 parameters); bytes per step (servers: per round "
        "of N worker steps), per process, each way; ratio = measured / formula, the worst "
        "process and direction of the row"
    )
    header = (
        "strategy",
        "N",
        "P",
        "process",
        "sent kB",
        "recv kB",
        "formula",
        "formula kB",
        "ratio",
        "textbook",
        "ratio",
        "samples/s",
    )
    table = [header]
    for r in rows:
        sent = sum(s for s, _ in r.per_step) / len(r.per_step)
        received = sum(x for _, x in r.per_step) / len(r.per_step)
        # The figures: a server's link (in + out) 2(N-1)K, shared by P servers; a ring
        # worker's 2(N-1)K/N each way, which is the formula itself.
        if r.kind == "server":
            textbook = 2 * (r.n - 1) * k / r.p
            textbook_ratio = f"{(sent + received) / textbook:.4f}"
            textbook_name = "2(N-1)K/P in+out"
        elif r.strategy == "allreduce":
            textbook_name, textbook_ratio = "2(N-1)K/N", f"{r.worst():.4f}"
        else:
            textbook_name, textbook_ratio = "-", "-"
        table.append(
            (
                r.strategy,
                str(r.n),
                str(r.p) if r.strategy == "ps" else "-",
                r.kind,
                kb(sent),
                kb(received),
                r.formula_name,
                kb(r.formula),
                f"{r.worst():.4f}",
                textbook_name,
                textbook_ratio,
                "" if r.kind == "server" else f"{r.samples_per_sec:.0f}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print(
            "  ".join(
                cell.rjust(w) if i in (1, 2) or i >= 4 and i not in (6, 9) else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip()
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--nprocs", default="2,4,8", help="workers N")
    parser.add_argument("--servers", default="1,2", help="parameter servers P, under ps")
    parser.add_argument("--strategies", default="ps,allreduce")
    parser.add_argument("--steps", default="20,60", help="S1,S2: the two launches' lengths")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--budget", type=float, default=480)
    parser.add_argument("--log", default="/dev/null", help="every output line of every launch")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    if len(steps) != 2 or not 0 < steps[0] < steps[1]:
        parser.error("--steps takes S1,S2 with 0 < S1 < S2")
    signal.signal(signal.SIGTERM, on_signal)
    end = time.monotonic() + args.budget
    settings = []
    for strategy in args.strategies.split(","):
        for n in (int(x) for x in args.nprocs.split(",")):
            for p in [int(x) for x in args.servers.split(",")] if strategy == "ps" else [0]:
                settings.append((strategy, n, p))
    rows, status = [], 0
    with open(args.log, "a") as log:
        for strategy, n, p in settings:
            if time.monotonic() > end:
                print(f"strategies: budget spent before {setting(strategy, n, p)}", file=sys.stderr)
                status = 1
                break
            try:
                rows += measure(strategy, n, p, steps, clean_env(), args.dlrun, log)
            except (RuntimeError, Stopped) as error:
                print(f"strategies: {setting(strategy, n, p)}: {error}", file=sys.stderr)
                status = 1
                if isinstance(error, Stopped):
                    break
    if rows:
        print_table(rows, parameter_bytes())
    off = [r for r in rows if abs(r.worst() - 1) > args.tolerance]
    for r in off:
        print(f"OFF: {setting(r.strategy, r.n, r.p)} {r.kind}: {r.worst():.4f} of {r.formula_name}")
    if off:
        print(f"FAIL: {len(off)} row(s) off their formula by more than {args.tolerance:.0%}")
    elif not status:
        print(f"PASS: every figure within {args.tolerance:.0%} of its formula")
    return status or (3 if off else 0)


if __name__ == "__main__":
    sys.exit(main())
