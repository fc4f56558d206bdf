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
#   netns.sh up PREFIX N           create the set (N in 1..200); fails if it already exists.
#                                  A step that fails ends it with status 1 and one line on
#                                  stderr naming the step and the tool's own error, after the
#                                  half-made set is taken down again. An /etc/hosts that does
#                                  not exist is created empty (the hosts' files are mounted on it)
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
#   netns.sh cut PREFIX I J        drop every IP packet between hosts I and J, both ways, at the
#                                  switch (a partition: each still reaches every other host);
#                                  until healed or the set is taken down
#   netns.sh heal PREFIX I J       end the cut between hosts I and J (none: nothing to do)
#   netns.sh slow PREFIX I RATE    what host I sends leaves at RATE at most (tc's units: 20mbit;
#                                  a token bucket on its eth0: this kernel lacks netem); "off"
#                                  ends it
#   netns.sh down PREFIX           kill every process in every namespace of the set, delete the
#                                  namespaces and /etc/netns/PREFIX-*; never fails, and does
#                                  nothing for a set that is not (or only partly) there
#   netns.sh list                  the prefixes of the sets that exist, one a line
set -euo pipefail

SUBNET=10.77.0
FIRST_HOST=10   # host I is $SUBNET.(FIRST_HOST + I)
MAX_HOSTS=200
KILL_TIMEOUT_S=10

die() {  # a usage error
  echo "netns.sh: $*" >&2
  exit 2
}

fail() {  # a step that could not be done
  echo "netns.sh: $*" >&2
  exit 1
}

# Runs CMD...; when it fails, ends the script (fail) with WHAT and CMD's stderr on one line. CMD's
# stdout is dropped. Before the line, the function named by $ON_FAIL (if any) undoes what was done.
ON_FAIL=
step() {  # WHAT CMD...
  local what=$1 err status
  shift
  if err=$("$@" 2>&1 >/dev/null); then
    return 0
  else
    status=$?
  fi
  err=$(printf '%s' "$err" | tr -s '\n\t' '  ')
  err=${err%% }
  [[ -n $err ]] || err="exit status $status"
  [[ -z $ON_FAIL ]] || "$ON_FAIL" >/dev/null 2>&1 || true
  fail "$what: $err"
}

# Writes TEXT and a newline to PATH (tee reports a failure on one line, naming PATH).
write_file() {  # PATH TEXT
  printf '%s\n' "$2" | tee "$1" >/dev/null
}

