"""What a failure costs a training job: the time from the fault to the next completed training
step, dlrun against torchrun (torch 2.x, bench/anchor.sh), for recovery_bench.sh.

The job (bench/recovery_worker.py): torch DDP over gloo on CPU, an MLP of 1.2 M parameters, a
checkpoint every step written by rank 0 and loaded by every rank at its start, so a restarted
job resumes. The faults (--cases; recovery_trials.py has the mechanics):
  worker  one worker SIGKILLed: --standalone --nproc-per-node=N on host 0;
  hang    one worker SIGSTOPped in the same job, with --hang-timeout (dlrun's rows: torchrun has
          no hang watch); the workers report each step through dlrun.progress;
  host    a member host killed (SIGKILL to every process in its network namespace) in a job of
          --nnodes=2 with a spare: 3 agents on hosts 0-2, 2 running, the third waiting in the
          rendezvous; the spare must take the lost node's place;
  agent   the launcher of one node SIGKILLed in a job of --nnodes=1:2 on hosts 0-1: an agent
          lost is a node lost, and with min 1 node the survivor restarts alone (both launchers
          can recover so; with min 2 and no spare neither could). dlrun's workers die with
          their agent (PDEATHSIG); torchrun's do not (their own sessions): those still running
          0.5 s after the kill are SIGKILLed, as a lost node's would be, and the row says so.
The multi-node cases rendezvous (c10d, is_host=false) through a fresh dlrund on host 3 per
trial. Every launcher gets the same flags (--max-restarts, --rdzv-conf), the launchers' own
defaults otherwise: torchrun's last_call_timeout (30 s) holds a round below max nodes open
that long, so its agent case waits it out; --rdzv-conf=last_call_timeout=1 gives both 1 s.
The launchers (--launchers): dlrun; dlrun-warm, dlrun with WARM_FLAGS where `dlrun --help`
lists --warm-start (else its rows say n/a); dlrun-inproc and dlrun-inproc-warm, the same with
--recovery=in-process (the worker then runs dlrun.recovery's loop: the lost rank alone starts
again and takes the survivors' state, no checkpoint read; a lost node's ranks start on the spare
and join the survivors, or, with no spare, the survivors go on renumbered); dlrun-inproc-ready,
dlrun-inproc-warm with workers started ahead, waiting in the loop (--ready-spares: the spare's,
in the host case; else --ready-replacements: a node's own, to replace a failed one);
torchrun.

A trial: the job starts, trains steadily, the fault (its time taken right before the kill),
then the recovery: the first step completed by a restarted rank 0, minus the fault's time (both
time.time(): one kernel, one clock across the namespaces). It fails when no step comes within
--deadline s, when an agent that was not killed exits before, when an agent exits non-zero
after the stop file, or when a step is taken twice after it was checkpointed. A hung trial is
killed at its deadline.

The floor: the same workers' own start with no launcher at all, the processes started together
by hand with torchrun's environment and a fresh torch TCPStore: interpreter start, import
torch, init_process_group, checkpoint load, one step; from their start to the first completed
step, measured in the same run, for each world size a recovery ends in (worker, agent: N; host:
2N). Every round is: the floors, then one trial of each case and launcher, in reverse order
every other round, so slow drifts in the machine's load touch every row alike.

Prints a table per case (launcher, successes/trials, median and worst recovery, the median's
ratio to the floor, the median of its first part: from the fault to the start of the new rank
0 process, the rest being that process's own start-up (in process: to rank 0's recovery's
start); the failures by kind, each failed trial's reason; an in-process row's ratios to the
whole-group restarts' medians, and rank 0's phases), the floor, one summary line. An in-process
trial also fails when a survivor's process was replaced or the checkpoint was read. Exit status:
0, or 1 when a dlrun trial failed or the floor could not be measured; torchrun's failures are
results.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys

from chaos_faults import stop_on_sigterm  # noqa: E402
from netns_fixture import Hosts  # noqa: E402  (recovery_trials put tests/python on the path)
from recovery_faults import CASES, Failed
from recovery_trials import Trial, floor_trial, run_bare

# dlrun-warm's flags. Its row runs where `dlrun --help` lists the first of them.
WARM_FLAGS = ["--warm-start", "--preload", "torch"]
IN_PROCESS_FLAGS = ["--recovery=in-process"]
# dlrun-inproc-ready's workers started ahead: a spare's where a host is lost, else a node's own
# for a failed worker's replacement.
READY_FLAGS = {"host": "--ready-spares"}
READY_FLAG = "--ready-replacements"
LAUNCHERS = (
    "dlrun",
    "dlrun-warm",
    "dlrun-inproc",
    "dlrun-inproc-warm",
    "dlrun-inproc-ready",
    "torchrun",
)
WATCHED_CASES = ("hang",)  # dlrun's rows alone: torchrun has no hang watch
PHASES = ("to recovery", "leave", "meet", "group", "state", "step")
HOSTS = 4  # agents on 0-2, dlrund on 3
LEGEND = (
    "failed: start = never trained steadily; hang = no step by the deadline, the agents "
    "still running (killed then); exit = an agent exited before recovering; stop = no exit "
    "0 after the stop file; twice = a checkpointed step taken again; replaced = in "
    "process, a survivor's process gone; checkpoint = in process, the checkpoint read; "
    "setup = the benchmark's own"
)


class Setup:
    """What every trial shares."""

    def __init__(self, args, hosts, scratch):
        self.hosts, self.scratch = hosts, scratch
        self.python, self.dlrund = args.python, args.dlrund
        self.nproc, self.max_restarts = args.nproc, args.max_restarts
        self.deadline, self.rdzv_conf = args.deadline, args.rdzv_conf
        self.checkpoint = os.path.join(scratch, "template.pt")
        self.worker_args = [
            "--widths",
            args.widths,
            "--backend",
            args.backend,
            "--step-seconds",
            str(args.step_seconds),
        ]


def dlrun_help(dlrun):
    try:
        result = subprocess.run([dlrun, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


def launcher_prefixes(args):
    """name -> argv prefix, or None for a row that cannot run here."""
    text = dlrun_help(args.dlrun)
    warm = WARM_FLAGS if WARM_FLAGS[0] in text else None
    in_process = IN_PROCESS_FLAGS if IN_PROCESS_FLAGS[0].split("=")[0] in text else None
    prefixes = {
        "dlrun": [args.dlrun],
        "torchrun": list(args.torchrun),
        "dlrun-warm": warm and [args.dlrun, *warm],
        "dlrun-inproc": in_process and [args.dlrun, *in_process],
        "dlrun-inproc-warm": warm and in_process and [args.dlrun, *in_process, *warm],
        "dlrun-inproc-ready": warm
        and in_process
        and all(flag in text for flag in (READY_FLAG, *READY_FLAGS.values()))
        and [args.dlrun, *in_process, *warm],
    }
    return {name: prefixes[name] for name in args.launchers}


def case_prefix(case, launcher, prefixes):
    """`launcher`'s argv prefix in `case` (dlrun-inproc-ready's flag is the case's)."""
    if launcher.endswith("-ready"):
        return [*prefixes[launcher], READY_FLAGS.get(case, READY_FLAG)]
    return prefixes[launcher]


