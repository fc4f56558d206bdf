#!/usr/bin/env bash
# The trainer's full acceptance run, too slow for ctest: the default job
# (`dlrun --standalone --nproc-per-node=4 train`, 15 epochs) must reach a test accuracy of at
# least 0.885. Reads rank 0's final JSON summary line; prints the accuracy and the wall time;
# exits 0 when the bar is met, 1 when not, 2 when the run failed or printed no summary.
#
#   scripts/check_default_accuracy.sh [extra trainer flags...]
#
# DLRUN_BUILD_DIR picks the build (default: build/); DLRUN_MIN_ACCURACY the bar (0.885).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
dlrun=$build/bin/dlrun
min=${DLRUN_MIN_ACCURACY:-0.885}
if [[ ! -x $dlrun || ! -x $build/bin/dlrun-train ]]; then
  echo "check_default_accuracy: $dlrun or dlrun-train is missing: build first" >&2
  exit 2
fi

log=$(mktemp "${TMPDIR:-/tmp}/check_default_accuracy.XXXXXX")
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
status=0
"$dlrun" --standalone --nproc-per-node=4 train "$@" 2>&1 | tee "$log" || status=$?
end=$(date +%s.%N)
seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
if ((status != 0)); then
  echo "check_default_accuracy: the run failed with exit code $status after ${seconds} s" >&2
  exit 2
fi

# Rank 0's summary: [0]:{"epochs": 15, ..., "test_accuracy": 0.891200, ...}
summary=$(grep -E '^\[0\]:\{.*"test_accuracy"' "$log" | tail -n 1 || true)
accuracy=$(sed -nE 's/.*"test_accuracy": *([0-9.]+).*/\1/p' <<<"$summary")
if [[ -z $accuracy ]]; then
  echo "check_default_accuracy: no summary line from rank 0 after ${seconds} s" >&2
  exit 2
fi
if awk -v a="$accuracy" -v m="$min" 'BEGIN { exit !(a >= m) }'; then
  echo "check_default_accuracy: PASS: test accuracy $accuracy >= $min in ${seconds} s"
else
  echo "check_default_accuracy: FAIL: test accuracy $accuracy < $min in ${seconds} s" >&2
  exit 1
fi
