#!/usr/bin/env bash
# What hang watching costs: the bundled trainer's samples/s with and without --hang-timeout
# (issue 12: within 2%). Runs, for N = 2 and 1, pairs of
#   dlrun --standalone --nproc-per-node=N [--hang-timeout=60] train --synthetic --epochs 20
#         --progress-every 1000000
# (20,000 synthetic examples; a launch takes about 5 to 8 s), the order in a pair alternating,
# and compares the samples/s the trainer prints for each epoch. With the flag, each worker
# reports every step and every all-reduce's entry and exit on the shared-memory progress board,
# and the agent looks at the board and the heartbeat files every 400 ms. Other work on a shared
# machine moves samples/s far more than 2%, so only quiet epochs count: those during which other
# processes kept busy no more than the CPUs the workers leave free, plus QUIET (hang_bench.py
# says how it tells, and the rest); pairs go on until each N has REPEATS pairs whose launches
# both had enough quiet epochs. Prints a table (medians, ratio with / without, min-max, noise,
# CPU time, the agent's own CPU per second) and PASS or FAIL against the goal. Builds nothing;
# takes about three minutes on a quiet machine, at most about ten.
# FEATURE=metrics-port measures --metrics-port=0 instead (issue 15: no visible cost): the agent
# serves /metrics and the page, reads the progress board twice a second, and the benchmark
# scrapes /metrics and polls /api/state once a second each (bench/metrics_watch.py); the table
# adds the store's requests/s from the agent's own /metrics:
#   FEATURE=metrics-port bash bench/hang_bench.sh build
#
# Usage: bench/hang_bench.sh [BUILD_DIR]     (default: build)
# Environment: FEATURE (hang-timeout or metrics-port), REPEATS (5: pairs that count per N),
#              EPOCHS (20), NPROCS (2,1),
#              HANG_TIMEOUT (60: seconds; only how often the agent looks depends on it,
#              clamp(T / 10, 50 ms, 400 ms)), GOAL (0.02: the largest slowdown that passes),
#              QUIET (0.15: CPUs), BUDGET_SECONDS (480: no pair starts after it; a launch still
#              running 120 s after its start is stopped), LOG (a file for every output line of
#              every launch, and each epoch's other work), PYTHON (python3).
# Exit status: 0 PASS, 3 FAIL (the goal not met), 1 a launch failed or no pair counted for an
#              N, 2 nothing to run.
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

# dlrun puts its run directories (the progress board, heartbeat files) under TMPDIR: a private
# one, removed at the end. hang_bench.py runs in the background so that INT and TERM reach the
# traps while it runs; it stops the launch under way (by its process group) when it gets TERM,
# and every launch dies with it (PR_SET_PDEATHSIG).
# shellcheck source=bench/background.sh
source "$here/background.sh"
need_trainer "$build"

feature=${FEATURE:-hang-timeout}
case $feature in
  hang-timeout) flag=--hang-timeout=${HANG_TIMEOUT:-60} ;;
  metrics-port) flag="--metrics-port=0 (watched)" ;;
  *) echo "hang_bench.sh: FEATURE must be hang-timeout or metrics-port" >&2; exit 2 ;;
esac
echo "dlrun train, samples/s with and without $flag on $(nproc)" \
  "cores: N = ${NPROCS:-2,1}, ${EPOCHS:-20} epochs of 20,000 synthetic examples," \
  "${REPEATS:-5} pairs that count per N, alternating"
# Other work on the machine skews the wall-clock numbers far more than the feature could.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch "$python" "$here/hang_bench.py" --dlrun "$dlrun" --feature "$feature" \
  --nprocs "${NPROCS:-2,1}" \
  --epochs "${EPOCHS:-20}" --repeats "${REPEATS:-5}" --hang-timeout "${HANG_TIMEOUT:-60}" \
  --goal "${GOAL:-0.02}" --quiet "${QUIET:-0.15}" --budget "${BUDGET_SECONDS:-480}" \
  --log "${LOG:-/dev/null}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
