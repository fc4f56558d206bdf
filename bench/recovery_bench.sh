#!/usr/bin/env bash
# What a failure costs a training job (bench/recovery_bench.py says how it measures): the time
# from a fault to the job's next completed training step, for a torch DDP job on CPU (gloo, an
# MLP of 1.2 M parameters, a checkpoint every step), under dlrun and under torchrun (torch 2.13,
# bench/anchor.sh) in the same run, against the floor: the same workers started by hand with no
# launcher. The faults: one worker SIGKILLed (--standalone); one SIGSTOPped (a hang, dlrun's
# --hang-timeout); a member host killed in a 2-node job with a spare; one node's launcher
# SIGKILLed in a --nnodes=1:2 job. The multi-node jobs run on simulated hosts (network
# namespaces, scripts/netns.sh) through a dlrund. Prints a table per
# fault (successes/trials, median and worst recovery, the ratio to the floor), the floor and one
# summary line. Needs root. Builds nothing; about 30-40 minutes at 10 rounds on 2 cores, a few
# with --quick.
#
# Usage: bench/recovery_bench.sh [BUILD_DIR] [--trials N] [--nproc N] [--cases worker,hang,host,agent]
#          [--launchers dlrun,dlrun-warm,dlrun-inproc,dlrun-inproc-warm,torchrun]
#          [--deadline S] [--max-restarts K] [--rdzv-conf K=V,...] [--quick] [--keep DIR]
#          [--backend gloo|nccl] [--step-seconds S]
#        BUILD_DIR: default build. --trials: rounds (10; --quick 2). --nproc: workers per node
#        (2). --deadline: seconds from the fault to the next step (60). --rdzv-conf: more
#        settings for both launchers (e.g. last_call_timeout=1; default: each one's own).
#        --keep DIR: copy every trial's files there (steps, launcher and dlrund logs; not the
#        checkpoints).
#        --backend nccl: the job on CUDA through NCCL (a GPU machine; NCCL_SOCKET_IFNAME=lo
#        where ranks share a GPU).
#        --step-seconds: the least time between the job's steps (0.1; 0: back to back, as a
#        training job runs).
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment).
# Exit status: 0; 1 a dlrun trial failed or the floor could not be measured; 2 cannot run.
set -euo pipefail

build=build
if (($# > 0)) && [[ $1 != -* ]]; then
  build=$1
  shift
fi
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=recovery_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"

if [[ $torch_version == 1.* ]]; then
  # The workers' restarts and torchrun's flags (dash spellings, c10d's is_host) are torch 2's.
  echo "recovery_bench.sh: needs torch 2.x; $python has torch $torch_version" >&2
  exit 2
fi
if ((EUID != 0)); then
  echo "recovery_bench.sh: needs root (network namespaces)" >&2
  exit 2
fi
for program in dlrun dlrund; do
  [[ -x $build/bin/$program ]] ||
    { echo "recovery_bench.sh: $build/bin/$program not found; build first" >&2; exit 2; }
done

# The scratch directory (background.sh: removed at the end) on tmpfs where there is one: every
# step writes a 4.8 MB checkpoint, which is no load to put on a shared machine's disk; a restart
# reads it from the page cache either way.
if [[ -d /dev/shm && -w /dev/shm ]]; then
  export TMPDIR=/dev/shm
fi
# recovery_bench.py runs in the background so that INT and TERM reach the traps while it runs;
# on TERM it kills the trial under way by PID and takes its simulated hosts down.
# shellcheck source=bench/background.sh
source "$here/background.sh"

# Copies of the programs, run throughout: a build directory rebuilt meanwhile would hand a trial
# an executable half-written by the linker. dlrun's own files beside it (--warm-start's Python
# program) come along, since dlrun looks for them beside itself first.
mkdir "$scratch/bin"
for file in "$build"/bin/dlrun "$build"/bin/dlrund "$build"/bin/*.py; do
  if [[ -f $file ]]; then
    cp -p "$file" "$scratch/bin/"
  fi
done
# And the dlrun package the workers import (dlrun.recovery, dlrun.progress), where dlrun looks
# for it from its own directory in a build tree: ../share/dlrun/python.
if [[ -d $build/share/dlrun/python ]]; then
  mkdir -p "$scratch/share/dlrun"
  cp -rp "$build/share/dlrun/python" "$scratch/share/dlrun/"
fi
dlrun=$scratch/bin/dlrun
dlrund=$scratch/bin/dlrund
"$dlrun" --version >/dev/null ||
  { echo "recovery_bench.sh: $build/bin/dlrun --version failed; is it being rebuilt?" >&2; exit 2; }

echo "recovery after a fault: dlrun vs $torchrun_name, torch DDP on $(nproc) cores"
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
"$python" "$here/recovery_bench.py" --dlrun "$dlrun" --dlrund "$dlrund" --python "$python" \
  --scratch "$scratch" "$@" --torchrun "${torchrun[@]}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
