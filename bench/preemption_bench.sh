#!/usr/bin/env bash
# A training job that checkpoints every step through dlrun.checkpoint (issue 56): its step time
# against the same job without saving, and preemption trials. bench/preemption_worker.py, 2 ranks
# under dlrun on one node, the recovery bench's MLP.
# - Step time: one run of STEPS steps, in blocks of 10, in turn, that only train, that save
#   every step, that save with overlap=True (the copy beside the next step), and that only copy
#   the same tensors into memory of their own with dlrun's copy (a machine's pace drifts, between
#   runs and within one); the median step of each kind, both ranks, a block's first 2 steps left
#   out, and their ratios to the steps that only train (goal: saving at most 1.03x; the copy
#   alone is the floor of any save that copies the state at once).
# - Preemption, TRIALS times: the job runs with --checkpoint-dir and, at a random moment after
#   its 5th step, dlrun gets SIGTERM. A trial passes when every rank stopped at the same step,
#   dlrun wrote it to the directory, and a new launch loaded it on every rank, its weights bit for
#   bit those the ranks stopped with, and went on. Prints the passes and the median seconds from
#   the SIGTERM to dlrun's exit.
#
# Usage: bench/preemption_bench.sh [BUILD_DIR] [--steps N] [--trials N] [--nproc N]
#        BUILD_DIR: default build. --steps: steps of the step-time run (2400). --trials: (20).
#        --nproc: ranks (2; the trials check ranks 0 and 1, so at least 2).
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment).
# Exit status: 0; 1 a run or a trial failed; 2 cannot run.
set -euo pipefail

build=build
if (($# > 0)) && [[ $1 != -* ]]; then
  build=$1
  shift
fi
steps=2400
trials=20
nproc=2
while (($# > 0)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    *) echo "preemption_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=preemption_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"
dlrun=$build/bin/dlrun
[[ -x $dlrun ]] || { echo "preemption_bench.sh: no $dlrun (build first)" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/dlrun-preemption-bench.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
launch() {  # OUT STEPS MODE [FLAG...]: dlrun in the background; its PID in $launched
  local out=$1 n=$2 mode=$3
  shift 3
  mkdir -p "$out"
  env -u PYTHONPATH "$dlrun" --standalone --nproc-per-node="$nproc" "$@" "$python" \
    "$here/preemption_worker.py" "$out" "$n" "$mode" > "$out/dlrun.log" 2>&1 &
  launched=$!
}
echo "preemption_bench: $nproc ranks, torch $torch_version, $(nproc) cores; $steps steps a run," \
  "$trials preemption trials"
launch "$scratch/steps" "$steps" alternate
wait "$launched" || { echo "preemption_bench.sh: the step-time run failed:" >&2
  tail -20 "$scratch/steps/dlrun.log" >&2; exit 1; }
"$python" - "$scratch" "$nproc" <<'PY'
import json, statistics, sys
scratch, nproc = sys.argv[1], int(sys.argv[2])
steps = [json.load(open(f"{scratch}/steps/times_{r}.json")) for r in range(nproc)]
# A block's first 2 steps left out: the one before's last save completes beside them.
kept = [(t, kind) for run in steps for i, (t, kind) in enumerate(run)
        if i >= 2 and run[i - 1][1] == run[i - 2][1] == kind]
save, overlap, plain, copy = (statistics.median(t for t, k in kept if k == kind)
                              for kind in ("save", "overlap", "plain", "copy"))
print(f"step time: {save * 1000:.2f} ms saving every step, {plain * 1000:.2f} ms without:"
      f" {save / plain:.3f}x; with overlap=True {overlap * 1000:.2f} ms, {overlap / plain:.3f}x;"
      f" copying the state alone {copy * 1000:.2f} ms, {copy / plain:.3f}x"
      f" (blocks of steps of each in turn, one run of {len(steps[0])})")
PY
passed=0
: > "$scratch/exits"
for ((trial = 1; trial <= trials; trial++)); do
  dir=$scratch/trial$trial
  launch "$dir/first" 1000000 save "--checkpoint-dir=$dir/checkpoints"
  for ((i = 0; i < 6000; i++)); do [[ -e $dir/first/running ]] && break; sleep 0.01; done
  sleep "0.$((RANDOM % 1000))"  # a random moment of the run: the ranks anywhere in a step
  began=$(date +%s%N)
  kill -TERM "$launched"
  wait "$launched" || true
  echo $((($(date +%s%N) - began) / 1000000)) >> "$scratch/exits"
  stopped=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' \
    "$dir/first/stopped_0.json" 2>/dev/null || echo -3)
  launch "$dir/again" $((stopped + 3)) save "--checkpoint-dir=$dir/checkpoints"
  wait "$launched" || true
  if "$python" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
stops = [json.load(open(f"{d}/first/stopped_{r}.json")) for r in (0, 1)]
loads = [json.load(open(f"{d}/again/loaded_{r}.json")) for r in (0, 1)]
assert stops[0]["step"] == stops[1]["step"], stops
assert all(l["step"] == s["step"] and l["sha256"] == s["sha256"] for l, s in zip(loads, stops)), (stops, loads)
assert all(len(json.load(open(f"{d}/again/times_{r}.json"))) == 2 for r in (0, 1))
PY
  then
    passed=$((passed + 1))
  else
    echo "trial $trial failed: $(tail -5 "$dir/first/dlrun.log" "$dir/again/dlrun.log")" >&2
  fi
done
median=$(sort -n "$scratch/exits" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "preemption: $passed of $trials trials stopped every rank at one step and resumed from it;" \
  "dlrun exited $median ms after SIGTERM (median)"
((passed == trials)) || exit 1
