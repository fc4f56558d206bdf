"""The measure of bench/console_bench.sh (issue 58): the agent's CPU while its workers print
100,000 lines a second, with and without --console-dedup.

Usage: console_bench.py DLRUN PYTHON WORKERS RATE SECONDS OUT_DIR
WORKERS on one node print RATE lines a second in all for SECONDS (bench/console_worker.py),
the console to /dev/null; for lines the same on every rank and lines of each rank's own, with
--console-dedup=off and =on. The agent's CPU is its own (user + system from /proc/PID/stat,
read as its last worker ends), over the run's wall time. Prints a line per run and the dedup's
cost in % of one core (goal: under 5). Exit status 0; 1 a run failed.
"""

import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def run(dlrun, python, workers, rate, seconds, kind, dedup, out):
    work = tempfile.mkdtemp(dir=out)
    env = dict(os.environ, TMPDIR=work)
    began = time.monotonic()
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen(
            [
                dlrun,
                "--standalone",
                f"--nproc-per-node={workers}",
                f"--console-dedup={dedup}",
                python,
                os.path.join(HERE, "console_worker.py"),
                work,
                str(rate // workers),
                str(seconds),
                kind,
            ],
            stdout=null,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        cpu = 0.0
        while proc.poll() is None:
            cpu = cpu_seconds(proc.pid)  # the last reading before it ends
            if len(glob.glob(os.path.join(work, "done_*"))) == workers:
                break
            time.sleep(0.05)  # sampling, not synchronisation
        wall = time.monotonic() - began
        err = proc.communicate(timeout=seconds + 120)[1]
    if proc.returncode != 0:
        raise RuntimeError(f"console_bench.py: dlrun exited {proc.returncode}: {err[-2000:]}")
    lines = sum(int(Path(p).read_text()) for p in glob.glob(os.path.join(work, "done_*")))
    return cpu / wall, lines / wall


def main():
    dlrun, python, workers, rate, seconds, out = sys.argv[1:7]
    workers, rate, seconds = int(workers), int(rate), float(seconds)
    worst = 0.0
    for kind in ("same", "distinct"):
        share = {}
        for dedup in ("off", "on"):
            share[dedup], achieved = run(dlrun, python, workers, rate, seconds, kind, dedup, out)
            what = "the same on every rank" if kind == "same" else "each rank's own"
            print(
                f"{workers} workers, lines {what},"
                f" {achieved:,.0f} lines/s, --console-dedup={dedup}: the agent "
                f"{100 * share[dedup]:.1f}% of one core",
                flush=True,
            )
        cost = 100 * (share["on"] - share["off"])
        worst = max(worst, cost)
        print(f"  the dedup's cost: {cost:+.1f}% of one core (goal: under 5)", flush=True)
    return 0 if worst < 5 else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
