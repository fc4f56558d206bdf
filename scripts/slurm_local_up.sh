#!/usr/bin/env bash
# slurm_local_up.sh -- a real Slurm cluster (Debian's slurm-wlm + munge) on one machine, each
# node a simulated host of scripts/netns.sh with its own address and hostname.
#
# Usage (as root): slurm_local_up.sh PREFIX N [DIR]
#   PREFIX  the netns.sh set to use: created with N+1 hosts unless it exists (then it must have
#           at least N+1 hosts, and it is left to its owner at the end)
#   N       Slurm nodes, 1..9: slurmd K runs on host K (hostname nodeK, 10.77.0.(10+K)),
#           slurmctld on host 0 (node0, 10.77.0.10); partition "debug" holds them all; steps
#           get reserved ports (MpiParams=ports=12000-12999, srun --resv-ports=COUNT)
#   DIR     where everything lives (default /tmp/dlrun-slurm-PREFIX): slurm.conf, the munge key
#           and socket, state, spool, pid and log files, and DIR/env (export SLURM_CONF=...)
# A munged of its own (its socket in DIR) serves the cluster, so nothing under /etc or /run is
# touched and clusters with different prefixes coexist. Every daemon runs inside a host of the
# set and records its PID in DIR; slurm_local_down.sh PREFIX [DIR] stops them by those PIDs.
# Returns once all N nodes are idle; fails after 30 s, printing the logs' last lines.
# Clients run inside a host, with SLURM_CONF from DIR/env:
#   scripts/netns.sh exec PREFIX 0 env SLURM_CONF=DIR/slurm.conf sbatch job.sbatch
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
netns=$here/netns.sh
IDLE_TIMEOUT_S=30

die() {
  echo "slurm_local_up.sh: $*" >&2
  exit 2
}

(($# == 2 || $# == 3)) || die "usage: slurm_local_up.sh PREFIX N [DIR]"
prefix=$1 n=$2 dir=${3:-/tmp/dlrun-slurm-$1}
[[ $n =~ ^[1-9]$ ]] || die "N must be 1..9 (got '$n')"
for program in munged mungekey slurmctld slurmd sinfo; do
  command -v "$program" >/dev/null || die "$program is missing (run scripts/setup.sh)"
done
[[ ! -e $dir/slurm.conf ]] || die "$dir already holds a cluster (slurm_local_down.sh $prefix $dir)"

mkdir -p "$dir/state"
dir=$(cd "$dir" && pwd)
echo "$prefix $n" >"$dir/cluster"  # what slurm_local_down.sh stops
on_host() {  # I CMD...: run CMD on host I with this cluster's configuration
  local i=$1
  shift
  bash "$netns" exec "$prefix" "$i" env SLURM_CONF="$dir/slurm.conf" "$@"
}
# A failure half-way stops what was started.
trap 'bash "$here/slurm_local_down.sh" "$prefix" "$dir" >/dev/null 2>&1' ERR

if [[ -e /run/netns/$prefix-0 ]]; then
  [[ -e /run/netns/$prefix-$n ]] || die "set $prefix has fewer than $((n + 1)) hosts"
else
  bash "$netns" up "$prefix" $((n + 1))
  touch "$dir/netns.ours"  # slurm_local_down.sh takes the set down only if it made it
fi

# munge: the key readable by root only (munged refuses anything looser); munged on host 0,
# reached by every host through its socket file.
mungekey --create --keyfile="$dir/munge.key"
chmod 400 "$dir/munge.key"
bash "$netns" exec "$prefix" 0 munged --force --socket="$dir/munge.socket" \
  --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
  --seed-file="$dir/munged.seed"

hosts=$(seq -f '10.77.0.%g' -s , 11 $((10 + n)))
cat >"$dir/slurm.conf" <<CONF
ClusterName=dlrun
SlurmctldHost=node0(10.77.0.10)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
# No cgroups: tasks are tracked by their process tree, and the nodes share the machine's CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
# Ports Slurm reserves for steps (SLURM_STEP_RESV_PORTS): srun --resv-ports=COUNT; with Slurm
# 22.05 a step without the option gets some too, and a bare --resv-ports none (a count of 0).
MpiParams=ports=12000-12999
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
ReturnToService=2
MessageTimeout=10
# A node whose slurmd stops answering is marked down after this many seconds (Slurm's default
# is 300): a simulated crash ends the job steps on it within a test's patience.
SlurmdTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=600
NodeName=node[1-$n] NodeAddr=$hosts CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "export SLURM_CONF=$dir/slurm.conf" >"$dir/env"

# Each daemon forks into the background and writes its PID file before it serves.
on_host 0 slurmctld
for ((k = 1; k <= n; k++)); do
  mkdir -p "$dir/spool-node$k"
  on_host "$k" slurmd -N "node$k"
done

deadline=$((SECONDS + IDLE_TIMEOUT_S))
until [[ $(on_host 0 sinfo -h -t idle -o %D 2>/dev/null | head -1) == "$n" ]]; do
  if ((SECONDS >= deadline)); then
    echo "slurm_local_up.sh: nodes not idle after ${IDLE_TIMEOUT_S} s:" >&2
    on_host 0 sinfo >&2 || true
    tail -n 5 "$dir"/*.log >&2 || true
    false  # the ERR trap stops everything
  fi
  sleep 0.1
done
trap - ERR
echo "slurm up: $n nodes in set $prefix, configuration $dir/slurm.conf"
