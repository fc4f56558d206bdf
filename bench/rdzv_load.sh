#!/usr/bin/env bash
# Rendezvous at scale: K simulated agents (dlrun-rdzv-load, each a real ElasticRendezvous on
# its own thread with its own connection) join one round at a dlrund on loopback, for
# K = 256, 1024, 4096 and 12500. Prints the median over REPEATS runs of the time from "all K
# connected" to "the last one holds its rank". Goals: 4096 agents in under 1 s, 12,500 in
# under 3 s. Builds nothing.
#
# Usage: bench/rdzv_load.sh [BUILD_DIR]     (default: build)
# Environment: KS (default "256 1024 4096 12500"), REPEATS (default 5).
set -euo pipefail

build=${1:-build}
load=$build/bin/dlrun-rdzv-load
dlrund=$build/bin/dlrund
for program in "$load" "$dlrund"; do
  [[ -x $program ]] || { echo "rdzv_load.sh: $program not found; build first" >&2; exit 2; }
done
# An agent holds one connection while it joins (its reports' opens later): 12,500 agents hold
# 12,500, and the server as many, under this machine's hard limit of 20,000 per process.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

tmp=$(mktemp -d)
dlrund_pid=
cleanup() {
  if [[ -n $dlrund_pid ]]; then kill "$dlrund_pid" 2>/dev/null || true; wait "$dlrund_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$dlrund" --host 127.0.0.1 --port 0 > "$tmp/dlrund.out" 2>&1 &
dlrund_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$tmp/dlrund.out" 2>/dev/null && break
  kill -0 "$dlrund_pid" 2>/dev/null || { cat "$tmp/dlrund.out" >&2; exit 1; }
  sleep 0.05
done
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$tmp/dlrund.out" | head -1)
[[ -n $port ]] || { echo "rdzv_load.sh: dlrund did not start" >&2; cat "$tmp/dlrund.out" >&2; exit 1; }

echo "| simulated agents | dlrun rendezvous s (median of ${REPEATS:-5}) | goal |"
echo "|---|---|---|"
run=0
for k in ${KS:-256 1024 4096 12500}; do
  times=()
  for _ in $(seq "${REPEATS:-5}"); do
    run=$((run + 1))
    times+=("$("$load" --agents "$k" --port "$port" --run-id "load$run" | sed -n 's/.*rendezvous_s=//p')")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  goal=""
  [[ $k == 4096 ]] && goal="< 1 s"
  [[ $k == 12500 ]] && goal="< 3 s"
  echo "| $k | $median | $goal |"
done
