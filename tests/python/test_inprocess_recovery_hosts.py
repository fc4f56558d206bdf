"""In-process recovery (issue 55) across hosts: two simulated hosts (network namespaces; needs
root) of 2 workers each, through a dlrund, and a third agent waiting as a spare. A worker
SIGKILLed on one host (rank 3, at step 9) is replaced there; every other worker on both hosts
keeps its process, the spare stays a spare, each rank takes every step once, the weights are,
bit for bit, those of the fault-free run (made on one node: the same ranks, data and sums), and
all three agents exit 0.

A lost host: a member host is killed whole (its agent and both its workers, after rank 2 stopped
itself at step 9, before that step's all-reduce). The other member's agent keeps its workers
through the re-rendezvous, the round that follows keeps their ranks, and the spare takes the lost
host's place: its workers start as ranks 2 and 3 and join the survivors in process. Each rank takes
every step once, the survivors' PIDs never change, the weights are bit for bit the fault-free
run's, and the two agents left exit 0.

A host lost as a recovery ends (rank 3 replaced at step 9, then rank 0, the source, lost with its
host as that recovery's last barrier returns, before it said the generation formed): the others
said it, and the spare's workers meet the survivors in generation 2 in process. A host lost as
the group forms again (rank 3 replaced at step 9, then rank 2 stopped before it joins the group
and its host killed): the survivors, waiting in the formation for ranks that never come, see the
move of the round that keeps them, leave the formation and meet the spare's workers in process.

A silent host (its link down after rank 2 stopped itself at step 9): the survivors' agent keeps
them at once, blocked in that step's all-reduce, which never fails; the round that takes the
spare in frees them (their agent creates the next generation's arrivals, which their step
watches wait for), and they recover in process with the spare's workers: every step once, one
set of weights; so too where their steps are slow (2.5 s: the watch frees them 5 s on, and
their agent, told their step's time by their marks, waits for it). A survivor stuck where
nothing frees it (in a C call that holds the GIL) is killed by its agent (never replaced
alone), and the whole group restarts with the spare in the silent host's place, exit 0, one
set of weights.

A lost host without a spare (--nnodes=1:2): the host of ranks 0-1 is killed whole; the other
keeps its workers, the next round keeps them as ranks 0-1 of 2 (their agent tells them in the
store), and they go on in their processes from the step that failed: every step once, one set of
weights, exit 0.

Runs under torch 2.13's interpreter (ctest: python_inprocess_recovery_hosts) and as root.
"""

import glob
import os

from dlrun_fixture import PYTHON, binary_from_env, clean_env, read_json, temp_dir, wait_until
from launcher_fixture import RDZV_PORT, Launcher, dlrund_in
from netns_fixture import Hosts, main
from test_inprocess_recovery import STEPS, TIMEOUT_S, TRAIN, WORLD, InProcessCase


def gone(pid):
    """Whether process `pid` ended (a zombie counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


class Output:
    """What check_recovered reads of a run: the agents' output together."""

    def __init__(self, launchers):
        self.stderr = "".join(one.describe() for one in launchers)

    def __repr__(self):
        return self.stderr[-6000:]


