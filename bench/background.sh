# Sourced by the benchmarks that run their Python driver in the background (so that INT and
# TERM reach these traps while it runs): a scratch directory, removed at the end, and the
# driver, whose PID the script puts in bench_pid, stopped with TERM when the script ends early.
# Also: the trainer benchmarks' check of their build directory.
scratch=$(mktemp -d)
bench_pid=
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n $bench_pid ]]; then
    kill "$bench_pid" 2>/dev/null || true
    wait "$bench_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Sets dlrun to BUILD_DIR's dlrun, absolute; exits 2 unless it and dlrun-train are there.
need_trainer() {
  local program
  for program in "$1/bin/dlrun" "$1/bin/dlrun-train"; do
    [[ -x $program ]] || { echo "${0##*/}: $program not found; build first" >&2; exit 2; }
  done
  # shellcheck disable=SC2034  # read by the script that sources this
  dlrun=$(realpath "$1/bin/dlrun")
}