# /etc/hosts, the mount point of the hosts' own hosts files: created empty if it does not exist
# (touch leaves one that another call creates first as it is, but for its times).
ensure_etc_hosts() {
  [[ -e /etc/hosts ]] || step "cannot create /etc/hosts" touch /etc/hosts
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

UP_PREFIX=
undo_up() {
  cmd_down "$UP_PREFIX"
}

cmd_up() {
  (($# == 2)) || die "usage: netns.sh up PREFIX N"
  local prefix=$1 n=$2 sw=$1-sw existing hosts i ns
  check_prefix "$prefix"
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_HOSTS)); then
    die "N must be 1..$MAX_HOSTS (got '$n')"
  fi
  step "cannot list the network namespaces" ip netns list
  existing=$(set_namespaces "$prefix") || fail "cannot list the network namespaces of set $prefix"
  [[ -z $existing ]] || die "set $prefix already exists (netns.sh down $prefix)"
  ensure_etc_hosts

  hosts="127.0.0.1 localhost"$'\n'"::1 localhost ip6-localhost ip6-loopback"
  for ((i = 0; i < n; i++)); do
    hosts+=$'\n'"$SUBNET.$((FIRST_HOST + i)) node$i"
    ((i == 0)) && hosts+=" head"
  done

  # From here on, a failing step takes the half-made set down before it ends the script.
  UP_PREFIX=$prefix
  ON_FAIL=undo_up
  step "cannot create network namespace $sw" ip netns add "$sw"
  step "cannot bring up lo in $sw" ip -n "$sw" link set lo up
  step "cannot create bridge br0 in $sw" ip -n "$sw" link add br0 type bridge
  step "cannot bring up br0 in $sw" ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$prefix-$i
    step "cannot create network namespace $ns" ip netns add "$ns"
    step "cannot bring up lo in $ns" ip -n "$ns" link set lo up
    # Both ends are made directly inside their namespaces: eth0 in the host, pI on the switch.
    step "cannot create veth pair eth0 in $ns and p$i in $sw" \
      ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw"
    step "cannot attach p$i to br0 in $sw" ip -n "$sw" link set "p$i" master br0
    step "cannot bring up p$i in $sw" ip -n "$sw" link set "p$i" up
    step "cannot add address $SUBNET.$((FIRST_HOST + i))/24 to eth0 in $ns" \
      ip -n "$ns" addr add "$SUBNET.$((FIRST_HOST + i))/24" dev eth0
    step "cannot bring up eth0 in $ns" ip -n "$ns" link set eth0 up
    step "cannot create /etc/netns/$ns" mkdir -p "/etc/netns/$ns"
    step "cannot write /etc/netns/$ns/hosts" write_file "/etc/netns/$ns/hosts" "$hosts"
    step "cannot write /etc/netns/$ns/hostname" write_file "/etc/netns/$ns/hostname" "node$i"
  done
  ON_FAIL=
}

cmd_exec() {
  (($# >= 3)) || die "usage: netns.sh exec PREFIX I CMD..."
  local prefix=$1 i=$2
  shift 2
  check_prefix "$prefix"
  check_host "$prefix" "$i"
  ensure_etc_hosts
  # unshare (no --fork), sh and nsenter --net (no --fork) all exec: CMD keeps this PID. A step
  # that fails ends it with status 1 and one line on stderr, before CMD starts.
  # shellcheck disable=SC2016  # the inner script expands its own arguments
  exec unshare --mount --uts --propagation private sh -c '
    etc=/etc/netns/$1
    fail() { echo "netns.sh: $1: $(printf "%s" "$2" | tr -s "\n\t" "  ")" >&2; exit 1; }
    err=$(mount --bind "$etc/hosts" /etc/hosts 2>&1) ||
      fail "cannot mount $etc/hosts on /etc/hosts" "$err"
    if [ -e /etc/hostname ]; then
      err=$(mount --bind "$etc/hostname" /etc/hostname 2>&1) ||
        fail "cannot mount $etc/hostname on /etc/hostname" "$err"
    fi
    err=$(hostname "$(cat "$etc/hostname")" 2>&1) || fail "cannot set the hostname" "$err"
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

cmd_slow() {
  (($# == 3)) || die "usage: netns.sh slow PREFIX I RATE|off"
  check_prefix "$1"
  check_host "$1" "$2"
  local tc=(ip netns exec "$1-$2" tc)
  if [[ $3 == off ]]; then
    "${tc[@]}" qdisc del dev eth0 root 2>/dev/null || true
    return 0
  fi
  [[ $3 =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] || die "rate must be like 20mbit (got '$3')"
  step "slow: the token bucket of host $2" "${tc[@]}" qdisc replace dev eth0 root tbf rate "$3" \
    burst 64kb latency 2s
}

# The switch's port toward host I drops what a filter sends to class 1:2 (a FIFO of no room):
# an HTB root, whose default class 1:1 passes the rest. Made once per port. HTB because this
# kernel has it, where prio, netem and tc's drop action are modules it lacks.
ensure_drop_class() {  # PREFIX I
  local tc=(ip netns exec "$1-sw" tc) port=p$2
  # Not `| grep -q`: under pipefail, tc killed by SIGPIPE after grep's match fails the test.
  [[ $("${tc[@]}" qdisc show dev "$port") == *"qdisc htb 1: root"* ]] && return 0
  step "cut: the queue of port $port" "${tc[@]}" qdisc add dev "$port" root handle 1: htb default 1
  for class in 1 2; do
    step "cut: class 1:$class of port $port" "${tc[@]}" class add dev "$port" parent 1: \
      classid "1:$class" htb rate 100gbit quantum 200000
  done
  step "cut: the drop of port $port" "${tc[@]}" qdisc add dev "$port" parent 1:2 handle 20: \
    pfifo limit 0
}

check_pair() {  # VERB PREFIX I J
  (($# == 4)) || die "usage: netns.sh $1 PREFIX I J"
  check_prefix "$2"
  check_host "$2" "$3"
  check_host "$2" "$4"
  [[ $3 != "$4" ]] || die "$1: a host cannot be cut from itself ($3)"
}

# A cut's filter on host TO's port has the priority 1 + FROM, the host whose packets it drops:
# heal removes exactly that one.
cmd_cut() {
  check_pair cut "$@"
  local to from
  for to in "$2" "$3"; do
    from=$(($2 + $3 - to))
    ensure_drop_class "$1" "$to"
    step "cut: host $from's packets to host $to" ip netns exec "$1-sw" tc filter add dev "p$to" \
      parent 1: protocol ip prio $((1 + from)) u32 \
      match ip src "$SUBNET.$((FIRST_HOST + from))/32" flowid 1:2
  done
}

cmd_heal() {
  check_pair heal "$@"
  local tc=(ip netns exec "$1-sw" tc) to from
  for to in "$2" "$3"; do
    from=$(($2 + $3 - to))
    [[ -n $("${tc[@]}" filter show dev "p$to" parent 1: prio $((1 + from))) ]] || continue
    step "heal: host $from's packets to host $to" "${tc[@]}" filter del dev "p$to" parent 1: \
      protocol ip prio $((1 + from))
  done
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

(($# >= 1)) || die "usage: netns.sh up|exec|pids|kill|link|cut|heal|slow|down|list ..."
command=$1
shift
case $command in
  up | exec | pids | kill | link | cut | heal | slow | down | list) "cmd_$command" "$@" ;;
  *) die "unknown subcommand '$command' (up, exec, pids, kill, link, cut, heal, slow, down, list)" ;;
esac
