#!/usr/bin/env bash
# Large launches, dlrun against torchrun (torch 1.13): K agents on loopback x N workers each
# (1 x 1,024, 2 x 3,000 and 4 x 4,000 by default), every worker the static dlrun-rank-probe, so
# the launchers' own cost is what is measured. Reports launch to the last worker started, to
# the last agent's exit, the cost per worker and the CPU time (scale_bench.py says how). dlrun
# runs each shape three times; torchrun once, with at most TORCHRUN_BUDGET seconds a shape.
# Builds nothing; takes about two minutes, at most about five.
#
# Usage: bench/scale_bench.sh [BUILD_DIR]     (default: build)
# Environment: PYTHON (default /usr/bin/python3, which has torch 1.13), SHAPES
#              (1x1024,2x3000,4x4000), DLRUN_REPEATS (3), TORCHRUN_BUDGET (60), BUDGET_SECONDS
#              (240: no shape starts after this), NO_TORCHRUN=1 to measure dlrun alone.
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
dlrun=$build/bin/dlrun
probe=$build/bin/dlrun-rank-probe
python=${PYTHON:-/usr/bin/python3}

for program in "$dlrun" "$probe"; do
  [[ -x $program ]] || { echo "scale_bench.sh: $program not found; build first" >&2; exit 2; }
done
dlrun=$(realpath "$dlrun")
probe=$(realpath "$probe")

torchrun=()
if [[ ${NO_TORCHRUN:-0} != 1 ]]; then
  if torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    torchrun=(--torchrun "$python" "$here/torchrun_py311.py")
  else
    echo "scale_bench.sh: $python cannot import torch; measuring dlrun alone" >&2
  fi
fi

# Both launchers make their log directories under TMPDIR (torchrun leaves its own behind), so
# they get a private one on the same file system, removed at the end.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "large launches on loopback, $(nproc) cores, ulimit -n $(ulimit -n): dlrun" \
  "${torchrun:+vs torchrun (torch $torch_version) }with the static dlrun-rank-probe as worker"
# Other work on the machine skews wall-clock figures far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch "$python" "$here/scale_bench.py" --dlrun "$dlrun" --probe "$probe" \
  ${torchrun[@]+"${torchrun[@]}"} --shapes "${SHAPES:-1x1024,2x3000,4x4000}" \
  --repeats "${DLRUN_REPEATS:-3}" --torchrun-budget "${TORCHRUN_BUDGET:-60}" \
  --budget "${BUDGET_SECONDS:-240}" || status=$?
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
