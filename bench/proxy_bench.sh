#!/usr/bin/env bash
# A store barrier at scale as torch's init_process_group does it (issue 32): every rank ADDs 1
# to a counter, the last SETs a done key, all WAIT on it; (a) every rank straight to dlrund,
# (b) through store proxies of 8 and 64 ranks each (inside the load generators, each with its
# own connections to dlrund, as dlrun's agents on such nodes), (c) straight to torch 2.13's
# TCPStore server (bench/anchor.sh, libuv). Wall time, the store's CPU per rank and its peak
# memory; ratios (c)/(a), (a)/(b)'s store CPU per rank (goal: 8x), (b)'s wall at 100,000 ranks
# (goal: 5 s). The ranks are dlrun-barrier-load processes (bench/barrier_load.cpp); the driver
# is bench/proxy_bench.py. Builds nothing; takes about three minutes on 2 cores.
#
# Usage: bench/proxy_bench.sh [BUILD_DIR] [DRIVER OPTIONS]     (default: build)
#        e.g. --direct 8000,19000 --proxied 19000,100000 --per-proxy 8,64 --repeats 1
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment); DRIVER_PYTHON
#              (/usr/bin/python3, runs the driver).
set -euo pipefail

build=${1:-build}
(($#)) && shift
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=proxy_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"

for program in "$build/bin/dlrun-barrier-load" "$build/bin/dlrund"; do
  [[ -x $program ]] || { echo "proxy_bench.sh: $program not found; build first" >&2; exit 2; }
done

# Every process the driver starts inherits this (it raises its own too).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
dns=()
((${#no_dns[@]})) && dns=(--no-dns)
exec "${DRIVER_PYTHON:-/usr/bin/python3}" "$here/proxy_bench.py" --build "$build" \
  --python "$python" --torch-version "$torch_version" ${dns[@]+"${dns[@]}"} "$@"
