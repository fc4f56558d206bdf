"""The simulated hosts of netns_fixture.py (scripts/netns.sh): hosts talk over TCP by name and
address, each has its own hostname, address and hosts file, kill_host leaves nothing running in
the host, a link taken down makes connects time out and bringing it up heals it, two hosts cut
apart stop reaching each other and still reach the rest, sets coexist
without meeting, and a set is gone after its `with` block, an exception, SIGTERM, or (at the next
Hosts) the SIGKILL of the process that made it. Every connection starts inside a host: the test
process only reads files and process states. `netns.sh up` that cannot make a step fails with one
line naming it and leaves nothing behind, and up and exec work on a machine without /etc/hosts.

Needs root (namespaces, mounts); skipped otherwise."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import unittest

import netns_fixture
from dlrun_fixture import EVENT_TIMEOUT_S, PYTHON, die_with_parent, is_running, temp_dir, wait_until
from netns_fixture import (
    NETNS_SH,
    SCRIPT_TIMEOUT_S,
    Hosts,
    OutsideNamespaceError,
    existing_sets,
    main,
    netns_sh,
    reap_stale,
)

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "netns_peer.py")
PORT = 7077
CONNECT_TIMEOUT_S = 1  # the client's socket timeout: a silent host costs this much
CLIENT_RUN_S = 15  # the longest one client process may take, start-up included
EXIT_TIMEOUT_S = 15  # the longest a test-process stand-in may take to exit
HANG_LIMIT_S = 100  # under the ctest TIMEOUT (120)
# A mount namespace of its own whose mounts are all private: nothing mounted in it reaches the
# machine's mounts.
PRIVATE_MOUNTS = ("unshare", "--mount", "--propagation", "private")


def setUpModule():
    if os.geteuid() != 0:
        print("test_netns_fixture: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("network namespaces need root")


def fresh_prefix():
    """A prefix of this process that no Hosts uses: if the process dies before its cleanup,
    the next Hosts() takes what is left of the set down (reap_stale)."""
    return f"t{os.getpid()}n{next(netns_fixture._counter)}"


def root_links():
    """The names of the network interfaces of the root namespace."""
    listing = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return sorted(line.split(":")[1].strip() for line in listing.splitlines())


def run_script(script, *args, wrap=(), **run_kwargs):
    """Runs the bash script with args ($1...) to completion, under the command wrap if given;
    returns the CompletedProcess."""
    return subprocess.run(
        [*wrap, "bash", "-c", script, "script", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=2 * SCRIPT_TIMEOUT_S,
        preexec_fn=die_with_parent,
        **run_kwargs,
    )


def namespaces_of(prefix):
    listing = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return [
        line.split()[0]
        for line in listing.splitlines()
        if line.split() and line.split()[0].startswith(prefix + "-")
    ]


class NetnsFixtureTest(unittest.TestCase):
    def hosts(self, n):
        hosts = Hosts(n)
        self.addCleanup(hosts.close)
        return hosts

    def serve(self, hosts, i):
        """A server on host i's address; returns once it listens."""
        ready = os.path.join(temp_dir(self), "ready")
        server = hosts.popen(i, [PYTHON, PEER, "serve", hosts.address(i), str(PORT), ready])
        wait_until(
            lambda: os.path.exists(ready),
            EVENT_TIMEOUT_S,
            f"the server on host {i} to listen",
            proc=server,
        )
        return server

    def connect(self, hosts, i, host):
        """Connects from host i to `host`:PORT; returns what the client printed."""
        result = hosts.run(
            i,
            [PYTHON, PEER, "connect", host, str(PORT), str(CONNECT_TIMEOUT_S)],
            timeout=CLIENT_RUN_S,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout.strip()

    def test_hosts_talk_over_tcp_by_address_and_by_name(self):
        hosts = self.hosts(2)
        self.serve(hosts, 0)
        self.assertEqual(self.connect(hosts, 1, hosts.address(0)), "reply node0 got node1")
        self.assertEqual(self.connect(hosts, 1, "node0"), "reply node0 got node1")
        self.assertEqual(self.connect(hosts, 1, "head"), "reply node0 got node1")
        self.assertEqual(self.connect(hosts, 0, "node0"), "reply node0 got node0")

    def test_each_host_has_its_own_name_address_and_hosts_file(self):
        root_name = socket.gethostname()
        hosts = self.hosts(3)
        script = (
            "import os, socket; print(socket.gethostname()); "
            "print(socket.gethostbyname(socket.gethostname())); "
            "print(socket.gethostbyname('node2')); "
            "print(len(os.listdir('/sys/fs/cgroup')) > 0)"
        )
        for i in range(3):
            result = hosts.run(i, [PYTHON, "-c", script], timeout=CLIENT_RUN_S)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(
                result.stdout.split(), [f"node{i}", f"10.77.0.{10 + i}", "10.77.0.12", "True"]
            )
            self.assertEqual(hosts.hostname(i), f"node{i}")
            self.assertEqual(hosts.address(i), f"10.77.0.{10 + i}")
            addresses = hosts.run(i, ["ip", "-4", "-o", "addr"], timeout=CLIENT_RUN_S).stdout
            self.assertEqual(
                sorted(line.split()[3] for line in addresses.splitlines()),
                [f"10.77.0.{10 + i}/24", "127.0.0.1/8"],
            )
        # The root namespace keeps its name and gets no 10.x address or route.
        self.assertEqual(socket.gethostname(), root_name)
        for what in (["ip", "-4", "addr"], ["ip", "-4", "route", "show", "table", "all"]):
            listing = subprocess.run(what, capture_output=True, text=True, timeout=10).stdout
            self.assertNotIn("10.77.", listing, f"{' '.join(what)} in the root namespace")

    def test_kill_host_leaves_no_process_in_the_host(self):
        hosts = self.hosts(2)
        # A grandchild that the fixture does not know by PID goes too.
        victims = [
            hosts.popen(1, ["sleep", "1000"]),
            hosts.popen(1, ["sh", "-c", "sleep 1000 & wait"]),
        ]
        survivor = hosts.popen(0, ["sleep", "1000"])
        wait_until(
            lambda: len(hosts.pids(1)) >= 3 and len(hosts.pids(0)) >= 1,
            EVENT_TIMEOUT_S,
            "the processes to enter their hosts",
        )
        hosts.kill_host(1)
        self.assertEqual(hosts.pids(1), [])
        for victim in victims:
            self.assertEqual(victim.wait(EXIT_TIMEOUT_S), -signal.SIGKILL)
        self.assertIsNone(survivor.poll())
        self.assertEqual(hosts.pids(0), [survivor.pid])

    def test_link_down_makes_connects_time_out_and_up_heals(self):
        hosts = self.hosts(2)
        self.serve(hosts, 0)
        self.assertEqual(self.connect(hosts, 1, hosts.address(0)), "reply node0 got node1")
        hosts.link(0, up=False)
        self.assertEqual(self.connect(hosts, 1, hosts.address(0)), "timeout")
        hosts.link(0, up=True)
        # The first connect after the link comes back may lose its SYN to address resolution;
        # each try is bounded by CONNECT_TIMEOUT_S, all of them by EVENT_TIMEOUT_S.
        replies = []
        wait_until(
            lambda: (
                replies.append(self.connect(hosts, 1, hosts.address(0)))
                or replies[-1] == "reply node0 got node1"
            ),
            EVENT_TIMEOUT_S,
            "host 0 to answer again after link up",
            on_timeout=lambda: str(replies),
        )

    def test_cut_hosts_stop_reaching_each_other_and_reach_the_rest(self):
        hosts = self.hosts(3)
        for i in range(3):
            self.serve(hosts, i)
        hosts.cut(0, 1)
        hosts.cut(0, 2)  # a second cut on host 0's port
        expected = {
            (0, 1): "timeout",
            (0, 2): "timeout",
            (1, 0): "timeout",
            (2, 0): "timeout",
            (1, 2): "reply node2 got node1",
            (2, 1): "reply node1 got node2",
        }
        for (i, j), reply in expected.items():
            self.assertEqual(self.connect(hosts, i, hosts.address(j)), reply, (i, j))
        self.assertEqual(self.connect(hosts, 0, hosts.address(0)), "reply node0 got node0")

    def test_slow_limits_what_a_host_sends_and_off_ends_it(self):
        hosts = self.hosts(2)

        def queue():
            return subprocess.run(
                ["ip", "netns", "exec", hosts.namespace(1), "tc", "qdisc", "show", "dev", "eth0"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout

        hosts.slow(1, "20mbit")
        self.assertIn("qdisc tbf", queue())
        self.assertIn("rate 20Mbit", queue())
        hosts.slow(1, "off")
        self.assertNotIn("tbf", queue())
        with self.assertRaises(RuntimeError) as refused:
            hosts.slow(1, "fast")
        self.assertIn("rate must be like 20mbit (got 'fast')", str(refused.exception))

    def test_heal_ends_one_cut_and_leaves_the_others(self):
        hosts = self.hosts(3)
        for i in range(3):
            self.serve(hosts, i)
        hosts.cut(0, 1)
        hosts.cut(0, 2)
        hosts.heal(1, 0)  # either order names the pair
        hosts.heal(1, 0)  # a pair not cut: nothing to do
        expected = {
            (0, 1): "reply node1 got node0",
            (1, 0): "reply node0 got node1",
            (0, 2): "timeout",
            (2, 0): "timeout",
        }
        for (i, j), reply in expected.items():
            self.assertEqual(self.connect(hosts, i, hosts.address(j)), reply, (i, j))

    def test_sets_coexist_and_do_not_meet(self):
        first, second = self.hosts(2), self.hosts(2)
        self.assertNotEqual(first.prefix, second.prefix)
        self.serve(first, 0)
        # Both sets have a 10.77.0.10, on different switches: only the first one's listens.
        self.assertEqual(self.connect(first, 1, "10.77.0.10"), "reply node0 got node1")
        self.assertEqual(self.connect(second, 1, "10.77.0.10"), "refused")

    def test_set_is_gone_after_the_block_also_after_an_exception(self):
        with Hosts(2) as hosts:
            sleeper = hosts.popen(1, ["sleep", "1000"])
            prefix = hosts.prefix
            self.assertEqual(len(namespaces_of(prefix)), 3)  # two hosts and the switch
        self.assertEqual(namespaces_of(prefix), [])
        self.assertNotIn(prefix, existing_sets())
        self.assertFalse(any(name.startswith(prefix + "-") for name in os.listdir("/etc/netns")))
        self.assertEqual(sleeper.poll(), -signal.SIGKILL)

        with self.assertRaises(ZeroDivisionError):
            with Hosts(1) as hosts:
                prefix = hosts.prefix
                raise ZeroDivisionError
        self.assertEqual(namespaces_of(prefix), [])

    def hold(self):
        """A stand-in for a test process in the root namespace that holds a set of 2 hosts;
        returns it and its record {"prefix", "pid" (of a process in host 1)}."""
        record = os.path.join(temp_dir(self), "record")
        holder = subprocess.Popen([PYTHON, PEER, "hold", "2", record], stdin=subprocess.PIPE)
        self.addCleanup(lambda: holder.poll() is None and (holder.kill(), holder.wait()))
        self.addCleanup(holder.stdin.close)
        wait_until(lambda: os.path.exists(record), EVENT_TIMEOUT_S, "the set to be up", proc=holder)
        with open(record) as f:
            held = json.load(f)
        self.addCleanup(netns_sh, "down", held["prefix"], check=False)
        self.assertEqual(len(namespaces_of(held["prefix"])), 3)
        return holder, held

    def test_sigterm_to_the_test_process_takes_its_set_down(self):
        holder, held = self.hold()
        holder.send_signal(signal.SIGTERM)
        self.assertEqual(holder.wait(EXIT_TIMEOUT_S), -signal.SIGTERM)
        self.assertEqual(namespaces_of(held["prefix"]), [])
        self.assertFalse(is_running(held["pid"]))

    def test_set_of_a_sigkilled_test_process_is_reaped(self):
        holder, held = self.hold()
        holder.kill()
        holder.wait(EXIT_TIMEOUT_S)
        reap_stale()  # what every new Hosts() does first
        self.assertEqual(namespaces_of(held["prefix"]), [])
        wait_until(
            lambda: not is_running(held["pid"]),
            EVENT_TIMEOUT_S,
            "the process in the reaped set to be gone",
        )

    def test_guard_refuses_connects_from_the_root_namespace(self):
        hosts = self.hosts(1)
        with socket.socket() as s, self.assertRaises(OutsideNamespaceError):
            s.connect((hosts.address(0), PORT))
        with self.assertRaises(OutsideNamespaceError):
            socket.create_connection(("10.77.0.99", PORT), timeout=CONNECT_TIMEOUT_S)
        with self.assertRaises(IndexError):
            hosts.address(1)


class NetnsUpFailureTest(unittest.TestCase):
    """netns.sh up where a step cannot be done: status 1, one line on stderr naming the step,
    and nothing of the set left (no namespace, so none of its interfaces; no /etc/netns
    files; nothing added to the root namespace)."""

    def setUp(self):
        self.prefix = fresh_prefix()
        self.addCleanup(netns_sh, "down", self.prefix, check=False)
        self.links_before = root_links()

    def assert_nothing_left(self):
        self.assertEqual(namespaces_of(self.prefix), [])
        self.assertNotIn(self.prefix, existing_sets())
        self.assertFalse(
            any(name.startswith(self.prefix + "-") for name in os.listdir("/etc/netns"))
        )
        self.assertEqual(root_links(), self.links_before)

    def test_up_that_cannot_create_a_namespace_fails_with_one_line(self):
        # A real failure of `ip netns add`: in a mount namespace of its own (private, so nothing
        # reaches the machine's mounts), /run/netns is a read-only tmpfs.
        os.makedirs("/run/netns", exist_ok=True)  # as ip makes it
        result = run_script(
            'mount -t tmpfs -o ro tmpfs /run/netns && exec bash "$1" up "$2" 2',
            NETNS_SH,
            self.prefix,
            wrap=PRIVATE_MOUNTS,
        )
        self.assertEqual(result.returncode, 1, result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(
            lines[0].startswith(f"netns.sh: cannot create network namespace {self.prefix}-sw: "),
            lines[0],
        )
        self.assertIn("Read-only file system", lines[0])
        self.assert_nothing_left()

    def test_up_failing_half_way_takes_down_what_it_made(self):
        # The real ip does every step but one: the veth pair of host 1, after the switch, host 0
        # and host 1's namespace exist. Every ip call is logged.
        directory = temp_dir(self)
        log = os.path.join(directory, "log")
        real_ip = shutil.which("ip")
        with open(os.path.join(directory, "ip"), "w") as f:
            f.write(f"""#!/bin/sh
echo "$*" >>'{log}'
case " $* " in
  *" peer name p1 "*) echo "RTNETLINK answers: injected failure" >&2; echo "of the test" >&2
                      exit 2 ;;
esac
exec '{real_ip}' "$@"
""")
        os.chmod(os.path.join(directory, "ip"), 0o755)
        env = dict(os.environ, PATH=directory + os.pathsep + os.environ.get("PATH", ""))
        result = run_script('exec bash "$1" up "$2" 3', NETNS_SH, self.prefix, env=env)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            result.stderr.splitlines(),
            [
                f"netns.sh: cannot create veth pair eth0 in {self.prefix}-1 and p1 in "
                f"{self.prefix}-sw: RTNETLINK answers: injected failure of the test"
            ],
        )
        with open(log) as f:
            calls = f.read().splitlines()
        made = [f"{self.prefix}-{name}" for name in ("sw", "0", "1")]
        for namespace in made:
            self.assertIn(f"netns add {namespace}", calls)
            self.assertIn(f"netns del {namespace}", calls)
        self.assertNotIn(f"netns add {self.prefix}-2", calls)
        self.assert_nothing_left()


class NetnsWithoutEtcHostsTest(unittest.TestCase):
    def test_up_and_exec_work_without_etc_hosts(self):
        # In a mount namespace of its own (private), /etc is a tmpfs that links to every entry
        # of the real /etc but hosts; up, exec and down run in there (the namespaces' mounts
        # are seen only there), and the set is taken down there too.
        prefix = fresh_prefix()
        self.addCleanup(netns_sh, "down", prefix, check=False)
        real_etc = os.path.join(temp_dir(self), "etc")
        os.mkdir(real_etc)
        with open("/etc/hosts", "rb") as f:
            etc_hosts = f.read()
        script = r"""
            set -e
            netns=$1 prefix=$2 real=$3
            mount --bind /etc "$real"
            mount -t tmpfs tmpfs /etc
            for entry in "$real"/*; do
              [ "$entry" = "$real/hosts" ] || ln -s "$entry" /etc/
            done
            [ ! -e /etc/hosts ] || { echo "/etc/hosts is still there" >&2; exit 99; }
            trap 'bash "$netns" down "$prefix"' EXIT
            bash "$netns" up "$prefix" 2
            bash "$netns" exec "$prefix" 1 sh -c 'hostname; cat /etc/hosts'
        """
        result = run_script(script, NETNS_SH, prefix, real_etc, wrap=PRIVATE_MOUNTS)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], "node1")
        self.assertIn("10.77.0.10 node0 head", lines)
        self.assertIn("10.77.0.11 node1", lines)
        # The machine's own /etc/hosts and namespaces are as they were.
        with open("/etc/hosts", "rb") as f:
            self.assertEqual(f.read(), etc_hosts)
        self.assertEqual(namespaces_of(prefix), [])


if __name__ == "__main__":
    main(HANG_LIMIT_S)
