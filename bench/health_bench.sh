#!/usr/bin/env bash
# What the checks before a round cost, and whether they find what they are for (issue 57), as
# root on simulated hosts (bench/health_bench.py says how each is measured):
#   - 4 hosts and a spare: a job of 4 nodes, bare (--no-network-probe) and with every check
#     (--health-check, --health-min-free, the network probe): the checks' cost (goal: under 1 s);
#   - one host's sending slowed to 100 Mbit/s: named as the slowest link's (goal: every trial);
#   - one host failing its check: the round formed without it, within the bare time plus 1 s
#     (goal: every trial);
#   - N agents on one machine, bare and with every check: how the cost grows;
#   - a worker failing at the same step every attempt: the job ends with 93, its cause in one line.
#
# Usage: bench/health_bench.sh [BUILD_DIR] [--trials N] [--agents N,N]
#        BUILD_DIR: default build. --trials: of each finding (20). --agents: the agent counts
#        on one machine (4,16,64).
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment; the crash loop's
#              worker imports dlrun.progress).
# Exit status: 0; 1 a run failed or a finding missed; 2 cannot run.
set -euo pipefail

build=build
if (($# > 0)) && [[ $1 != -* ]]; then
  build=$1
  shift
fi
trials=20
agents=4,16,64
while (($# > 0)); do
  case $1 in
    --trials) trials=$2; shift 2 ;;
    --agents) agents=$2; shift 2 ;;
    *) echo "health_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=health_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"
for program in dlrun dlrund; do
  [[ -x $build/bin/$program ]] || { echo "health_bench.sh: no $build/bin/$program" >&2; exit 2; }
done
((EUID == 0)) || { echo "health_bench.sh: the simulated hosts need root" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-health-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
echo "health_bench: $(nproc) cores, $trials trials, agents $agents on one machine"
env -u PYTHONPATH "$python" "$here/health_bench.py" \
  "$build/bin/dlrun" "$build/bin/dlrund" "$python" "$trials" "$agents" "$scratch"
