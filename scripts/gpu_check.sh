#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device (elsewhere ctest skips the GPU tests): builds
# if needed, trains with `dlrun-train --device cuda` alone and with 2 workers through dlrun, then
# runs the GPU tests under ctest: the CUDA engine against the CPU engine, the NCCL id exchange
# through the store, and data-parallel equivalence on cuda (tests/python/test_trainer_gpu.py).
# A GPU test that skips here fails the check. Exits 0 when all pass, 1 when something fails,
# 2 when the build has no CUDA engine, no CUDA device is usable or Fashion-MNIST is missing.
#
#   bash scripts/gpu_check.sh
#
# DLRUN_BUILD_DIR picks the build (default: build/).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
data=/usr/share/datasets/fashion-mnist

fail() {
  echo "gpu_check: $2" >&2
  exit "$1"
}

[[ -f $build/CMakeCache.txt ]] || cmake -S "$root" -B "$build" -G Ninja
cmake --build "$build"
# The CUDA engine's tests are built only when CMake found CUDA, cuBLAS and NCCL.
[[ -x $build/bin/trainer_cuda_engine_test ]] ||
  fail 2 "$build has no CUDA engine: CMake found no CUDA, cuBLAS or NCCL (or DLRUN_CUDA=OFF)"
[[ -f $data/train-images-idx3-ubyte.gz ]] ||
  fail 2 "Fashion-MNIST is not in $data (Debian package dataset-fashion-mnist)"

echo "gpu_check: dlrun-train --single --device cuda --epochs 1"
status=0
"$build/bin/dlrun-train" --single --device cuda --epochs 1 || status=$?
((status != 2)) || fail 2 "no usable CUDA device (see the error above)"
((status == 0)) || fail 1 "the single-worker run failed with exit code $status"

echo "gpu_check: dlrun --standalone --nproc-per-node=2 train --device cuda --epochs 1"
"$build/bin/dlrun" --standalone --nproc-per-node=2 train --device cuda --epochs 1 ||
  fail 1 "the 2-worker run failed"

log=$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -f "$log"' EXIT
status=0
ctest --test-dir "$build" --output-on-failure --timeout 300 \
  -R '^(Sum/CudaEngineTest\..*|NcclId.*|python_trainer_gpu)$' 2>&1 | tee "$log" || status=$?
((status == 0)) || fail 1 "a GPU test failed"
! grep -q '(Skipped)' "$log" || fail 1 "a GPU test skipped on this machine (see above)"
echo "gpu_check: PASS"
