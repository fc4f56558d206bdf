#!/usr/bin/env bash
# Multi-node rendezvous on loopback, dlrun against torchrun (torch 1.13 through
# bench/torchrun_py311.py), both with the c10d backend; rdzv_bench.py says exactly what is run
# and measured:
#   (a) rendezvous: K agents (--nnodes=K, one worker each) started at once; time from the first
#       launch to the last worker's start, medians per K and the ratio torchrun/dlrun.
#   (c) recovery: 3 agents --nnodes=2:3 --rdzv-conf=last_call_timeout=1; one agent (not the
#       store's) and its workers SIGKILLed; time until both survivors' new workers start
#       (capped at 60 s: torchrun's survivors may never notice).
# A launcher whose run fails (dlrun's multi-node flags, say) prints why and the rest goes on.
# Builds nothing; takes about five minutes with every K on 2 cores.
#
# Usage: bench/rdzv_bench.sh BUILD_DIR [--ks 2,4,8] [--skip-torchrun] [--only rendezvous|recovery]
# Environment: PYTHON (default /usr/bin/python3, which has torch 1.13; also runs the workers),
#              BUDGET_SECONDS (200: seconds for (a); a run is started only if it looks to fit,
#              the first of each K always starts).
set -euo pipefail

usage() {
  echo "usage: bench/rdzv_bench.sh BUILD_DIR [--ks 2,4,8] [--skip-torchrun]" \
    "[--only rendezvous|recovery]" >&2
  exit 2
}

(($# >= 1)) || usage
build=$1
shift
ks=2,4,8,16,32
torchrun=yes
only=()
while (($#)); do
  case $1 in
    --ks) (($# >= 2)) || usage; ks=$2; shift 2 ;;
    --ks=*) ks=${1#--ks=}; shift ;;
    --skip-torchrun) torchrun=no; shift ;;
    --only) (($# >= 2)) || usage; only=(--only "$2"); shift 2 ;;
    --only=*) only=(--only "${1#--only=}"); shift ;;
    *) usage ;;
  esac
done
[[ $ks =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "rdzv_bench.sh: bad --ks '$ks'" >&2; exit 2; }
if ((${#only[@]})) && [[ ${only[1]} != rendezvous && ${only[1]} != recovery ]]; then
  usage
fi

here=$(cd "$(dirname "$0")" && pwd)
dlrun=$build/bin/dlrun
python=${PYTHON:-/usr/bin/python3}
[[ -x $dlrun ]] || { echo "rdzv_bench.sh: $dlrun not found; build first" >&2; exit 2; }
dlrun=$(realpath "$dlrun")
probe=$build/bin/dlrun-rdzv-probe
[[ -x $probe ]] || { echo "rdzv_bench.sh: $probe not found; build first" >&2; exit 2; }
probe=$(realpath "$probe")

torchrun_args=()
if [[ $torchrun == yes ]]; then
  torch_version=$("$python" -c 'import torch; print(torch.__version__)') || {
    echo "rdzv_bench.sh: $python cannot import torch (or pass --skip-torchrun)" >&2
    exit 2
  }
  torchrun_args=(--torchrun "$python" "$here/torchrun_py311.py")
  echo "dlrun vs torchrun (torch $torch_version, through bench/torchrun_py311.py):" \
    "c10d rendezvous on 127.0.0.1, $(nproc) cores"
else
  echo "dlrun alone (--skip-torchrun): c10d rendezvous on 127.0.0.1, $(nproc) cores"
fi
trap 'exit 130' INT
trap 'exit 143' TERM
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
status=0
"$python" "$here/rdzv_bench.py" --dlrun "$dlrun" "${torchrun_args[@]}" --worker "$probe" \
  --ks "$ks" --budget "${BUDGET_SECONDS:-200}" "${only[@]}" || status=$?
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
