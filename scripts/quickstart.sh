#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh: building's packages, and the programs the job runs) and
# runs the main job: the bundled trainer on Fashion-MNIST, four CPU workers on this machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" dlrun dlrund dlrun-train
exec "$build/bin/dlrun" --standalone --nproc-per-node=4 train "$@"
