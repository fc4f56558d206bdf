#!/usr/bin/env bash
# Multi-node rendezvous on loopback, dlrun against torchrun (torch 2.13, bench/anchor.sh; 1.13 through
# bench/torchrun_py311.py), on the c10d backend and/or on etcd; rdzv_bench.py says exactly what
# is run and measured:
#   (a) rendezvous: K agents (--nnodes=K, one worker each) started at once; time from the first
#       launch to the last worker's start, medians per K and the ratios torchrun-B/dlrun-B (and
#       dlrun-etcd/dlrun-c10d).
#   (c) recovery: 3 agents --nnodes=2:3 --rdzv-conf=last_call_timeout=1; one agent and its
#       workers SIGKILLed (--victims: `store`, the node of the workers' MASTER_ADDR:MASTER_PORT;
#       `other`, a node serving neither that nor, under c10d, the rendezvous); time until both
#       survivors' new workers start (capped at 60 s: torchrun's survivors may never notice).
#   --control on,off: the cost of dlrun's control plane (issue 13) instead: (a) alone, dlrun-c10d
#       only, each run on a dlrund of its own (--stats; the agents are all its clients), with the
#       control plane on and off (dlrun --no-control-plane and dlrund --no-control), the runs
#       alternating. Per K and variant: the rendezvous time, the store's requests and connections
#       per agent (to the last worker's start, where each worker has dlrund snapshot its counts
#       through SIGUSR1, and to every agent's exit), the store's requests/s until then, the CPU
#       time of the agents (with their workers) and of dlrund, and on/off. About a minute with
#       every K and --repeats 31 on 2 cores:
#         bash bench/rdzv_bench.sh build --control on,off --repeats 31
#   --metrics on,off: the same for --metrics-port (issue 15) on the agents and dlrund, each
#       scraped (/metrics) and its page polled (/api/state) once a second while on; adds the CPU
#       per agent and second and dlrund's per request:
#         bash bench/rdzv_bench.sh build --ks 32 --metrics on,off --repeats 61
# A launcher whose run fails (dlrun's multi-node flags, say) prints why and the rest goes on.
# Builds nothing. c10d alone takes about five minutes with every K on 2 cores; the etcd
# comparison of issue 11 (one etcd 3.4 with --enable-v2 on loopback for the whole run; torchrun's
# etcd backends need python3-etcd, Debian's, so torch 1.13's torchrun) about nine:
#   PYTHON=/usr/bin/python3 BUDGET_SECONDS=400 bash bench/rdzv_bench.sh build --backends etcd,c10d \
#     --torchrun-backends etcd --victims store,other
# (--torchrun-backends etcd,etcd-v2 adds torchrun's newer etcd backend: about fifteen minutes,
# with BUDGET_SECONDS=600 for every run of (a)).
#
# Usage: bench/rdzv_bench.sh BUILD_DIR [--ks 2,4,8] [--backends c10d,etcd]
#          [--torchrun-backends c10d,etcd,etcd-v2] [--victims other,store] [--recovery-conf CONF]
#          [--skip-torchrun] [--only rendezvous|recovery] [--control on,off] [--metrics on,off]
#          [--repeats N]
# --backends: dlrun's (default c10d); --torchrun-backends: torchrun's (default: --backends;
# etcd is torch's legacy etcd rendezvous, etcd-v2 its dynamic rendezvous on etcd);
# --recovery-conf: (c)'s --rdzv-conf for every variant (default last_call_timeout=1);
# --repeats: dlrun's runs of (a) per K and variant (default 5 up to K = 8, then 3).
# Environment: PYTHON (bench/anchor.sh: default torch 2.13's environment; also runs the workers),
#              BUDGET_SECONDS (200: seconds for (a); a run is started only if it looks to fit,
#              the first of each K always starts).
set -euo pipefail

