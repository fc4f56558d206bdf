#!/usr/bin/env bash
# The job's one view (issue 45): what the page's records cost the store. Starts a dlrund on
# loopback and runs dlrun-job-view-bench against it with --records off, then on, alternating
# (PAIRS pairs): K simulated agents on a connection each, registered as agents register, then
# idle (off) or each rewriting its progress record once a record period (1 s up to 200 agents,
# K / 200 s beyond, as agents take it), group rank 0's straggler watch and one viewer reading
# the whole job (on). Prints each run's
# line, then dlrund's CPU with the records minus without, as % of one core, the ratio, and
# PASS/FAIL against the goal: under 1% of a core at the store for 1,000 agents. Builds nothing.
#
# Usage: bench/job_view_bench.sh [BUILD_DIR] [--agents K] [--seconds S] [--pairs R]
#                                [--viewer store|grpc|page|none] [--threads T]
#   defaults: build, 1000 agents, 60 s a run, 2 pairs (about 4 minutes), viewer store
#   (readJob + fillJob in the bench process over a store connection, as an agent's page reads
#   the job; grpc: GetJob on dlrund's port, which reads and encodes the job inside dlrund, as
#   `dlrun status` and `dlrun top` do; page: GET /api/job on dlrund's --metrics-port, whose job
#   watch reads the job inside dlrund once a second while someone looks).
set -euo pipefail

build=build
agents=1000
seconds=60
pairs=2
viewer=store
threads=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --agents) agents=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --viewer) viewer=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "job_view_bench.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done

bench=$build/bin/dlrun-job-view-bench
dlrund=$build/bin/dlrund
for program in "$bench" "$dlrund"; do
  [[ -x $program ]] || { echo "job_view_bench.sh: $program not found; build first" >&2; exit 2; }
done
# K connections here and K at dlrund.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

tmp=$(mktemp -d)
dlrund_pid=
bench_pid=
cleanup() {
  if [[ -n $bench_pid ]]; then kill "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true; fi
  if [[ -n $dlrund_pid ]]; then kill "$dlrund_pid" 2>/dev/null || true; wait "$dlrund_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

metrics=()
[[ $viewer == page ]] && metrics=(--metrics-port 0)
"$dlrund" --host 127.0.0.1 --port 0 ${metrics[@]+"${metrics[@]}"} >"$tmp/dlrund.out" 2>&1 &
dlrund_pid=$!
for _ in $(seq 200); do
  grep -q "listening on" "$tmp/dlrund.out" 2>/dev/null && break
  kill -0 "$dlrund_pid" 2>/dev/null || { cat "$tmp/dlrund.out" >&2; exit 1; }
  sleep 0.05
done
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$tmp/dlrund.out" | head -1)
[[ -n $port ]] || { echo "job_view_bench.sh: dlrund did not start" >&2; cat "$tmp/dlrund.out" >&2; exit 1; }
page=()
if [[ $viewer == page ]]; then
  for _ in $(seq 100); do
    grep -q "serves metrics on" "$tmp/dlrund.out" && break
    sleep 0.05
  done
  at=$(sed -n 's|.*serves metrics on http://\([^/]*\)/.*|\1|p' "$tmp/dlrund.out" | head -1)
  [[ -n $at ]] || { echo "job_view_bench.sh: dlrund printed no metrics port" >&2; cat "$tmp/dlrund.out" >&2; exit 1; }
  page=(--page "$at")
fi

# field NAME LINE: the value of NAME=VALUE in a result line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

echo "job view: $agents simulated agents, $seconds s a run, $pairs pairs (off, on), viewer" \
  "$viewer, on $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1))"
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
declare -a off_pct=() on_pct=()
run=0
for ((pair = 1; pair <= pairs; pair++)); do
  for mode in off on; do
    run=$((run + 1))
    # In the background, so that INT and TERM reach the traps while it runs.
    "$bench" --store "127.0.0.1:$port" --store-pid "$dlrund_pid" --agents "$agents" \
      --seconds "$seconds" --records "$mode" --viewer "$viewer" --threads "$threads" \
      --job "jobview$run" ${page[@]+"${page[@]}"} >"$tmp/run.out" 2>&1 &
    bench_pid=$!
    status=0
    wait "$bench_pid" || status=$?
    bench_pid=
    line=$(grep '^mode=' "$tmp/run.out" || true)
    if [[ $status -ne 0 || -z $line ]]; then
      echo "job_view_bench.sh: run $run ($mode) failed:" >&2
      cat "$tmp/run.out" >&2
      kill -0 "$dlrund_pid" 2>/dev/null || { echo "dlrund exited:" >&2; cat "$tmp/dlrund.out" >&2; }
      exit 1
    fi
    echo "pair $pair $line"
    pct=$(field store_cpu_pct "$line")
    if [[ $mode == off ]]; then off_pct+=("$pct"); else on_pct+=("$pct"); fi
  done
done
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"

echo
printf '%-6s %14s %14s %14s\n' pair "store off %" "store on %" "extra %"
for ((i = 0; i < pairs; i++)); do
  printf '%-6s %14s %14s %14s\n' "$((i + 1))" "${off_pct[i]}" "${on_pct[i]}" \
    "$(awk -v a="${on_pct[i]}" -v b="${off_pct[i]}" 'BEGIN { printf "%.3f", a - b }')"
done
summary=$(printf '%s %s\n' "${off_pct[*]}" "${on_pct[*]}" | awk -v n="$pairs" '{
  for (i = 1; i <= n; i++) { off += $i; on += $(n + i) }
  off /= n; on /= n
  printf "%.3f %.3f %.3f %s", off, on, on - off, (off > 0 ? sprintf("%.1f", on / off) : "inf")
}')
read -r mean_off mean_on extra ratio <<<"$summary"
echo "mean   $(printf '%14s %14s %14s' "$mean_off" "$mean_on" "$extra")"
echo "dlrund's CPU with the page's records: $mean_on% of a core against $mean_off% without" \
  "(on/off ratio $ratio); extra $extra% of a core for $agents agents"
goal=$(awk -v a="$agents" 'BEGIN { printf "%.3f", a / 1000 }')
if awk -v e="$extra" -v g="$goal" 'BEGIN { exit !(e < g) }'; then
  verdict=PASS
else
  verdict=FAIL
fi
echo "$verdict: the store's extra CPU $extra% of a core, goal < $goal% ($agents agents;" \
  "< 1% of a core for 1,000 agents)"
