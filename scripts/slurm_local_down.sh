#!/usr/bin/env bash
# slurm_local_down.sh -- stops a cluster that slurm_local_up.sh started, and everything it runs.
#
# Usage (as root): slurm_local_down.sh PREFIX [DIR]     (DIR default /tmp/dlrun-slurm-PREFIX)
# 1. slurmd, slurmctld and munged get SIGTERM by the PIDs recorded in DIR (a PID is signalled
#    only while it still runs that program), SIGKILL after 10 s;
# 2. whatever the jobs left on the Slurm nodes (slurmstepd and its tasks) is SIGKILLed, by the
#    PIDs inside those hosts (netns.sh kill);
# 3. the netns.sh set is taken down if slurm_local_up.sh created it;
# 4. DIR is removed.
# Never fails; does nothing for a cluster that is not (or only partly) there, so it can run
# twice or after a failed start.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
netns=$here/netns.sh
STOP_TIMEOUT_S=10

(($# == 1 || $# == 2)) || {
  echo "usage: slurm_local_down.sh PREFIX [DIR]" >&2
  exit 2
}
prefix=$1 dir=${2:-/tmp/dlrun-slurm-$1}
n=0
[[ -r $dir/cluster ]] && read -r _ n <"$dir/cluster"

# PID of a daemon from its pid file, if that PID still runs the program.
daemon_pid() {  # FILE PROGRAM
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$2" ]] && echo "$pid"
}

pids=()
for file in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munged.pid"; do
  program=$(basename "$file" .pid)
  pid=$(daemon_pid "$file" "${program%%-*}") && pids+=("$pid")
done
((${#pids[@]})) && kill -TERM "${pids[@]}" 2>/dev/null
deadline=$((SECONDS + STOP_TIMEOUT_S))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      kill -KILL "$pid" 2>/dev/null
      break
    fi
    sleep 0.05
  done
done

for ((k = 1; k <= n; k++)); do
  [[ -e /run/netns/$prefix-$k ]] && bash "$netns" kill "$prefix" "$k"
done
[[ -e $dir/netns.ours ]] && bash "$netns" down "$prefix"
[[ -e $dir/cluster ]] && rm -rf "$dir"
exit 0