usage() {
  echo "usage: bench/rdzv_bench.sh BUILD_DIR [--ks 2,4,8] [--backends c10d,etcd]" \
    "[--torchrun-backends c10d,etcd,etcd-v2] [--victims other,store] [--recovery-conf CONF]" \
    "[--skip-torchrun] [--only rendezvous|recovery] [--control on,off] [--metrics on,off]" \
    "[--repeats N]" >&2
  exit 2
}

(($# >= 1)) || usage
build=$1
shift
ks=2,4,8,16,32
torchrun=yes
backends=c10d
torchrun_backends=
victims=other
recovery_conf=last_call_timeout=1
only=()
feature=  # control or metrics: the variants are its settings, on and/or off
settings=
repeats=()
while (($#)); do
  case $1 in
    --ks) (($# >= 2)) || usage; ks=$2; shift 2 ;;
    --ks=*) ks=${1#--ks=}; shift ;;
    --backends) (($# >= 2)) || usage; backends=$2; shift 2 ;;
    --backends=*) backends=${1#--backends=}; shift ;;
    --torchrun-backends) (($# >= 2)) || usage; torchrun_backends=$2; shift 2 ;;
    --torchrun-backends=*) torchrun_backends=${1#--torchrun-backends=}; shift ;;
    --victims) (($# >= 2)) || usage; victims=$2; shift 2 ;;
    --victims=*) victims=${1#--victims=}; shift ;;
    --recovery-conf) (($# >= 2)) || usage; recovery_conf=$2; shift 2 ;;
    --recovery-conf=*) recovery_conf=${1#--recovery-conf=}; shift ;;
    --skip-torchrun) torchrun=no; shift ;;
    --only) (($# >= 2)) || usage; only=(--only "$2"); shift 2 ;;
    --only=*) only=(--only "${1#--only=}"); shift ;;
    --control | --metrics) (($# >= 2)) || usage; [[ -z $feature ]] || usage
      feature=${1#--}; settings=$2; shift 2 ;;
    --control=* | --metrics=*) [[ -z $feature ]] || usage
      feature=${1%%=*}; feature=${feature#--}; settings=${1#*=}; shift ;;
    --repeats) (($# >= 2)) || usage; repeats=(--repeats "$2"); shift 2 ;;
    --repeats=*) repeats=(--repeats "${1#--repeats=}"); shift ;;
    *) usage ;;
  esac
done
[[ $ks =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "rdzv_bench.sh: bad --ks '$ks'" >&2; exit 2; }
torchrun_backends=${torchrun_backends:-$backends}
[[ $backends =~ ^(c10d|etcd)(,(c10d|etcd))*$ ]] ||
  { echo "rdzv_bench.sh: bad --backends '$backends' (c10d, etcd)" >&2; exit 2; }
[[ $torchrun_backends =~ ^(c10d|etcd|etcd-v2)(,(c10d|etcd|etcd-v2))*$ ]] ||
  { echo "rdzv_bench.sh: bad --torchrun-backends '$torchrun_backends' (c10d, etcd, etcd-v2)" >&2
    exit 2; }
[[ $victims =~ ^(store|other)(,(store|other))*$ ]] ||
  { echo "rdzv_bench.sh: bad --victims '$victims' (store, other)" >&2; exit 2; }
if ((${#only[@]})) && [[ ${only[1]} != rendezvous && ${only[1]} != recovery ]]; then
  usage
fi
if ((${#repeats[@]})) && ! [[ ${repeats[1]} =~ ^[1-9][0-9]*$ ]]; then
  echo "rdzv_bench.sh: bad --repeats '${repeats[1]}'" >&2
  exit 2
fi
feature_args=()
if [[ -n $feature ]]; then
  [[ $settings =~ ^(on|off)(,(on|off))*$ ]] ||
    { echo "rdzv_bench.sh: bad --$feature '$settings' (on, off)" >&2; exit 2; }
  [[ $backends == c10d && ${only[1]:-rendezvous} == rendezvous ]] ||
    { echo "rdzv_bench.sh: --$feature measures (a) on c10d alone" >&2; exit 2; }
  dlrund=$build/bin/dlrund
  [[ -x $dlrund ]] || { echo "rdzv_bench.sh: $dlrund not found; build first" >&2; exit 2; }
  feature_args=("--$feature" "$settings" --dlrund "$(realpath "$dlrund")")
  torchrun=no
fi

here=$(cd "$(dirname "$0")" && pwd)
dlrun=$build/bin/dlrun
python=${PYTHON:-/usr/bin/python3}  # runs the driver; bench/anchor.sh's when torchrun runs
[[ -x $dlrun ]] || { echo "rdzv_bench.sh: $dlrun not found; build first" >&2; exit 2; }
dlrun=$(realpath "$dlrun")
probe=$build/bin/dlrun-rdzv-probe
[[ -x $probe ]] || { echo "rdzv_bench.sh: $probe not found; build first" >&2; exit 2; }
probe=$(realpath "$probe")

etcd_used=no
[[ ,$backends, == *,etcd,* ]] && etcd_used=yes
[[ $torchrun == yes && ,$torchrun_backends, == *,etcd* ]] && etcd_used=yes
if [[ $etcd_used == yes && ! -x /usr/bin/etcd ]]; then
  echo "rdzv_bench.sh: /usr/bin/etcd not found (Debian's etcd-server, see scripts/setup.sh)" >&2
  exit 2
fi

torchrun_args=()
if [[ -n $feature ]]; then
  echo "dlrun alone (--$feature $settings): c10d rendezvous on a dlrund per run on 127.0.0.1," \
    "$(nproc) cores"
elif [[ $torchrun == yes ]]; then
  anchor_for="rdzv_bench.sh (or pass --skip-torchrun)"
  # shellcheck source=bench/anchor.sh
  source "$here/anchor.sh"
  if [[ ,$torchrun_backends, == *,etcd* ]] && ! "$python" -c 'import etcd' 2>/dev/null; then
    echo "rdzv_bench.sh: $python cannot import etcd, which torchrun's etcd backend needs" \
      "(apt-get install python3-etcd; or --torchrun-backends c10d)" >&2
    exit 2
  fi
  torchrun_args=(--torchrun "${torchrun[@]}")
  echo "dlrun ($backends) vs $torchrun_name on $torchrun_backends: rendezvous on 127.0.0.1," \
    "$(nproc) cores"
else
  echo "dlrun alone (--skip-torchrun): $backends rendezvous on 127.0.0.1, $(nproc) cores"
fi
[[ $etcd_used == yes ]] && echo "etcd: $(/usr/bin/etcd --version | head -n 1), v2 API on"
trap 'exit 130' INT
trap 'exit 143' TERM
# Other work on the machine skews the wall-clock numbers far more than run-to-run noise.
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
# Where it may (root), the benchmark runs as the init of a PID namespace of its own: when it
# dies, however it dies, the kernel kills everything it started, so an agent needs no wrapper
# that dies with it (setpriv --pdeathsig: 0.8 ms of CPU an agent, some 13 ms of a launch of 32
# on 2 cores, for every launcher alike).
isolate=()
if unshare --pid --fork --kill-child --mount-proc true 2>/dev/null; then
  isolate=(unshare --pid --fork --kill-child --mount-proc env RDZV_BENCH_PID_NAMESPACE=1)
  echo "the benchmark runs in a PID namespace of its own: agents start without a wrapper"
else
  echo "agents start through setpriv --pdeathsig (no PID namespace without root)"
fi
status=0
"${isolate[@]}" ${no_dns[@]+"${no_dns[@]}"} "$python" "$here/rdzv_bench.py" --dlrun "$dlrun" "${torchrun_args[@]}" --worker "$probe" \
  --ks "$ks" --backends "$backends" --torchrun-backends "$torchrun_backends" \
  --victims "$victims" --recovery-conf "$recovery_conf" --budget "${BUDGET_SECONDS:-200}" \
  "${only[@]}" "${feature_args[@]}" "${repeats[@]}" || status=$?
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
exit "$status"
