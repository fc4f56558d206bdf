#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs into one folder, for a GPU machine that has a CUDA
# runtime, cuBLAS and NCCL but none of the build's other libraries (Gloo, libslurm, ...): the
# programs and the GPU tests' binaries under bin/, every library they load that a GPU node may
# lack under lib/, dlrun's Python side where dlrun finds it (bin/*.py, share/dlrun/python).
# glibc's, libstdc++'s and CUDA's own libraries stay behind: the node's serve.
#
#   bash scripts/gpu_bundle.sh OUT       # then on the GPU machine:
#   DLRUN_BUILD_DIR=OUT bash scripts/gpu_check.sh
#
# DLRUN_BUILD_DIR picks the build to pack (default: build/); it must have the CUDA engine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
out=${1:?usage: gpu_bundle.sh OUT}
programs=(dlrun dlrund dlrun-train dlrun-train-avx2.so dlrun-train-cuda.so
          trainer_cuda_engine_test trainer_nccl_id_test)
# What any Linux GPU node has: the C runtime, the C++ runtime, zlib, and CUDA's libraries.
node_has='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libz|libcudart|libnccl|libcublas(Lt)?)\.so'

[[ -x $build/bin/trainer_cuda_engine_test ]] ||
  { echo "gpu_bundle: $build has no CUDA engine (CMake found no CUDA, cuBLAS or NCCL)" >&2; exit 2; }
mkdir -p "$out/bin" "$out/lib"
for p in "${programs[@]}"; do cp -L "$build/bin/$p" "$out/bin/"; done
cp "$build"/bin/*.py "$out/bin/"
mkdir -p "$out/share/dlrun"
cp -r "$build/share/dlrun/python" "$out/share/dlrun/"
for p in "${programs[@]}"; do ldd "$build/bin/$p"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $node_has ]] || cp -L "$path" "$out/lib/$name"
  done
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
du -sh "$out"