class TwoHostsWithASpareTest(InProcessCase):
    def run_job(self, hosts, out, kills, during=None, nnodes="2", on=(1, 2, 3), more=(), env=None):
        """dlrund on host 0, an agent on each host of `on` (by default all three at once: the
        round closes as the second arrives, --nnodes=2, and the third waits as a spare), the
        workers given `kills` (one KILL or several); `during(agents)` runs while they do.
        Returns the agents and their exit codes."""
        logs = temp_dir(self)
        env = clean_env(PYTHON_EXEC=PYTHON, TMPDIR=logs, GLOO_SOCKET_IFNAME="eth0", **(env or {}))
        dlrund_in(self, hosts, env, logs)
        flags = [
            f"--nnodes={nnodes}",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={hosts.address(0)}:{RDZV_PORT}",
            "--rdzv-id=inproc",
            "--max-restarts=3",
            "--recovery=in-process",
            "--warm-start",  # the workers forked from an interpreter that imported torch once
            "--preload=torch",
            *more,
        ]
        agents = [
            Launcher(
                self,
                f"dlrun{host}",
                [
                    binary_from_env("DLRUN", "dlrun"),
                    *flags,
                    PYTHON,
                    TRAIN,
                    out,
                    str(STEPS),
                    *([kills] if isinstance(kills, str) else kills),
                ],
                env,
                logs,
                hosts=hosts,
                host=host,
            )
            for host in on
        ]
        if during:
            during(agents)
        return agents, [agent.wait(TIMEOUT_S) for agent in agents]

    def test_a_killed_worker_is_replaced_on_its_host_and_the_spare_stays_a_spare(self):
        # With --ready-spares: the spare's workers, started ahead, are never placed, and end
        # with their agent.
        self.reference()
        out = temp_dir(self)
        with Hosts(4) as hosts:
            agents, codes = self.run_job(hosts, out, "3:9", more=["--ready-spares"])
            ahead = [int(p.rsplit("_", 1)[1]) for p in glob.glob(os.path.join(out, "reserve_*"))]
            wait_until(
                lambda: all(gone(pid) for pid in ahead),
                10,
                "the spare's workers started ahead to end",
                on_timeout=lambda: ahead,
            )
        result = Output(agents)
        self.assertEqual(codes, [0, 0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.check_recovered(out, finals, result, victim=3)
        spares = [one.name for one in agents if "waiting as a spare" in one.output()]
        self.assertEqual(len(spares), 1, result)
        self.assertEqual(len(ahead), 2, result)

    def host_loser(self, hosts, out, rank, lost, on=(1, 2, 3), silent=False):
        """What run_job runs meanwhile: once `rank` stopped itself (RANK:STEP:host), kills the
        host it runs on; its index goes to `lost`. `silent`: takes the host's link down instead
        (no failure reaches the others' sockets), and kills it once the others ended (its agent
        would wait out the store's outage)."""

        def lose(agents):
            flag = os.path.join(out, f"lose_host_{rank}")
            wait_until(
                lambda: os.path.exists(flag),
                TIMEOUT_S,
                f"rank {rank} to stop itself",
                on_timeout=lambda: Output(agents),
            )
            pid = int(glob.glob(os.path.join(out, f"start_{rank}_*"))[0].rsplit("_", 1)[1])
            lost.append(next(h for h in on if pid in hosts.pids(h)))
            if silent:
                hosts.link(lost[0], False)
                for host, agent in zip(on, agents):
                    if host != lost[0]:
                        agent.wait(TIMEOUT_S)
            hosts.kill_host(lost[0])

        return lose

    def test_a_lost_hosts_ranks_start_on_the_spare_and_join_the_survivors_in_process(self):
        result, _ = self.spare_takes_lost_host()
        self.assertIn("keeping this node's workers through the re-rendezvous", result.stderr)
        self.assertNotIn("could not keep", result.stderr)

    def spare_takes_lost_host(self, before_loss=None, more=(), env=None):
        """The host of rank 2 killed once it stopped itself (and `before_loss(out, agents)`
        ran), the job given `more` flags and `env`: checks the spare's ranks recovered in
        process with the survivors; returns the agents' output and each rank's final record."""
        self.reference()
        out, lost = temp_dir(self), []
        with Hosts(4) as hosts:
            lose = self.host_loser(hosts, out, 2, lost)

            def during(agents):
                if before_loss:
                    before_loss(out, agents)
                lose(agents)

            agents, codes = self.run_job(hosts, out, "2:9:host", during=during, more=more, env=env)
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost[0]], [0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.check_recovered(out, finals, result, victim=(2, 3))
        self.assertRegex(result.stderr, r"round \d+ kept ranks 0-1 running")
        return result, finals

    def test_ready_spares_take_a_lost_hosts_ranks_with_workers_started_ahead(self):
        # --ready-spares: the spare's workers start while it waits and wait in their loops;
        # the host of rank 2 is killed once both are there, and the ranks it ran are taken by
        # those very processes, recovered in process with the survivors. Those two ran their
        # loop's warmup (a step of their own, discarded: the weights are the fault-free run's),
        # and no other worker did.
        result, finals, ahead, warm = self.ready_spares_job()
        self.assertEqual(sorted(finals[r]["pid"] for r in (2, 3)), sorted(ahead), result)
        self.assertEqual(sorted(warm), sorted(ahead), result)

    def test_ready_spares_that_ended_before_their_place_start_afresh_then(self):
        # The spare's workers started ahead exit before the loss: each is said, and the spare
        # starts those ranks afresh when it takes the lost host's place, in process all the same.
        result, finals, ahead, _ = self.ready_spares_job({"INPROCESS_RESERVE_EXIT": "1"})
        self.assertFalse({finals[r]["pid"] for r in (2, 3)} & set(ahead), result)
        for local in (0, 1):
            self.assertRegex(
                result.stderr,
                rf"the worker started ahead for local rank {local} ended \(exit code 3\) "
                r"before its place came; that rank's worker starts afresh then",
            )

    def ready_spares_job(self, env=None):
        """spare_takes_lost_host under --ready-spares (and `env`), the host lost once the
        spare's two workers started ahead: the agents' output, each rank's final record, the
        pids of the workers started ahead and of the workers that ran their loop's warmup."""
        ahead, dirs = [], []

        def started_ahead(out, agents):
            dirs.append(out)
            wait_until(
                lambda: len(glob.glob(os.path.join(out, "reserve_*"))) == 2,
                TIMEOUT_S,
                "the spare's workers started ahead",
                on_timeout=lambda: Output(agents),
            )
            ahead.extend(
                int(p.rsplit("_", 1)[1]) for p in glob.glob(os.path.join(out, "reserve_*"))
            )

        result, finals = self.spare_takes_lost_host(started_ahead, ["--ready-spares"], env)
        self.assertIn("2 workers start ahead and wait in dlrun.recovery's loop", result.stderr)
        warm = [int(p.rsplit("_", 1)[1]) for p in glob.glob(os.path.join(dirs[0], "warm_*"))]
        return result, finals, ahead, warm

    def check_host_lost_in_a_recovery(self, kills, loser, kept, processes, generation):
        """A job given `kills`, the host of rank `loser` killed once it stopped itself: the two
        agents left exit 0, no whole-group restart, `kept` ("0-1") the ranks the round kept, each
        rank's processes counted in `processes` ({rank: count}), every step once, the
        fault-free weights, every rank at `generation`."""
        self.reference()
        out, lost = temp_dir(self), []
        with Hosts(4) as hosts:
            agents, codes = self.run_job(
                hosts, out, kills, during=self.host_loser(hosts, out, loser, lost)
            )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost[0]], [0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        self.assertNotIn("restarting the whole group", result.stderr)
        self.assertNotIn("falling back", result.stderr)
        self.assertRegex(result.stderr, rf"round \d+ kept ranks {kept} running")
        for rank in range(WORLD):
            taken = self.processes(out, rank)
            steps = sorted(s for one in taken.values() for s in one)
            self.assertEqual(steps, list(range(STEPS)), (rank, taken, result))
            self.assertEqual(len(taken), processes[rank], (rank, taken))
            self.assertEqual(finals[rank]["generation"], generation, finals[rank])

    def test_a_survivor_replaced_after_the_keep_meets_the_others_where_they_moved(self):
        # The host of rank 2 is lost; rank 0, on the other, cannot close its old group (a
        # collective left pending, the group's destruction never returns) and exits to be
        # replaced a second later, once the round that kept its node formed: its replacement
        # meets the others under that round's keys, where its predecessor was moved (it met
        # under the generation's own, alone, until the recovery's deadline).
        self.check_host_lost_in_a_recovery(
            ("0:9:stuck", "2:9:host"), 2, "0-1", {0: 2, 1: 1, 2: 2, 3: 2}, 1
        )

    def test_a_host_lost_as_a_recovery_ends_is_recovered_in_process_again(self):
        # Rank 3 dies at step 9 and is replaced on its host; rank 0, which sends the state, is
        # lost with its host as that recovery's last barrier returns, before it says so. The
        # others say it: the spare's workers and the moves for the survivors name generation 2,
        # where they wait (not generation 1, which would leave them to the 120 s deadline).
        self.check_host_lost_in_a_recovery(
            ("3:9", "0:committed:host"), 0, "2-3", {0: 2, 1: 2, 2: 1, 3: 2}, generation=2
        )

    def test_a_host_lost_as_the_group_re_forms_is_recovered_in_process_in_the_next_round(self):
        # Rank 3 dies at step 9 and is replaced on its host; every rank meets its replacement,
        # and rank 2, on the same host, stops as the group forms again, before it joins: the
        # others wait in the formation for a rank that never comes, and the host is killed.
        # The round that keeps the survivors moves them; their formation's watch sees the move,
        # ends the formation, and they meet the spare's workers there in process (not at the
        # formation's 120 s deadline, then the whole group).
        self.check_host_lost_in_a_recovery(
            ("3:9", "2:group:host"), 2, "0-1", {0: 1, 1: 1, 2: 2, 3: 3}, generation=1
        )

    def check_silent_host_freed(self, kills):
        """Rank 2's host goes silent at its step 9 (`kills` has it). Its lease lapses and the
        round ends as a lost node; the survivors' agent keeps them at once, blocked in step 9's
        all-reduce, which never fails. The round that takes the spare in proves that step cannot
        end: their agent moves them on, their step watches free them at once, and they recover
        in process with the spare's workers."""
        self.reference()
        out, silenced = temp_dir(self), []
        with Hosts(4) as hosts:
            agents, codes = self.run_job(
                hosts, out, kills, during=self.host_loser(hosts, out, 2, silenced, silent=True)
            )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != silenced[0]], [0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.check_recovered(out, finals, result, victim=(2, 3))
        self.assertRegex(
            result.stderr,
            r"rank [01]: in step 9 of generation 0 as a node of the group was lost; "
            r"shutting its group's connections down",
        )
        self.assertNotIn("did not see the lost node's failure", result.stderr)

    def test_a_silent_hosts_survivors_are_freed_and_join_the_spares_ranks_in_process(self):
        self.check_silent_host_freed("2:9:host")

    def test_a_silent_hosts_survivors_with_slow_steps_are_freed_in_process(self):
        # Steps of 2.5 s (rank 0 sleeps in step 8, the others wait for it): their marks tell
        # their agent the step's time, and it gives the survivors three times that more to see
        # the loss than the 2 s of steps that take no time before it would stop them.
        self.check_silent_host_freed(("0:8:slow", "2:9:host"))

    def test_a_silent_hosts_survivor_stuck_past_its_watch_stops_and_the_whole_group_restarts(
        self,
    ):
        # The same silence with rank 0 stuck in a C call that holds the GIL as step 9 begins:
        # neither a failing collective nor its step watch can free it. Its agent kills it once
        # the grace for its step's time is over, never to be replaced alone, and the whole
        # group restarts with the spare in the silent host's place, every rank from step 0.
        # With --ready-spares: the spare's workers started ahead take the round that kept the
        # survivors, and the whole group's restart starts them afresh.
        self.reference()
        out, silenced = temp_dir(self), []
        with Hosts(4) as hosts:
            agents, codes = self.run_job(
                hosts,
                out,
                ("0:9:gil", "2:9:host"),
                during=self.host_loser(hosts, out, 2, silenced, silent=True),
                more=["--ready-spares"],
            )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != silenced[0]], [0, 0], result)
        self.assertRegex(
            result.stderr,
            r"rank 0 did not see the lost node's failure within 2\.\d s \(it may be stuck\): "
            r"it stops, and the whole group restarts",
        )
        self.assertRegex(
            result.stderr,
            r"no in-process recovery \(kept after a lost node, it never saw that node's "
            r"failure\): restarting the whole group",
        )
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        for final in finals:
            self.assertEqual(final["generation"], 0, final)
        self.assertIn("2 workers start ahead", result.stderr)

    def test_a_survivor_lost_as_the_group_re_forms_restarts_the_whole_group(self):
        # A host is lost at step 9 and rank 0, on the other, dies as its loop forms the group
        # again: its replacement could not meet the kept round, so the whole group restarts
        # at once (not at the survivors' deadline), every rank from step 0: one set of weights.
        self.reference()
        out, lost = temp_dir(self), []
        with Hosts(4) as hosts:
            agents, codes = self.run_job(
                hosts, out, ("2:9:host", "0:group"), during=self.host_loser(hosts, out, 2, lost)
            )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost[0]], [0, 0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(WORLD)]
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        self.assertIn(
            "no in-process recovery (it failed during its own in-process recovery)", result.stderr
        )
        for final in finals:
            self.assertEqual(final["generation"], 0, final)

    def test_without_a_spare_the_survivors_go_on_in_process_with_new_ranks(self):
        # --nnodes=1:2: the host of ranks 0-1 is lost and none takes its place; ranks 2-3 go on
        # in their processes as ranks 0-1 of 2, from the step that failed.
        out, lost = temp_dir(self), []
        with Hosts(3) as hosts:
            agents, codes = self.run_job(
                hosts,
                out,
                "0:9:host",
                nnodes="1:2",
                on=(1, 2),
                during=self.host_loser(hosts, out, 0, lost, on=(1, 2)),
            )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2), codes) if h != lost[0]], [0], result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in (2, 3)]
        self.assertEqual([(f["rank"], f["world"]) for f in finals], [(0, 2), (1, 2)], result)
        self.assertEqual(len({f["sha256"] for f in finals}), 1, finals)  # one set of weights
        for old, final in zip((2, 3), finals):
            processes = self.processes(out, old)
            self.assertEqual(list(processes), [final["pid"]], result)  # its one process
            self.assertEqual(next(iter(processes.values())), list(range(STEPS)), result)
            self.assertEqual(final["generation"], 1, final)
        self.assertIn("kept ranks 2-3 running as ranks 0-1 of 2", result.stderr)
        self.assertIn("now rank 0 of 2", result.stderr)


if __name__ == "__main__":
    main()
