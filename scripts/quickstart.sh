#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job: for now, dlrund on a free port
# driven by four real PyTorch workers that meet through it and all-reduce a tensor.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
exec /usr/bin/python3 "$root/scripts/store_smoke.py" "$build/bin/dlrund"
