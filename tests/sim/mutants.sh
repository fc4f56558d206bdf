#!/usr/bin/env bash
# Bugs put into the rendezvous on purpose (tests/sim/mutants/*.patch, each one change), every one
# of which the simulation's default budget must catch. For each: the rendezvous's sources with
# the patch applied are compiled, linked with the simulation and the other libraries of BUILD,
# and seeds 1 to 20,000 run until one breaks an invariant. Prints each mutant, the seed that
# caught it and the invariant; exits 1 if a mutant is not caught or no longer applies.
# Usage: tests/sim/mutants.sh [BUILD]   (default: build; it must have built rendezvous_sim)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cxx=(c++)
command -v ccache > /dev/null && cxx=(ccache c++)
flags=(-O2 -std=c++20 -DNDEBUG -w)
main_object=$build/tests/CMakeFiles/rendezvous_sim.dir/sim/rendezvous_sim.cpp.o
for needed in "$main_object" "$build/tests/libdlrun_sim.a"; do
  [[ -f $needed ]] || { echo "mutants.sh: $needed is missing: build rendezvous_sim first" >&2; exit 2; }
done
missed=0
for patch in "$root"/tests/sim/mutants/*.patch; do
  name=$(basename "$patch" .patch)
  rm -rf "$work/src" "$work"/*.o "$work/librdzv.a"
  mkdir -p "$work/src"
  cp -r "$root/rendezvous" "$work/src/"
  if ! patch -d "$work/src" -p1 --quiet < "$patch"; then
    echo "mutant $name: the patch no longer applies to rendezvous/ (update it)"
    missed=1
    continue
  fi
  pids=()
  for source in "$work"/src/rendezvous/*.cpp; do
    "${cxx[@]}" "${flags[@]}" -I"$work/src" -I"$root" -c "$source" \
      -o "$work/$(basename "$source" .cpp).o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  ar rcs "$work/librdzv.a" "$work"/*.o
  c++ -o "$work/sim" "$main_object" "$build/tests/libdlrun_sim.a" "$work/librdzv.a" \
    "$build/store/libdlrun_store.a" "$build/common/libdlrun_common.a"
  caught=$("$work/sim" --schedules 20000 --first-seed 1 2>/dev/null | grep "BROKE AN INVARIANT" || true)
  if [[ -n $caught ]]; then
    echo "mutant $name: caught: ${caught}"
  else
    echo "mutant $name: NOT CAUGHT in 20,000 schedules"
    missed=1
  fi
done
exit $missed
