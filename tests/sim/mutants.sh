#!/usr/bin/env bash
# Bugs put in on purpose (tests/sim/mutants/*.patch, each one change), every one of which the
# simulation's default budget must catch: in the rendezvous, in the agent's in-process choice
# (agents/recovery.cpp) and in the simulation's model of dlrun.recovery's protocol
# (tests/sim/sim_recovery_workers.cpp). For each: those sources with the patch applied are compiled,
# linked with the store and common libraries of BUILD, and seeds 1 to 20,000 run until one
# breaks an invariant. Prints each mutant, the seed that caught it and the invariant; exits 1 if a
# mutant is not caught or no longer applies.
# Usage: tests/sim/mutants.sh [BUILD]   (default: build; it must have built rendezvous_sim)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cxx=(c++)
command -v ccache > /dev/null && cxx=(ccache c++)
flags=(-O2 -std=c++20 -DNDEBUG -w)
for needed in "$build/store/libdlrun_store.a" "$build/common/libdlrun_common.a" "$build/bin/rendezvous_sim"; do
  [[ -f $needed ]] || { echo "mutants.sh: $needed is missing: build rendezvous_sim first" >&2; exit 2; }
done
missed=0
for patch in "$root"/tests/sim/mutants/*.patch; do
  name=$(basename "$patch" .patch)
  rm -rf "$work/src" "$work"/*.o
  mkdir -p "$work/src/tests" "$work/src/agents"
  cp -r "$root/rendezvous" "$work/src/"
  cp -r "$root/tests/sim" "$work/src/tests/"
  cp "$root"/agents/recovery.{h,cpp} "$work/src/agents/"
  if ! patch -d "$work/src" -p1 --quiet < "$patch"; then
    echo "mutant $name: the patch no longer applies (update it)"
    missed=1
    continue
  fi
  sources=("$work"/src/rendezvous/*.cpp "$work"/src/agents/recovery.cpp)
  for source in "$work"/src/tests/sim/*.cpp; do
    [[ $source == *_test.cpp ]] || sources+=("$source")
  done
  pids=()
  for source in "${sources[@]}"; do
    "${cxx[@]}" "${flags[@]}" -I"$work/src" -I"$root" -I"$build" -c "$source" \
      -o "$work/$(basename "$(dirname "$source")")_$(basename "$source" .cpp).o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  c++ -o "$work/sim" "$work"/*.o "$build/store/libdlrun_store.a" \
    "$build/common/libdlrun_common.a"
  caught=$("$work/sim" --schedules 20000 --first-seed 1 2>/dev/null | grep "BROKE AN INVARIANT" || true)
  if [[ -n $caught ]]; then
    echo "mutant $name: caught: ${caught}"
  else
    echo "mutant $name: NOT CAUGHT in 20,000 schedules"
    missed=1
  fi
done
exit $missed