def runs(case, launcher, prefixes):
    """Whether `launcher` has a row of its own in `case`."""
    return prefixes[launcher] is not None and not_run(case, launcher) is None


def not_run(case, launcher):
    """Why `launcher` has no row in `case` whatever dlrun's flags, or None."""
    if not launcher.startswith("dlrun") and case in WATCHED_CASES:
        return "n/a (no hang watch: it waits out gloo's timeout)"
    return None


def launcher_flag(launcher):
    if launcher.endswith("-ready"):
        return READY_FLAG
    return IN_PROCESS_FLAGS[0].split("=")[0] if "inproc" in launcher else WARM_FLAGS[0]


def make_template(setup):
    """An untimed bare run: fills the page cache (torch's imports) for every row alike and
    leaves the checkpoint every trial starts from, so even a first start loads one."""
    out = os.path.join(setup.scratch, "warm-up")
    os.makedirs(out)
    run_bare(setup, setup.nproc, out)
    shutil.copy(os.path.join(out, "checkpoint.pt"), setup.checkpoint)


# --- the rounds ------------------------------------------------------------------------------


def floor_worlds(args):
    return sorted({CASES[c].world_after * args.nproc for c in args.cases})


def keep(args, directory):
    """Copies a trial's files but its checkpoints to --keep, then removes them here."""
    if args.keep and os.path.isdir(directory):
        shutil.copytree(
            directory,
            os.path.join(args.keep, os.path.basename(directory)),
            ignore=shutil.ignore_patterns("checkpoint.pt*"),
        )
    shutil.rmtree(directory, ignore_errors=True)


def run_rounds(args, setup, prefixes, results, floors):
    pairs = [
        (c, launcher)
        for c in args.cases
        for launcher in args.launchers
        if runs(c, launcher, prefixes)
    ]
    for index in range(args.trials):
        for world in floor_worlds(args):
            try:
                took, resume = floor_trial(setup, world, index)
                floors.setdefault(world, []).append((took, resume))
                print(f"  round {index + 1} floor N={world}: {took:.2f} s", flush=True)
            except Failed as failure:
                print(f"  round {index + 1} floor N={world}: FAILED: {failure}", flush=True)
            keep(args, os.path.join(setup.scratch, f"floor{world}-{index}"))
        for case, launcher in pairs if index % 2 == 0 else pairs[::-1]:
            trial = Trial(
                setup, CASES[case], launcher, case_prefix(case, launcher, prefixes), index
            )
            outcome = trial.run()
            results.setdefault((case, launcher), []).append(outcome)
            if outcome.reason is None:
                text = f"{outcome.recovery:.2f} s" + (f" ({outcome.note})" if outcome.note else "")
            else:
                text = f"FAILED: {outcome.reason}"
            print(f"  round {index + 1} {case} {launcher}: {text}", flush=True)
            keep(args, trial.dir)


