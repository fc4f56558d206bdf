#!/usr/bin/env bash
# Compares dlrun with torchrun (torch 2.13; bench/anchor.sh) on launch-to-exit time: `--standalone
# --nproc-per-node=N --no-python dlrun-noop` for N = 1, 2, 4 and 8, so the launcher's own cost
# is all that is measured. torchrun runs twice per round, with its default --monitor_interval
# (5 s) and with 0.1 s; the goal ratio is taken against the faster of the two. Launches
# alternate (launch_bench.py says how) and the medians are reported. Builds nothing; takes
# about three minutes, at most about four.
#
# Usage: bench/launch_bench.sh [BUILD_DIR]     (default: build)
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment), DLRUN_REPEATS (10),
#              TORCHRUN_REPEATS (5), BUDGET_SECONDS (210: seconds for the whole measurement;
#              rounds that would end later are skipped, the first always runs, and no
#              launch runs more than 15 s past it).
set -euo pipefail

build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
dlrun=$build/bin/dlrun
noop=$build/bin/dlrun-noop
anchor_for=launch_bench.sh
# shellcheck source=bench/anchor.sh
source "$here/anchor.sh"

for program in "$dlrun" "$noop"; do
  [[ -x $program ]] || { echo "launch_bench.sh: $program not found; build first" >&2; exit 2; }
done
dlrun=$(realpath "$dlrun")
noop=$(realpath "$noop")

# torch 1.13's --standalone always puts its store on port 29400: another torchrun there would
# make its rows fail or meet the wrong job.
if "$python" -c 'import socket, sys; s = socket.socket(); sys.exit(s.connect_ex(("127.0.0.1", 29400)) != 0)'; then
  echo "launch_bench.sh: warning: something listens on 127.0.0.1:29400, which torchrun" \
    "--standalone needs" >&2
fi

# Both launchers make their log directories under TMPDIR (torchrun leaves its own behind), so
# they get a private one on the same file system, removed at the end.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "dlrun vs $torchrun_name launching N" \
  "no-op workers on $(nproc) cores; medians of ${DLRUN_REPEATS:-10} (dlrun) and" \
  "${TORCHRUN_REPEATS:-5} (each torchrun) launches, alternating"
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
TMPDIR=$scratch ${no_dns[@]+"${no_dns[@]}"} "$python" "$here/launch_bench.py" --dlrun "$dlrun" --noop "$noop" \
  --torchrun "${torchrun[@]}" \
  --dlrun-repeats "${DLRUN_REPEATS:-10}" --torchrun-repeats "${TORCHRUN_REPEATS:-5}" \
  --budget "${BUDGET_SECONDS:-210}" || status=$?
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
