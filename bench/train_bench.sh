#!/usr/bin/env bash
# Compares `dlrun --standalone --nproc-per-node=N train` with the same job in PyTorch DDP
# (bench/torch_ddp_train.py: gloo, CPU, one thread per worker) under torchrun (torch 2.13,
# bench/anchor.sh), for N = 1 and 2: the time from the launch to the end of the
# first epoch whose test accuracy reaches 0.88, and training samples per second. Each system is
# timed from its launch by train_bench.py, which says how. Builds nothing; by default takes
# about five to nine minutes (most of it torch with Debian's reference BLAS), at most about ten.
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
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment), EPOCHS (12: the length
#              of the run and of the cosine schedule), TARGET (0.88), REPEATS (1),
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

stop_flag=()
[[ ${STOP_AT_TARGET:-1} == 1 ]] && stop_flag=(--stop-at-target)

echo "dlrun train vs torch $torch_version DDP (gloo, CPU) under torchrun on $(nproc) cores:" \
  "${EPOCHS:-12} epochs (cosine over them), target test accuracy ${TARGET:-0.88}," \
  "${REPEATS:-1} run(s) per row, alternating"
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch ${no_dns[@]+"${no_dns[@]}"} "$python" "$here/train_bench.py" --dlrun "$dlrun" --python "$python" \
  --torchrun "${torchrun[@]}" --torch-script "$here/torch_ddp_train.py" \
  --blas-dir "$blas_dir" --torch-blas "$torch_blas" --nprocs "${NPROCS:-1,2}" --epochs "${EPOCHS:-12}" \
  --target "${TARGET:-0.88}" --repeats "${REPEATS:-1}" --budget "${BUDGET_SECONDS:-540}" \
  --log "${LOG:-/dev/null}" "${stop_flag[@]}" &
bench_pid=$!
wait "$bench_pid" || status=$?
bench_pid=
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