# --- the report ------------------------------------------------------------------------------


def seconds(value):
    return "-" if value is None else f"{value:.2f} s"


def render(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def floor_median(floors, world):
    values = [s for s, _ in floors.get(world, [])]
    return statistics.median(values) if values else None


def case_header(args, case):
    c = CASES[case]
    if c.nnodes is None:
        job = f"--standalone --nproc-per-node={args.nproc}"
    else:
        job = (
            f"--nnodes={c.nnodes} --nproc-per-node={args.nproc} on {len(c.hosts)} hosts, "
            f"c10d through dlrund" + (f", --rdzv-conf={args.rdzv_conf}" if args.rdzv_conf else "")
        )
    return (
        f"{case}: {c.title} ({job} --max-restarts={args.max_restarts}); recovery ends in "
        f"a world of {c.world_after * args.nproc}"
    )


def case_table(args, case, prefixes, results, floors):
    floor = floor_median(floors, CASES[case].world_after * args.nproc)
    rows = [("launcher", "ok", "median", "worst", "/ floor", "of which to restart", "failed")]
    notes = []
    for launcher in args.launchers:
        if not runs(case, launcher, prefixes):
            why = not_run(case, launcher) or f"n/a (dlrun has no {launcher_flag(launcher)})"
            rows.append((launcher, why, "", "", "", "", ""))
            continue
        outcomes = results.get((case, launcher), [])
        times = [o.recovery for o in outcomes if o.reason is None]
        median = statistics.median(times) if times else None
        kinds = [o.kind for o in outcomes if o.reason is not None]
        respawns = [o.respawn for o in outcomes if o.reason is None and o.respawn is not None]
        rows.append(
            (
                launcher,
                f"{len(times)}/{len(outcomes)}",
                seconds(median),
                seconds(max(times) if times else None),
                f"{median / floor:.2f}x" if median and floor else "-",
                seconds(statistics.median(respawns) if respawns else None),
                ", ".join(f"{kinds.count(k)} {k}" for k in sorted(set(kinds))),
            )
        )
        for i, o in enumerate(outcomes):
            if o.reason is not None:
                notes.append(f"{launcher} round {i + 1}: {o.reason}")
        noted = [o.note for o in outcomes if o.note]
        if noted:
            notes.append(
                f"{launcher}: {noted[0]} in {len(noted)} of {len(outcomes)} trials "
                "(SIGKILLed 0.5 s after the agent; the recovery counts from the agent's "
                "kill)"
            )
    notes += in_process_notes(case, results)
    text = f"{case_header(args, case)}\n{render(rows)}"
    return text + "".join(f"\n    {n}" for n in notes)


def median_of(results, case, launcher):
    times = [o.recovery for o in results.get((case, launcher), []) if o.reason is None]
    return statistics.median(times) if times else None


def in_process_notes(case, results):
    """Each in-process row's median against the whole-group restart's, and rank 0's phases."""
    notes = []
    for launcher, whole in (
        ("dlrun-inproc", "dlrun"),
        ("dlrun-inproc-warm", "dlrun-warm"),
        ("dlrun-inproc-ready", "dlrun-warm"),
    ):
        mine, theirs = median_of(results, case, launcher), median_of(results, case, whole)
        outcomes = [o for o in results.get((case, launcher), []) if o.phases]
        if mine is None:
            continue
        ratio = (
            f"{mine / theirs:.3f}x {whole}'s median ({mine:.3f} s against {theirs:.3f} s)"
            if theirs
            else f"no {whole} row"
        )
        shares = (
            ", ".join(
                f"{p} {statistics.median(o.phases[p] for o in outcomes):.3f} s" for p in PHASES
            )
            if outcomes
            else "none"
        )
        notes.append(f"{launcher}: {ratio}; rank 0's phases (medians): {shares}")
    return notes


def floor_table(floors):
    rows = [
        (
            "world",
            "ok",
            "median",
            "worst",
            "exec",
            "import torch",
            "init_process_group",
            "model+checkpoint+DDP",
            "first step",
        )
    ]
    phases = ("launched", "start", "imported", "joined", "loaded", "first")
    for world, runs in sorted(floors.items()):
        times = [s for s, _ in runs]
        rows.append(
            (
                str(world),
                str(len(runs)),
                seconds(statistics.median(times)),
                seconds(max(times)),
                *(
                    seconds(statistics.median(r[b] - r[a] for _, r in runs))
                    for a, b in zip(phases, phases[1:])
                ),
            )
        )
    return (
        "floor: the workers started by hand, no launcher (their start to the first "
        "completed step; then rank 0's phases, medians; DDP's first construction imports "
        "torch._dynamo, about 800 modules)\n" + render(rows)
    )


def summary(args, prefixes, results, floors):
    parts = []
    for case in args.cases:
        cells = []
        for launcher in args.launchers:
            outcomes = results.get((case, launcher), [])
            times = [o.recovery for o in outcomes if o.reason is None]
            if not runs(case, launcher, prefixes):
                continue
            cells.append(
                f"{launcher} {seconds(statistics.median(times) if times else None)} "
                f"({len(times)}/{len(outcomes)})"
            )
        parts.append(f"{case}: " + ", ".join(cells))
    floor = ", ".join(f"N={w} {seconds(floor_median(floors, w))}" for w in sorted(floors))
    return "summary: median recovery " + "; ".join(parts) + f"; floor {floor}"


# --- main ------------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dlrun", required=True)
    parser.add_argument("--dlrund", required=True)
    parser.add_argument("--python", required=True, help="the workers' interpreter (torch 2.x)")
    parser.add_argument("--torchrun", required=True, nargs="+", help="argv prefix of torchrun")
    parser.add_argument("--scratch", required=True, help="trials' directories (checkpoints)")
    parser.add_argument("--trials", type=int, help="rounds (default 10; --quick: 2)")
    parser.add_argument("--nproc", type=int, default=2, help="workers per node")
    parser.add_argument(
        "--widths",
        default="784,1024,384,10",
        help="the job's MLP, its layer widths (default 1.2 M parameters)",
    )
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="the job's process group: gloo on the CPU, or NCCL on CUDA (a GPU machine)",
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.1,
        help="the least time between the job's steps (recovery_worker.py; 0: back to back, as "
        "a training job runs: a survivor in process then meets its failed collective within "
        "a step rather than after its wait)",
    )
    parser.add_argument("--cases", default="worker,hang,host,agent")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument(
        "--deadline",
        type=float,
        default=60,
        help="seconds from the fault to the next step before a trial fails",
    )
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument(
        "--rdzv-conf",
        default="",
        help="more --rdzv-conf for both launchers (e.g. last_call_timeout=1)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="copy each trial's files and logs (not its checkpoints) into DIR",
    )
    args = parser.parse_args(argv)
    args.trials = args.trials or (2 if args.quick else 10)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        if os.listdir(args.keep):  # an earlier run's trials have the same names
            parser.error(f"--keep {args.keep}: not empty (an earlier run's files?)")
    args.cases = [c for c in args.cases.split(",") if c]
    args.launchers = [name for name in args.launchers.split(",") if name]
    for name, given, known in (
        ("case", args.cases, CASES),
        ("launcher", args.launchers, LAUNCHERS),
    ):
        unknown = [g for g in given if g not in known]
        if unknown or not given:
            parser.error(f"unknown {name} {unknown}: choose from {', '.join(known)}")
    if args.nproc < 1 or args.trials < 1:
        parser.error("--nproc and --trials must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if os.geteuid() != 0:
        print("recovery_bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    prefixes = launcher_prefixes(args)
    print(
        f"rounds: {args.trials}, {args.nproc} workers per node, the MLP {args.widths} "
        f"({args.backend}, steps at least {args.step_seconds:g} s apart), "
        f"cases {', '.join(args.cases)}, "
        f"deadline {args.deadline:g} s; launchers: "
        + ", ".join(f"{n} = {' '.join(p) if p else 'n/a'}" for n, p in prefixes.items())
        + (
            f" ({READY_FLAG}; where a host is lost, {READY_FLAGS['host']})"
            if prefixes.get("dlrun-inproc-ready")
            else ""
        ),
        flush=True,
    )
    results, floors = {}, {}
    with Hosts(HOSTS) as hosts:
        setup = Setup(args, hosts, args.scratch)
        try:
            make_template(setup)
        except Failed as failure:
            print(f"recovery_bench: the warm-up run failed: {failure}", file=sys.stderr)
            return 1
        run_rounds(args, setup, prefixes, results, floors)
    print()
    for case in args.cases:
        print(case_table(args, case, prefixes, results, floors) + "\n")
    print(LEGEND + "\n")
    if floors:
        print(floor_table(floors) + "\n")
    print(summary(args, prefixes, results, floors), flush=True)
    dlrun_failed = any(
        o.reason
        for (_, launcher), outs in results.items()
        for o in outs
        if launcher.startswith("dlrun")
    )
    return 1 if dlrun_failed or len(floors) < len(floor_worlds(args)) else 0


if __name__ == "__main__":
    sys.exit(main())
