"""Health checks before every round (issue 57; agents/health_check.h) on simulated hosts
(network namespaces; needs root), through a dlrund on host 0:

- a host whose --health-check hangs (bounded by --health-check-timeout, counted as failed) sits
  the round out and the agent waiting as a spare takes its place; the job runs on the others, and
  the host that sat out ends at once when stopped;
- in a job of --nnodes=1:2, a host that fails its check stays out and the round forms without
  it; once its check passes it joins, and the job's next round has both hosts;
- a host whose workers fail twice (--quarantine-after=2) is put out and writes its name to
  --quarantine-file: the round forms with the agent started after that, and once its cool-down
  is over the host is let in again;
- the network probe between a round's nodes names the link of the host whose sending is slowed
  (a token bucket on its eth0) as the round's slowest, once, from the round's first node; a
  restart's workers start without waiting for the probe (two hosts cut from each other: it lasts
  until its deadline), which runs beside them;
- a node whose check keeps failing past the rendezvous's join_timeout ends (exit 1, one line)
  rather than wait for ever (on loopback).

The check reads a file the test makes: OUT/unfit-<hostname>.

Runs under torch 2.13's interpreter (ctest: python_health_hosts) and as root.
"""

import glob
import os
import re
import signal
import subprocess
import unittest

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    free_port,
    read_json,
    temp_dir,
    wait_until,
)
from launcher_fixture import Launcher, dlrund_in
from netns_fixture import Hosts, main
from test_inprocess_recovery_hosts import RDZV_PORT, Output

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "elastic_worker.py")
TIMEOUT_S = 120


def check(out, unfit):
    """A --health-check failing on a host marked unfit: `unfit` is what it then does."""
    return f"if test -e {out}/unfit-$(hostname); then {unfit}; fi"


def starts(out):
    """Every worker start recorded: (attempt, host, WORLD_SIZE)."""
    found = []
    for path in glob.glob(os.path.join(out, "start_*.json")):
        record = read_json(path)
        found.append(
            (
                int(record["env"]["TORCHELASTIC_RESTART_COUNT"]),
                record["host"],
                int(record["env"]["WORLD_SIZE"]),
            )
        )
    return sorted(found)


