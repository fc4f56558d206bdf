#!/usr/bin/env bash
# The trainer's two strategies on the wire (issue 16): for N workers (2, 4, 8) the bytes each
# process sends and receives per step under
#   dlrun --standalone --roles=ps:P,worker:N train --strategy ps          (P = 1, 2 servers)
#   dlrun --standalone --nproc-per-node=N train --allreduce gloo           (Gloo's ring over TCP)
# each run for --max-steps S1 and S2 (20 and 60) of the first epoch, the difference divided by
# S2 - S1 (so the one-time traffic cancels), beside the formulas: a server's link NK/P each way
# per round of N worker steps (2NK/P in all; the textbook's 2(N-1)K is shown apart), a ps
# worker's K each way, a ring worker's 2(N-1)K/N each way, K the model's parameter bytes.
# Prints a table with ratios measured / formula (strategies.py says how each figure is taken)
# and PASS when every one is within TOLERANCE. samples/s comes from the same runs, the workers
# and servers sharing the machine's cores: indicative only. Builds nothing; 18 launches by
# default, about two minutes on 2 cores (N = 8 with 2 servers is 10 processes on them).
#
# Usage: bench/strategies.sh [BUILD_DIR]     (default: build)
# Environment: NPROCS (2,4,8), SERVERS (1,2), STRATEGIES (ps,allreduce), STEPS (20,60: S1,S2),
#              TOLERANCE (0.10), BUDGET_SECONDS (480: no setting starts after it; a launch still
#              running 180 s after its start is stopped), LOG (a file for every output line of
#              every launch), PYTHON (python3).
# Exit status: 0 PASS, 3 a figure off its formula by more than TOLERANCE, 1 a launch failed or
#              the budget ran out, 2 nothing to run.
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

# A private TMPDIR for dlrun's run directories, and the driver in the background (see there);
# strategies.py stops the launch under way when it gets TERM.
# shellcheck source=bench/background.sh
source "$here/background.sh"
need_trainer "$build"

echo "dlrun train --strategy ps and --allreduce gloo on $(nproc) cores: N = ${NPROCS:-2,4,8}" \
  "workers, P = ${SERVERS:-1,2} servers, ${STEPS:-20,60} steps"
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch "$python" "$here/strategies.py" --dlrun "$dlrun" --nprocs "${NPROCS:-2,4,8}" \
  --servers "${SERVERS:-1,2}" --strategies "${STRATEGIES:-ps,allreduce}" \
  --steps "${STEPS:-20,60}" --tolerance "${TOLERANCE:-0.10}" \
  --budget "${BUDGET_SECONDS:-480}" --log "${LOG:-/dev/null}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
