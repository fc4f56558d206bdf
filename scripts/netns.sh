#!/usr/bin/env bash
# netns.sh -- several simulated hosts on one machine, made of Linux network namespaces.
#
# A set of N hosts is named by a PREFIX (1-12 letters and digits; sets with different prefixes
# coexist, so tests can run in parallel):
#   PREFIX-sw            a namespace holding only the switch: bridge br0 and one port pI per host
#   PREFIX-0..PREFIX-M   the hosts (M = N-1): loopback up and a veth eth0 cabled to the switch,
#                        address 10.77.0.(10+I)/24, hostname nodeI
#   /etc/netns/PREFIX-I/{hosts,hostname}
#                        the host's name and a hosts file naming every host of the set
#                        (10.77.0.10 is also called "head")
# Nothing is added to the root namespace: no 10.77.0.x address and no route exist outside the
# set's own namespaces, and each set's addresses are private to it (two sets both have a
# 10.77.0.10, on different bridges). So every connection to a 10.77.0.x address must start
# inside one of these namespaces; from the root namespace it would have no route but the
# default one, toward the real network.
#
# Usage (as root):
#   netns.sh up PREFIX N           create the set (N in 1..200); fails if it already exists
#   netns.sh exec PREFIX I CMD...  run CMD on host I: in a new mount and UTS namespace (hostname
#                                  nodeI, the set's hosts file over /etc/hosts), then in the
#                                  host's network namespace. Unlike `ip netns exec`, /sys is not
#                                  remounted, so /sys/fs/cgroup stays visible. CMD keeps this
#                                  script's PID (every step execs).
#   netns.sh pids PREFIX I         the PIDs of the processes inside host I, one a line
#   netns.sh kill PREFIX I         SIGKILL every process inside host I (a crashed node); returns
#                                  once none is left, or fails after 10 s
#   netns.sh link PREFIX I up|down host I's eth0 up or down (down: a silent node, connections to
#                                  and from it time out; up heals it)
#   netns.sh down PREFIX           kill every process in every namespace of the set, delete the
#                                  namespaces and /etc/netns/PREFIX-*; never fails, and does
#                                  nothing for a set that is not (or only partly) there
#   netns.sh list                  the prefixes of the sets that exist, one a line
set -euo pipefail

SUBNET=10.77.0
FIRST_HOST=10   # host I is $SUBNET.(FIRST_HOST + I)
MAX_HOSTS=200
KILL_TIMEOUT_S=10

die() {
  echo "netns.sh: $*" >&2
  exit 2
}

check_prefix() {
  [[ $1 =~ ^[A-Za-z0-9]{1,12}$ ]] || die "PREFIX must be 1-12 letters and digits (got '$1')"
}

check_host() {  # PREFIX I: I is a number and the host exists
  [[ $2 =~ ^[0-9]+$ ]] || die "host index must be a number (got '$2')"
  [[ -e /run/netns/$1-$2 ]] || die "no host $1-$2 (run: netns.sh up $1 N)"
}

# The namespaces of set PREFIX that exist now (hosts and switch). The prefix has no '-', so the
# set of prefix "a" never matches the namespaces of a set "a1" or the like.
set_namespaces() {
  ip netns list 2>/dev/null | awk -v re="^$1-([0-9]+|sw)\$" '$1 ~ re { print $1 }'
}

ns_pids() {
  ip netns pids "$1" 2>/dev/null || true
}

# SIGKILLs everything in namespace $1 until nothing is left; fails after KILL_TIMEOUT_S. Processes
# killed with SIGKILL leave at once, but one may fork or enter (nsenter) while we look.
kill_namespace() {
  local ns=$1 pids deadline=$((SECONDS + KILL_TIMEOUT_S))
  while pids=$(ns_pids "$ns"); [[ -n $pids ]]; do
    # shellcheck disable=SC2086  # one PID a word
    kill -9 $pids 2>/dev/null || true
    if ((SECONDS >= deadline)); then
      echo "netns.sh: processes still in $ns after ${KILL_TIMEOUT_S} s:" "${pids//$'\n'/ }" >&2
      return 1
    fi
    sleep 0.02  # a process killed by SIGKILL leaves its namespace within milliseconds
  done
}