class HealthChecksOnHostsTest(unittest.TestCase):
    def start(self, hosts, nnodes, health, on, worker_args):
        """dlrund on host 0 and an agent on each host of `on`; returns the agents by host."""
        self.logs = temp_dir(self)
        self.env = clean_env(PYTHON_EXEC=PYTHON, TMPDIR=self.logs, GLOO_SOCKET_IFNAME="eth0")
        dlrund_in(self, hosts, self.env, self.logs)
        return self.start_more(hosts, nnodes, health, on, worker_args)

    def start_more(self, hosts, nnodes, health, on, worker_args):
        """An agent on each host of `on`, dlrund already there; the agents by host."""
        flags = [
            f"--nnodes={nnodes}",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={hosts.address(0)}:{RDZV_PORT}",
            "--rdzv-id=health",
            "--rdzv-conf=last_call_timeout=1",
            *health,
        ]
        return {
            host: Launcher(
                self,
                f"dlrun{host}",
                [binary_from_env("DLRUN", "dlrun"), *flags, PYTHON, WORKER, *worker_args],
                self.env,
                self.logs,
                hosts=hosts,
                host=host,
            )
            for host in on
        }

    def test_a_host_whose_check_hangs_sits_out_and_the_spare_takes_its_place(self):
        out = temp_dir(self)
        with Hosts(4) as hosts:
            open(os.path.join(out, f"unfit-{hosts.hostname(1)}"), "w").close()
            agents = self.start(
                hosts,
                "2",
                ["--health-check=" + check(out, "sleep 600"), "--health-check-timeout=1"],
                (1, 2, 3),
                [out],
            )
            codes = [agents[h].wait(TIMEOUT_S) for h in (2, 3)]
            result = Output(agents.values())
            self.assertEqual(codes, [0, 0], result)
            self.assertEqual(
                {host for _, host, _ in starts(out)}, {hosts.hostname(2), hosts.hostname(3)}, result
            )
            wait_until(
                lambda: "sits out the next round" in agents[1].output(),
                30,
                "host 1 to say it sits out",
                on_timeout=lambda: result,
            )
            self.assertIn(
                f"this node sits out the next round: --health-check '{check(out, 'sleep 600')}' "
                "did not finish in 1 s",
                agents[1].output(),
            )
            agents[1].proc.send_signal(signal.SIGTERM)  # sitting out, it ends when stopped
            self.assertNotEqual(agents[1].wait(30), None)

    def test_a_host_that_passes_again_joins_the_next_round(self):
        out = temp_dir(self)
        release = os.path.join(out, "release")
        unfit = os.path.join(out, "unfit-node1")
        with Hosts(3) as hosts:
            self.assertEqual(hosts.hostname(1), "node1")
            open(unfit, "w").close()
            agents = self.start(
                hosts,
                "1:2",
                ["--health-check=" + check(out, "echo marked unfit; exit 1")],
                (1, 2),
                [out, "--until-file", release],
            )
            result = lambda: Output(agents.values())  # noqa: E731
            wait_until(
                lambda: any(world == 2 for _, _, world in starts(out)),
                TIMEOUT_S,
                "the round without host 1",
                on_timeout=result,
            )
            self.assertEqual({host for _, host, _ in starts(out)}, {hosts.hostname(2)})
            self.assertIn(
                "this node sits out the next round: --health-check "
                f"'{check(out, 'echo marked unfit; exit 1')}' failed (exit code 1): "
                "marked unfit",
                agents[1].output(),
            )
            os.unlink(unfit)
            wait_until(
                lambda: any(world == 4 for _, _, world in starts(out)),
                TIMEOUT_S,
                "a round of both hosts",
                on_timeout=result,
            )
            open(release, "w").close()
            codes = [agents[h].wait(TIMEOUT_S) for h in (1, 2)]
            self.assertEqual(codes, [0, 0], result())
            self.assertEqual(
                {host for _, host, world in starts(out) if world == 4},
                {hosts.hostname(1), hosts.hostname(2)},
                result(),
            )
            self.assertIn("passes its health checks again", agents[1].output())

    def test_a_host_whose_workers_keep_failing_is_put_out_until_its_cool_down_ends(self):
        out = temp_dir(self)
        release = os.path.join(out, "release")
        with Hosts(4) as hosts:
            excluded = os.path.join(out, "excluded")
            flags = [
                "--max-restarts=3",
                "--quarantine-after=2",
                "--quarantine-for=3",
                "--health-min-free=0",
                f"--quarantine-file={excluded}",
            ]
            args = [out, "--fail-host", hosts.hostname(1), "--until-file", release]
            agents = self.start(hosts, "2", flags, (1, 2), args)
            result = lambda: Output(agents.values())  # noqa: E731
            wait_until(
                lambda: "sits out the next round: quarantined" in agents[1].output(),
                TIMEOUT_S,
                "host 1 to be put out",
                on_timeout=result,
            )
            self.assertIn(
                "this node sits out the next round: quarantined: its workers failed 2 "
                "times within 600 s (--quarantine-after)",
                agents[1].output(),
            )
            with open(excluded) as names:  # for a requeued batch script's --exclude
                self.assertEqual(names.read(), f"{hosts.hostname(1)}\n")
            agents.update(self.start_more(hosts, "2", flags, (3,), args))
            wait_until(
                lambda: any(host == hosts.hostname(3) for _, host, _ in starts(out)),
                TIMEOUT_S,
                "a round with host 3 in host 1's place",
                on_timeout=result,
            )
            wait_until(
                lambda: "passes its health checks again" in agents[1].output(),
                30,
                "host 1 to be let in again",
                on_timeout=result,
            )
            open(release, "w").close()
            self.assertEqual([agents[h].wait(TIMEOUT_S) for h in (2, 3)], [0, 0], result())
            self.assertEqual(
                sorted({a for a, host, _ in starts(out) if host == hosts.hostname(1)}),
                [0, 1],
                result(),
            )  # its two failed attempts, none after

    def test_the_network_probe_names_the_slowed_link(self):
        out = temp_dir(self)
        with Hosts(4) as hosts:
            hosts.slow(2, "100mbit")
            # Room for the probe on a loaded machine; the node's lease must outlast it.
            probe = ["--network-probe-timeout=20", "--rdzv-conf=heartbeat_timeout=22"]
            agents = self.start(hosts, "3", probe, (1, 2, 3), [out])
            codes = [agents[h].wait(TIMEOUT_S) for h in (1, 2, 3)]
            result = Output(agents.values())
            self.assertEqual(codes, [0, 0, 0], result)
            named = re.findall(
                r"network probe: slowest link (\S+) .*-> (\S+) .*MB/s", result.stderr
            )
            self.assertEqual(len(named), 1, result)  # one round, its first node speaks
            self.assertEqual(named[0][0], hosts.hostname(2), result)
            self.assertNotIn("not measured", result.stderr)

    def test_a_restarts_workers_start_without_waiting_for_the_network_probe(self):
        # The job's first round is measured before its workers start; a restart's workers start
        # at once and the probe runs beside them. Host 2 does not probe (--no-network-probe), so
        # host 1's probe waits for it until its deadline, every round.
        out = temp_dir(self)
        deadline_s = 6
        flags = [
            "--max-restarts=1",
            f"--network-probe-timeout={deadline_s}",
            "--rdzv-conf=heartbeat_timeout=8",  # the lease outlasts the probe, as it must
        ]
        args = [out, "--fail-rank", "0", "--fail-rounds", "1"]
        with Hosts(3) as hosts:
            agents = self.start(hosts, "2", [*flags, "--no-network-probe"], (2,), args)
            agents.update(self.start_more(hosts, "2", flags, (1,), args))
            codes = [agents[h].wait(TIMEOUT_S) for h in (1, 2)]
            result = Output(agents.values())
            self.assertEqual(codes, [0, 0], result)
            self.assertIn("network probe: ", agents[1].output())
            last = max(attempt for attempt, _, _ in starts(out))
            self.assertGreaterEqual(last, 1, result)  # rank 0 failed once: a restart
            began = {}
            for path in glob.glob(os.path.join(out, f"start_{last}_*.json")):
                record = read_json(path)
                began.setdefault(record["host"], []).append(record["time"])
            self.assertEqual(sorted(began), [hosts.hostname(1), hosts.hostname(2)], result)
            # Host 1's workers started within a moment of host 2's (before: its probe's deadline
            # later).
            late = max(began[hosts.hostname(1)]) - min(began[hosts.hostname(2)])
            self.assertLess(late, deadline_s - 2, result)

    def test_a_node_whose_check_keeps_failing_ends_after_the_join_timeout(self):
        logs = temp_dir(self)
        done = subprocess.run(
            [
                binary_from_env("DLRUN", "dlrun"),
                "--nnodes=1:2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                "--rdzv-conf=join_timeout=1",
                "--health-check=echo no GPUs here; exit 1",
                "/bin/true",
            ],
            env=clean_env(TMPDIR=logs),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn(
            "dlrun: error: this node failed its health checks for 1 s (the "
            "rendezvous's join_timeout): --health-check 'echo no GPUs here; exit 1' "
            "failed (exit code 1): no GPUs here",
            done.stderr,
        )


if __name__ == "__main__":
    main()
