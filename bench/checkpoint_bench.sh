#!/usr/bin/env bash
# What a checkpoint costs a training loop (issue 56): dlrun.checkpoint in the node's memory
# against torch.save and torch.load to local disk, in the same processes
# (bench/checkpoint_worker.py), 2 ranks on one node under dlrun, a state of each size per rank.
# Prints, per size, the medians over the steps after the first two (the first saves allocate
# the memory) and the ratios: the time save blocks the loop against torch.save's (goal: at most
# 0.1x), the time from save's return to the copy complete, and load() against torch.load (goal:
# at most 0.2x); the first save's time beside them. Then, as root, on 2 simulated hosts of 2 ranks
# and a spare (bench/checkpoint_hosts.py): the time from save's return to the copy held by the
# peer node's agent, and a host lost after the last step: each rank's restore against its
# torch.load (fetched from the peer, or from its node's memory), and the steps lost (goal: 0).
#
# Usage: bench/checkpoint_bench.sh [BUILD_DIR] [--sizes MB,MB] [--host-sizes MB,MB] [--steps N]
#                                  [--device cpu|cuda]
#        BUILD_DIR: default build. --sizes: the state per rank in MB (100,1024). --host-sizes:
#        the same on the simulated hosts (100,1024; each needs about 5 times the size 4 times
#        over in memory: the states, two steps per rank, two held for the peer; none: skip).
#        --steps: saves per size (8). --device: where the one-node runs' state lives (cpu; cuda:
#        each rank's GPU, and load() timed with the state moved there, as torch.load puts it).
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment).
# Exit status: 0; 1 a run failed; 2 cannot run.
set -euo pipefail

build=build
if (($# > 0)) && [[ $1 != -* ]]; then
  build=$1
  shift
fi
sizes=100,1024
host_sizes=100,1024
steps=8
device=cpu
while (($# > 0)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --host-sizes) host_sizes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    *) echo "checkpoint_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $device == cpu || $device == cuda ]] ||
  { echo "checkpoint_bench.sh: --device must be cpu or cuda, not $device" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=checkpoint_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"
dlrun=$build/bin/dlrun
[[ -x $dlrun ]] || { echo "checkpoint_bench.sh: no $dlrun (build first)" >&2; exit 2; }
if [[ $device == cuda ]] && ! "$python" -c 'import torch; assert torch.cuda.is_available()' \
  2>/dev/null; then
  echo "checkpoint_bench.sh: --device cuda, but $python's torch sees no CUDA device" >&2
  exit 2
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-checkpoint-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
echo "checkpoint_bench: 2 ranks, torch $torch_version, $(nproc) cores; torch.save to $scratch" \
  "($(df --output=fstype "$scratch" | tail -1)); sizes $sizes MB on $device, $steps saves each"
for size in ${sizes//,/ }; do
  out=$scratch/$size
  mkdir -p "$out"
  env -u PYTHONPATH "$dlrun" --standalone --nproc-per-node=2 "$python" \
    "$here/checkpoint_worker.py" "$out" "$size" "$steps" "device:$device" \
    > "$out/dlrun.log" 2>&1 || {
    echo "checkpoint_bench.sh: the $size MB run failed:" >&2
    tail -20 "$out/dlrun.log" >&2
    exit 1
  }
  "$python" - "$out" "$size" <<'PY'
import json, statistics, sys
out, size = sys.argv[1], sys.argv[2]
runs = [json.load(open(f"{out}/rank_{r}.json")) for r in (0, 1)]
def median(name, first=2):
    return statistics.median(x for run in runs for x in run[name][first:])
save, tsave = median("save"), median("torch_save")
load, tload = median("load", 0), median("torch_load", 0)
print(f"{size} MB a rank: save blocks {save:.3f} s, torch.save {tsave:.3f} s: {save / tsave:.2f}x"
      f" (the first save {max(run['save'][0] for run in runs):.3f} s); complete "
      f"{median('complete'):.3f} s after; load {load:.3f} s, torch.load {tload:.3f} s: "
      f"{load / tload:.2f}x")
PY
done
[[ $host_sizes == none ]] && exit 0
if ((EUID != 0)); then
  echo "checkpoint_bench: the simulated hosts need root; skipped"
  exit 0
fi
[[ -x $build/bin/dlrund ]] || { echo "checkpoint_bench.sh: no $build/bin/dlrund" >&2; exit 2; }
for size in ${host_sizes//,/ }; do
  out=$scratch/hosts-$size
  mkdir -p "$out"
  "$python" "$here/checkpoint_hosts.py" "$(realpath "$dlrun")" "$(realpath "$build/bin/dlrund")" \
    "$python" "$size" "$steps" "$out" || {
    echo "checkpoint_bench.sh: the $size MB run on simulated hosts failed:" >&2
    tail -20 "$out"/dlrun*.log >&2
    exit 1
  }
done