cmd_up() {
  (($# == 2)) || die "usage: netns.sh up PREFIX N"
  local prefix=$1 n=$2 sw=$1-sw hosts i ns
  check_prefix "$prefix"
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_HOSTS)); then
    die "N must be 1..$MAX_HOSTS (got '$n')"
  fi
  [[ -z $(set_namespaces "$prefix") ]] || die "set $prefix already exists (netns.sh down $prefix)"
  # A set left half made by a failure is removed again.
  trap 'cmd_down "$prefix" >/dev/null 2>&1' ERR

  hosts="127.0.0.1 localhost"$'\n'"::1 localhost ip6-localhost ip6-loopback"
  for ((i = 0; i < n; i++)); do
    hosts+=$'\n'"$SUBNET.$((FIRST_HOST + i)) node$i"
    ((i == 0)) && hosts+=" head"
  done

  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$prefix-$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends are made directly inside their namespaces: eth0 in the host, pI on the switch.
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" addr add "$SUBNET.$((FIRST_HOST + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
    echo "node$i" >"/etc/netns/$ns/hostname"
  done
  trap - ERR
}

cmd_exec() {
  (($# >= 3)) || die "usage: netns.sh exec PREFIX I CMD..."
  local prefix=$1 i=$2
  shift 2
  check_prefix "$prefix"
  check_host "$prefix" "$i"
  # unshare (no --fork), sh and nsenter --net (no --fork) all exec: CMD keeps this PID.
  # shellcheck disable=SC2016  # the inner script expands its own arguments
  exec unshare --mount --uts --propagation private sh -c '
    etc=/etc/netns/$1
    mount --bind "$etc/hosts" /etc/hosts
    [ -e /etc/hostname ] && mount --bind "$etc/hostname" /etc/hostname
    hostname "$(cat "$etc/hostname")"
    ns=$1
    shift
    exec nsenter --net="/run/netns/$ns" "$@"' netns.sh "$prefix-$i" "$@"
}

cmd_pids() {
  (($# == 2)) || die "usage: netns.sh pids PREFIX I"
  check_prefix "$1"
  check_host "$1" "$2"
  ns_pids "$1-$2"
}

cmd_kill() {
  (($# == 2)) || die "usage: netns.sh kill PREFIX I"
  check_prefix "$1"
  check_host "$1" "$2"
  kill_namespace "$1-$2"
}

cmd_link() {
  (($# == 3)) || die "usage: netns.sh link PREFIX I up|down"
  check_prefix "$1"
  check_host "$1" "$2"
  [[ $3 == up || $3 == down ]] || die "link state must be up or down (got '$3')"
  ip -n "$1-$2" link set eth0 "$3"
}

cmd_down() {
  (($# == 1)) || die "usage: netns.sh down PREFIX"
  check_prefix "$1"
  local ns
  set +e
  # Processes first, in every namespace, so none is left to reach another through the switch;
  # then the namespaces (a host's veth pair goes with it).
  for ns in $(set_namespaces "$1"); do
    kill_namespace "$ns"
  done
  for ns in $(set_namespaces "$1"); do
    ip netns del "$ns" 2>/dev/null
  done
  # Names of hosts whose namespace is already gone (a half-made or half-removed set).
  rm -rf /etc/netns/"$1"-[0-9]* /etc/netns/"$1"-sw
  return 0
}

cmd_list() {
  ip netns list 2>/dev/null |
    awk '$1 ~ /^[A-Za-z0-9]+-([0-9]+|sw)$/ { sub(/-[^-]*$/, "", $1); if (!seen[$1]++) print $1 }'
}

(($# >= 1)) || die "usage: netns.sh up|exec|pids|kill|link|down|list ..."
command=$1
shift
case $command in
  up | exec | pids | kill | link | down | list) "cmd_$command" "$@" ;;
  *) die "unknown subcommand '$command' (up, exec, pids, kill, link, down, list)" ;;
esac
