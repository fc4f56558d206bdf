#!/usr/bin/env bash
# Every ratio against PyTorch in one run (issue 29): launch, rendezvous and recovery (c10d),
# store ops and barriers, and the trainer, each against torch 2.13 (bench/anchor.sh), then
# launch and store ops against Debian's torch 1.13 as a second column, where it costs little.
# Each benchmark prints its own table; the closing summary repeats their ratio lines.
# Builds nothing; takes about twenty-five minutes on 2 cores.
#
# Usage: bench/vs_torch.sh [BUILD_DIR]     (default: build)
# Environment: TORCH1_PYTHON (/usr/bin/python3; empty: no torch 1.13 column), and each
#              benchmark's own (BUDGET_SECONDS excepted: each keeps its default).
set -uo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
torch1=${TORCH1_PYTHON-/usr/bin/python3}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
unset BUDGET_SECONDS
status=0

# run NAME COMMAND...: runs one benchmark, its output shown and kept for the summary.
run() {
  local name=$1
  shift
  echo "== $name"
  "$@" 2>&1 | tee "$log/$name" || status=1
  echo
}

run launch "$here/launch_bench.sh" "$build"
run rendezvous "$here/rdzv_bench.sh" "$build" --backends c10d --victims store,other
run store "$here/store_bench.sh" "$build"
run proxy "$here/proxy_bench.sh" "$build"
run train "$here/train_bench.sh" "$build"
if [[ -n $torch1 ]]; then
  PYTHON=$torch1 run launch-torch1.13 "$here/launch_bench.sh" "$build"
  PYTHON=$torch1 run store-torch1.13 "$here/store_bench.sh" "$build"
fi

echo "== summary: each benchmark's title, table rows and verdicts (the notes are above)"
for file in "$log"/*; do
  echo "-- $(basename "$file")"
  grep -E '^(dlrun|N |K |ops|barrier N|[0-9]|\(|  +(victim|dlrun-|torchrun-)|goal|  N = )' \
    "$file" || true
done
exit "$status"
