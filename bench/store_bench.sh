#!/usr/bin/env bash
# Compares dlrund with torch's own TCPStore server (torch 2.13, bench/anchor.sh; its default
# backend) under the same load from dlrun-store-bench, in the wire dialect of that torch: ops/s
# for 1, 4 and 16 client processes, and the time N clients take through an add-then-wait
# barrier and, against torch 2.x, through its BARRIER op. Each measurement alternates between
# the two servers and reports the median of several runs. Builds nothing.
#
# Usage: bench/store_bench.sh [BUILD_DIR]     (default: build)
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment), OPS_SECONDS (2),
#              OPS_REPEATS (5), BARRIER_REPEATS (5).
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/bin/dlrun-store-bench
dlrund=$build/bin/dlrund
anchor_for=store_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"
ops_seconds=${OPS_SECONDS:-2}
ops_repeats=${OPS_REPEATS:-5}
barrier_repeats=${BARRIER_REPEATS:-5}

for program in "$bench" "$dlrund"; do
  [[ -x $program ]] || { echo "store_bench.sh: $program not found; build first" >&2; exit 2; }
done

# The servers inherit this; a 4096-client barrier needs more descriptors than the usual 1024.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

tmp=$(mktemp -d)
declare -A pid=() port=()
bench_pid=

