#!/usr/bin/env bash
# A seeded chaos soak of dlrun (bench/chaos_soak.py says what it injects and checks): the bundled
# trainer, elastic (--nnodes=2:4), on 4 simulated hosts (network namespaces), on etcd (3 members)
# and on c10d behind dlrund, while a fault is injected every few seconds. Prints a table (fault
# kind, count, restarts caused, median and worst recovery) and PASSED, or FAILED with the command
# that replays the seed. Needs root. Builds nothing.
#
# Usage: bench/chaos_soak.sh [--seed N] [--duration SECONDS] [--backend etcd|c10d|both]
#                            [--interval SECONDS] [--steps N] [--out DIR] [--keep]
# Environment: BUILD (the build directory, default build), PYTHON (python3).
# Exit status: 0 PASSED, 1 FAILED, 2 cannot run (not root, no build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
python=${PYTHON:-python3}
for program in dlrun dlrund dlrun-train; do
  [[ -x $build/bin/$program ]] ||
    { echo "${0##*/}: $build/bin/$program not found; build first" >&2; exit 2; }
done
exec "$python" "$here/chaos_soak.py" --build "$build" "$@"
