#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device (elsewhere the GPU tests skip): trains with
# `dlrun-train --device cuda` alone and with 2 workers through dlrun, then runs the GPU tests: the
# CUDA engine against the CPU engine, the NCCL id exchange through the store, data-parallel
# equivalence on cuda (tests/python/test_trainer_gpu.py) and, where PYTHON has torch with CUDA,
# in-process recovery on NCCL (tests/python/test_inprocess_recovery_nccl.py). A GPU test that
# skips here fails the check. Exits 0 when all pass, 1 when something fails, 2 when the build has
# no CUDA engine, no CUDA device is usable or Fashion-MNIST is missing.
#
#   bash scripts/gpu_check.sh
#
# DLRUN_BUILD_DIR picks the build (default: build/), configured and built here when it has a
# CMakeCache.txt or nothing yet; a folder made by scripts/gpu_bundle.sh runs as it is, its lib/
# on the loader's path (and PyTorch's CUDA wheels' libraries where the node has no others).
# PYTHON names the tests' interpreter (default: python3). GPU_CHECK_BENCH=N also runs the
# recovery benchmark on NCCL, N rounds (root, iproute2: its simulated hosts), then
# bench/nccl_leave.py (what leaving a broken NCCL group costs) and the checkpoint benchmark with
# the state on the GPU.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
bin=$build/bin
python=${PYTHON:-python3}
data=/usr/share/datasets/fashion-mnist

fail() {
  echo "gpu_check: $2" >&2
  exit "$1"
}

if [[ -f $build/CMakeCache.txt || ! -d $bin ]]; then
  [[ -f $build/CMakeCache.txt ]] || cmake -S "$root" -B "$build" -G Ninja
  cmake --build "$build"
fi
[[ ! -d $build/lib ]] || export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The CUDA engine's tests are built only when CMake found CUDA, cuBLAS and NCCL.
[[ -x $bin/trainer_cuda_engine_test ]] ||
  fail 2 "$build has no CUDA engine: CMake found no CUDA, cuBLAS or NCCL (or DLRUN_CUDA=OFF)"
[[ -f $data/train-images-idx3-ubyte.gz ]] ||
  fail 2 "Fashion-MNIST is not in $data (Debian package dataset-fashion-mnist)"
# The CUDA engine is the module beside dlrun-train (trainer/cuda_module.h), not dlrun-train.
module=$bin/dlrun-train-cuda.so
# A node whose CUDA runtime, cuBLAS and NCCL come with PyTorch's wheels alone (under
# site-packages/nvidia): their folders go on the loader's path when the module finds none.
if ldd "$module" | grep -q 'not found'; then
  wheels=$("$python" -c 'import glob, site
print(":".join(d for b in site.getsitepackages() for d in sorted(glob.glob(b + "/nvidia/*/lib"))))' \
    2>/dev/null) || wheels=
  [[ -z $wheels ]] || export LD_LIBRARY_PATH=$wheels${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
cudart=$(ldd "$module" | awk '$1 ~ /^libcudart/ {print $3}')
[[ -f $cudart ]] || fail 2 "$module finds no CUDA runtime (libcudart): $(ldd "$module")"

echo "gpu_check: dlrun-train --single --device cuda --epochs 1"
status=0
"$bin/dlrun-train" --single --device cuda --epochs 1 || status=$?
((status != 2)) || fail 2 "no usable CUDA device (see the error above)"
((status == 0)) || fail 1 "the single-worker run failed with exit code $status"

echo "gpu_check: dlrun --standalone --nproc-per-node=2 train --device cuda --epochs 1"
"$bin/dlrun" --standalone --nproc-per-node=2 train --device cuda --epochs 1 ||
  fail 1 "the 2-worker run failed"

# The CUDA engine trains the MLP only so far: --device auto must take the CPU for the CNN and
# say so, and the CNN must train there (its step on the CPU, the all-reduce as ever).
echo "gpu_check: dlrun-train --single --model cnn --device auto --epochs 1 --max-steps 100"
out=$("$bin/dlrun-train" --single --model cnn --device auto --epochs 1 --max-steps 100 2>&1) ||
  fail 1 "the CNN run failed: $out"
grep -q -- '--device auto: cpu, as the CUDA engine trains --model mlp only' <<<"$out" ||
  fail 1 "the CNN run did not say it trains on the CPU: $out"

log=$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -f "$log"' EXIT
for test in trainer_cuda_engine_test trainer_nccl_id_test; do
  echo "gpu_check: $test"
  "$bin/$test" 2>&1 | tee "$log" || fail 1 "$test failed"
  ! grep -q '^\[  SKIPPED \]' "$log" || fail 1 "$test skipped a test on this machine (see above)"
done
echo "gpu_check: tests/python/test_trainer_gpu.py"
status=0
DLRUN=$bin/dlrun DLRUN_TRAIN=$bin/dlrun-train DLRUN_CUDART=$cudart \
  "$python" "$root/tests/python/test_trainer_gpu.py" 2>&1 | tee "$log" || status=$?
((status != 77)) || fail 1 "test_trainer_gpu.py skipped on this machine (see above)"
((status == 0)) || fail 1 "test_trainer_gpu.py failed"
! grep -q 'skipped' "$log" || fail 1 "test_trainer_gpu.py skipped a test on this machine (see above)"

if "$python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "gpu_check: tests/python/test_inprocess_recovery_nccl.py"
  status=0
  DLRUN=$bin/dlrun "$python" "$root/tests/python/test_inprocess_recovery_nccl.py" -v 2>&1 |
    tee "$log" || status=$?
  ((status != 77)) || fail 1 "test_inprocess_recovery_nccl.py skipped on this machine (see above)"
  ((status == 0)) || fail 1 "test_inprocess_recovery_nccl.py failed"
  # GPU_CHECK_BENCH=N: the recovery benchmark's worker case on NCCL, N rounds (four ranks on the
  # node's devices; they share one over sockets on loopback where there are fewer).
  if [[ -n ${GPU_CHECK_BENCH:-} ]]; then
    echo "gpu_check: bench/recovery_bench.sh --backend nccl --trials $GPU_CHECK_BENCH"
    NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} PYTHON=$(command -v "$python") \
      bash "$root/bench/recovery_bench.sh" "$build" --nproc 4 --trials "$GPU_CHECK_BENCH" \
      --cases worker --launchers dlrun,dlrun-warm,dlrun-inproc-warm --backend nccl ||
      fail 1 "the recovery benchmark on NCCL failed"
    echo "gpu_check: bench/nccl_leave.py (a survivor's leaving of a broken NCCL group, in parts)"
    "$python" "$root/bench/nccl_leave.py" || fail 1 "bench/nccl_leave.py failed"
    echo "gpu_check: bench/checkpoint_bench.sh --device cuda (checkpoints of state on the GPU)"
    PYTHON=$(command -v "$python") bash "$root/bench/checkpoint_bench.sh" "$build" --device cuda \
      --sizes 100,1024 --host-sizes none || fail 1 "the checkpoint benchmark on the GPU failed"
  fi
else
  echo "gpu_check: $python has no torch with CUDA: in-process recovery on NCCL not run"
fi
echo "gpu_check: PASS"