cleanup() {
  local name
  if [[ -n $bench_pid ]]; then kill "$bench_pid" 2>/dev/null || true; fi
  for name in "${!pid[@]}"; do kill "${pid[$name]}" 2>/dev/null || true; done
  for name in "${!pid[@]}"; do wait "${pid[$name]}" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_server NAME STDIN COMMAND...: starts a server that prints a line ending in its port
# first; records pid[NAME] and port[NAME]. The stdout fifo stays open here so later output
# cannot hit a closed pipe.
start_server() {
  local name=$1 stdin=$2 fd line
  shift 2
  rm -f "$tmp/$name.out"
  mkfifo "$tmp/$name.out"
  "$@" <"$stdin" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pid[$name]=$!
  exec {fd}<"$tmp/$name.out"
  if ! read -r -t 60 line <&"$fd"; then
    echo "store_bench.sh: $name did not report its port:" >&2
    cat "$tmp/$name.err" >&2
    exit 1
  fi
  port[$name]=${line##*:}
}

start_dlrund() { start_server dlrund /dev/null "$dlrund" --host 127.0.0.1 --port 0; }

# torch_store_server.py serves until its stdin closes: a fifo this script holds open.
mkfifo "$tmp/torch.in"
exec {torch_stdin}<>"$tmp/torch.in"
start_torch() {
  start_server torch "$tmp/torch.in" ${no_dns[@]+"${no_dns[@]}"} "$python" \
    "$here/torch_store_server.py"
}

start_dlrund
start_torch
era=2
[[ $torch_version == 1.* ]] && era=1

clk_tck=$(getconf CLK_TCK)

# cpu_ticks PID: user plus system time the process has used so far, all threads.
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

# run SERVER ARGS...: one dlrun-store-bench run; sets result to its number or "failed: why",
# and ticks to the server's CPU ticks during the run. A server that died is restarted so that
# the remaining rows still measure something.
run() {
  local server=$1 output status=0 why before
  shift
  before=$(cpu_ticks "${pid[$server]}" 2>/dev/null || echo 0)
  # In the background, so that INT and TERM reach the traps while it runs.
  timeout 120 "$bench" --host 127.0.0.1 --port "${port[$server]}" --era "$era" "$@" \
    >"$tmp/run.out" 2>&1 &
  bench_pid=$!
  wait "$bench_pid" || status=$?
  bench_pid=
  output=$(<"$tmp/run.out")
  if [[ $status -eq 0 ]]; then
    result=$(awk '/^(ops_per_sec|barrier_seconds) / { print $2 }' <<<"$output")
    ticks=$(($(cpu_ticks "${pid[$server]}") - before))
    return
  fi
  why=$(grep -v '^ops_per_sec\|^barrier_seconds' <<<"$output" | head -n 1 || true)
  [[ $status -eq 124 ]] && why="timed out after 120 s"
  if ! kill -0 "${pid[$server]}" 2>/dev/null; then
    wait "${pid[$server]}" 2>/dev/null || true
    why="$why (the $server server exited$(tail -n 1 "$tmp/$server.err" | sed 's/^./: &/'); restarted)"
    "start_$server"
  fi
  result="failed: ${why:-exit status $status}"
}

# median VALUE...: the middle value, or the first failure when any run failed.
median() {
  local v
  for v in "$@"; do
    [[ $v == failed* ]] && { echo "$v"; return; }
  done
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# measure REPEATS MODE ARGS...: alternates the two servers. Sets value[SERVER] to the median
# result and cpu[SERVER] to the server's CPU time over the successful runs: microseconds per
# op for ops, seconds per run (connecting and closing included) for barrier.
declare -A value=() cpu=()
measure() {
  local repeats=$1 mode=$2 i server
  shift
  local -A results=() total_ticks=() total_work=()
  for ((i = 0; i < repeats; i++)); do
    for server in dlrund torch; do
      run "$server" "$@"
      results[$server]+="$result"$'\n'
      [[ $result == failed* ]] && continue
      total_ticks[$server]=$((${total_ticks[$server]:-0} + ticks))
      total_work[$server]=$(awk -v w="${total_work[$server]:-0}" -v r="$result" -v m="$mode" \
        -v s="$ops_seconds" 'BEGIN { print w + (m == "ops" ? r * s : 1) }')
    done
  done
  for server in dlrund torch; do
    local -a list
    mapfile -t list <<<"${results[$server]%$'\n'}"
    value[$server]=$(median "${list[@]}")
    cpu[$server]=$(awk -v t="${total_ticks[$server]:-0}" -v w="${total_work[$server]:-0}" \
      -v hz="$clk_tck" -v m="$mode" \
      'BEGIN { if (w == 0) print "-"; else printf (m == "ops" ? "%.1f" : "%.3f"), t / hz / w * (m == "ops" ? 1e6 : 1) }')
  done
}

failures=()
row_format='%-12s %13s %13s %8s %13s %13s\n'

# row LABEL FORMAT HIGHER_IS_BETTER: prints a table row from value[] and cpu[], with dlrund's
# advantage as a factor (>1: dlrund is faster); failures are listed under the tables.
row() {
  local label=$1 format=$2 higher=$3 cells=() server ratio=n/a
  for server in dlrund torch; do
    if [[ ${value[$server]} == failed* ]]; then
      cells+=(failed)
      failures+=("$label, $server: ${value[$server]}")
    else
      cells+=("$(awk -v v="${value[$server]}" -v f="$format" 'BEGIN { printf f, v }')")
    fi
  done
  if [[ ${cells[0]} != failed && ${cells[1]} != failed ]]; then
    ratio=$(awk -v d="${value[dlrund]}" -v t="${value[torch]}" -v h="$higher" \
      'BEGIN { printf "%.2f", h ? d / t : t / d }')
  fi
  printf "$row_format" "$label" "${cells[0]}" "${cells[1]}" "$ratio" "${cpu[dlrund]}" \
    "${cpu[torch]}"
}

echo "dlrund vs torch $torch_version TCPStore server (its default backend)" \
  "on $(nproc) cores; medians of $ops_repeats (ops, $ops_seconds s each) and" \
  "$barrier_repeats (barrier) runs, alternating servers"
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
echo
printf "$row_format" "ops clients" "dlrund ops/s" "torch ops/s" "speedup" "dlrund us/op" \
  "torch us/op"
for clients in 1 4 16; do
  measure "$ops_repeats" ops --clients "$clients" --seconds "$ops_seconds"
  row "$clients" "%d" 1
done
# Pipelined: 16 SET/GET/ADD triples in flight per client, so the server's own cost dominates.
for clients in 1 4 16; do
  measure "$ops_repeats" ops --clients "$clients" --seconds "$ops_seconds" --depth 16
  row "${clients} x16" "%d" 1
done
echo
printf "$row_format" "barrier N" "dlrund s" "torch s" "speedup" "dlrund CPU s" "torch CPU s"
for n in 256 1024 4096; do
  measure "$barrier_repeats" barrier --clients "$n"
  row "$n" "%.4f" 0
done
if [[ $era == 2 ]]; then
  for n in 256 1024 4096; do
    measure "$barrier_repeats" barrier --clients "$n" --native
    row "$n BARRIER" "%.4f" 0
  done
fi
echo
echo "speedup: dlrund's ops/s over torch's; torch's barrier time over dlrund's."
echo "K x16: K clients, each with 16 SET/GET/ADD triples in flight (pipelined requests)."
echo "N BARRIER: every client sends torch 2.x's BARRIER op; N alone: ADD, then WAIT on a key"
echo "the last arrival SETs."
echo "us/op, CPU s: the server's CPU time per op, and per barrier run including its connects"
echo "and closes (10 ms resolution). Client and server share the cores, so a server's CPU"
echo "cost shows where the wall-clock numbers are bound by the clients. With 1 client, ops/s"
echo "mostly measures wakeup latency: it changes several-fold with whether the scheduler puts"
echo "client and server on the same core."
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
for failure in "${failures[@]}"; do echo "$failure"; done
