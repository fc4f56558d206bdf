#!/usr/bin/env bash
# What identical lines printed once cost the agent (issue 58): its CPU while 8 workers on one
# node print 100,000 lines a second in all, with and without --console-dedup, for lines the
# same on every rank and lines of each rank's own (bench/console_bench.py says how). With --hosts
# (as root), first the figure of 4 simulated hosts x 256 ranks: each shared line's count on each
# node's console and in `dlrun logs --grouped` (bench/console_hosts.py).
#
# Usage: bench/console_bench.sh [BUILD_DIR] [--workers N] [--rate LINES_A_SECOND] [--seconds S]
#                               [--hosts [HOSTSxRANKS]]
#        defaults: build, 8, 100000, 10; --hosts 4x256.
# Environment: PYTHON (python3: the workers are plain Python).
# Exit status: 0 the goal met (under 5% of one core); 1 a run failed or the goal missed;
#              2 cannot run.
set -euo pipefail

build=build
if (($# > 0)) && [[ $1 != -* ]]; then
  build=$1
  shift
fi
workers=8 rate=100000 seconds=10 hosts=
while (($# > 0)); do
  case $1 in
    --hosts)
      hosts=4x256
      if (($# > 1)) && [[ $2 == *x* ]]; then hosts=$2; shift; fi
      shift ;;
    --workers) workers=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "console_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
[[ -x $build/bin/dlrun ]] || { echo "console_bench.sh: no $build/bin/dlrun" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-console-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
echo "console_bench: $(nproc) cores, load average $(cut -d ' ' -f 1-3 /proc/loadavg)"
if [[ -n $hosts ]]; then
  ((EUID == 0)) || { echo "console_bench.sh: --hosts needs root (network namespaces)" >&2; exit 2; }
  # The default window, then one longer than the ranks take to print here (about 1 s on 2 cores).
  for window in "" 2; do
    mkdir "$scratch/hosts$window"
    echo "--console-dedup-window=${window:-0.1 (the default)}:"
    "$python" "$here/console_hosts.py" "$(realpath "$build/bin/dlrun")" \
      "$here/../scripts/netns.sh" "${hosts%x*}" "${hosts#*x}" "$scratch/hosts$window" $window
  done
fi
"$python" "$here/console_bench.py" "$build/bin/dlrun" "$python" "$workers" "$rate" "$seconds" \
  "$scratch"
