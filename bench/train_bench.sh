#!/usr/bin/env bash
# Compares `dlrun --standalone --nproc-per-node=N train` with the same job in PyTorch DDP
# (bench/torch_ddp_train.py: gloo, CPU, one thread per worker) under torchrun (torch 2.13,
# bench/anchor.sh), for N = 1 and 2: the time from the launch to the end of the
# first epoch whose test accuracy reaches 0.88, and training samples per second. Each system is
# timed from its launch by train_bench.py, which says how. Builds nothing; by default takes
# about five to nine minutes (most of it torch with Debian's reference BLAS), at most about ten.
#
# MODEL=cnn compares the convolutional model instead (train --model cnn; the same layers in
# torch), by default over 8 epochs to 0.90, and then puts dlrun-train's step (one worker, batch
# 64, from its samples/s) against the same step's GEMMs timed alone (build/bin/dlrun-cnn-gemms,
# the roofline of this model on this CPU; needs AVX2 and FMA).
#
# Debian's torch does its matrix products through libblas.so.3, by default the reference
# (netlib) BLAS, which is many times slower than the OpenBLAS or MKL that other builds of torch
# use. Give BLAS_DIR (a directory with an optimised libblas.so.3, e.g. Debian's
# /usr/lib/x86_64-linux-gnu/openblas-pthread from libopenblas0-pthread, the default when it
# exists) and torch also runs with that library first on LD_LIBRARY_PATH, in a table of its own.
# Without installing anything: `apt-get download libopenblas0-pthread && dpkg -x
# libopenblas0-pthread_*.deb DIR`, then BLAS_DIR=DIR/usr/lib/x86_64-linux-gnu/openblas-pthread.
#
# Usage: bench/train_bench.sh [BUILD_DIR]     (default: build)
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment), MODEL (mlp or cnn),
#              EPOCHS (12, cnn 8: the length of the run and of the cosine schedule), TARGET
#              (0.88, cnn 0.90), REPEATS (1),
#              NPROCS (1,2), STOP_AT_TARGET (1: stop each launch once it reports the target;
#              0: run all EPOCHS), BLAS_DIR (see above; empty: torch with Debian's BLAS only),
#              BUDGET_SECONDS (540: no launch starts after it, and one under way then is
#              stopped 20 s past it), LOG (a file for every output line, time-stamped).
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
anchor_for=train_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"
default_blas=/usr/lib/x86_64-linux-gnu/openblas-pthread
[[ -e $default_blas/libblas.so.3 ]] || default_blas=
# torch 2.x from PyPI brings its own math libraries (MKL, oneDNN): no libblas.so.3 to swap.
torch_blas="its own MKL and oneDNN"
if [[ $torch_version == 1.* ]]; then
  torch_blas="Debian's libblas.so.3"
else
  default_blas=
fi
blas_dir=${BLAS_DIR-$default_blas}

# Both launchers may write under TMPDIR (torchrun leaves its directories behind): a private one,
# removed at the end. train_bench.py runs in the background so that INT and TERM reach the traps
# while it runs; it stops the launch under way itself when it gets TERM.
# shellcheck source=bench/background.sh
source "$here/background.sh"
need_trainer "$build"
if [[ -n $blas_dir && ! -e $blas_dir/libblas.so.3 ]]; then
  echo "train_bench.sh: BLAS_DIR=$blas_dir holds no libblas.so.3" >&2
  exit 2
fi

model=${MODEL:-mlp}
[[ $model == mlp || $model == cnn ]] || { echo "train_bench.sh: MODEL=$model: mlp or cnn" >&2; exit 2; }
epochs=${EPOCHS:-12} target=${TARGET:-0.88}
goal=2  # the MLP's (issue 16); the CNN's ratios are reported, with no goal set
[[ $model == cnn ]] && epochs=${EPOCHS:-8} target=${TARGET:-0.90} goal=0
stop_flag=()
[[ ${STOP_AT_TARGET:-1} == 1 ]] && stop_flag=(--stop-at-target)

echo "dlrun train --model $model vs torch $torch_version DDP (gloo, CPU) under torchrun on" \
  "$(nproc) cores: $epochs epochs (cosine over them), target test accuracy $target," \
  "${REPEATS:-1} run(s) per row, alternating"
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch ${no_dns[@]+"${no_dns[@]}"} "$python" "$here/train_bench.py" --dlrun "$dlrun" --python "$python" \
  --torchrun "${torchrun[@]}" --torch-script "$here/torch_ddp_train.py" \
  --blas-dir "$blas_dir" --torch-blas "$torch_blas" --model "$model" --nprocs "${NPROCS:-1,2}" \
  --epochs "$epochs" --target "$target" --goal-ratio "$goal" --repeats "${REPEATS:-1}" \
  --budget "${BUDGET_SECONDS:-540}" \
  --log "${LOG:-/dev/null}" "${stop_flag[@]}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=
if [[ $model == cnn ]]; then
  gemms=$build/bin/dlrun-cnn-gemms
  if [[ ! -x $gemms ]] || ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
    echo "roofline: n/a (no $gemms, or this CPU lacks AVX2 or FMA)"
  else
    step=$("$build/bin/dlrun-train" --single --model cnn --epochs 1 --max-steps 300 \
      --progress-every 1000000 | tail -n 1)
    gemm=$("$gemms" --batch 64 --repeats 100)
    python3 - "$step" "$gemm" <<'PY'
import json, sys
step, gemm = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ms = 64 / step["samples_per_sec"] * 1000
print(f"roofline: dlrun-train's CNN step (1 worker, batch 64, 300 steps: data copy, im2col, "
      f"GEMMs, pooling, softmax, SGD) {ms:.2f} ms against its GEMMs alone {gemm['ms']:.2f} ms "
      f"({gemm['gflop']:.3f} GFLOP, {gemm['gflop'] / gemm['ms'] * 1000:.1f} GFLOP/s): "
      f"{ms / gemm['ms']:.2f}x the roofline")
PY
  fi
fi
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
