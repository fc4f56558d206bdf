#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite under ctest; ARGS go to
# ctest after the suite's own (`-R python_slurm`: that test alone).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" --tests
# -LE release: test_quickstart_releases.py builds in fresh roots of Debian 12 and 13, which takes
# long; ctest --test-dir build -L release runs it. -LE soak: the rendezvous simulation's million
# schedules and its injected bugs (an hour on 2 cores); ctest --test-dir build -L soak runs them.
ctest --test-dir "$build" --output-on-failure -j2 --timeout 300 -LE 'release|soak' "$@"
