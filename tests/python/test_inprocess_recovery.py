"""In-process recovery (issue 55): under --recovery=in-process a worker that dies is started
again alone and the others keep their processes; dlrun.recovery.Loop re-forms the group and sends
the state from a survivor. The job is workers/inprocess_train.py (torch DDP over gloo, float64,
one seeded batch a step and rank, momentum), run fault-free once for the weights to equal.

- A worker SIGKILLed mid-training (4 workers, rank 2, and rank 0, whose process served nothing
  dlrun needs): the job ends 0, the survivors' PIDs never changed, each rank took every step once
  (the dead process's steps and its replacement's together), and every rank's final parameters
  are, bit for bit, those of the fault-free run.
- With --ready-replacements, a worker started ahead for each local rank (waiting in its loop)
  takes a killed worker's place: the replacement is one of them, the others are never placed.
- A hung worker (SIGSTOP, --hang-timeout): the node's stacks are taken, the stopped rank alone is
  replaced, and the job goes on as after a kill.
- A failure after the group re-formed (rank 2 at step 9, rank 1 at step 15): a second recovery,
  generation 2, the same weights.
- A rank whose old group cannot close (a collective of its own left pending on its live peers,
  who wait on it in theirs): it meets the next generation all the same, the peers are freed
  (their step watch, or its connections shut down) and every rank recovers in its own process;
  where the group stays registered, it exits and is replaced like a dead worker.
- A rank left in a step its peers left (it waits for good, no collective failing): once they
  meet in the next generation its loop's watch shuts its group's connections down (which frees
  a survivor waiting on it), then ends it, and it is replaced like a dead worker.
- A second failure during the recovery (a survivor dies at the same step as the first victim, or
  inside the recovery as the group forms again, the state is sent or its last barrier returns):
  the agent restarts the whole group, counted against --max-restarts, and the job still ends 0,
  bit-equal.
- A worker that dies once its loop is over (past the loop's last barrier): the whole group
  restarts at once (no rank is left in the loop to meet a replacement), bit-equal.
- A program that does not use the API behaves as today: its failure restarts the whole group.
- Without --recovery=in-process the loop is a plain DDP loop, and a failure restarts the group.
- NCCL on a torch that cannot abort a process group (before 2.5; the abort taken away to stand
  for one): the loop says so once and recovers nothing in process (gloo still would).

The jobs run with --warm-start --preload=torch (the workers and their replacements forked from an
interpreter that imported torch once), but for the fault-free run, the first killed worker (its
replacement a new interpreter) and the job without in-process recovery.

On two simulated hosts with a spare: test_inprocess_recovery_hosts.py.
"""

import glob
import os
import re
import signal
import unittest
from pathlib import Path

from dlrun_fixture import PYTHON, clean_env, main, read_json, run_dlrun, temp_dir, worker
from dlrund_fixture import start_dlrund

TRAIN = worker("inprocess_train.py")
STEPS = 24
WORLD = 4
TIMEOUT_S = 150


class InProcessCase(unittest.TestCase):
    """The job, its fault-free weights (made once for every test of the file) and the checks."""

    fault_free = None
    job_env = {}  # more of the workers' environment (the NCCL file's backend)

    def job(
        self,
        *kills,
        recovery="in-process",
        max_restarts=3,
        world=WORLD,
        flags=(),
        warm=True,
        rendezvous=("--standalone",),
        env=None,
    ):
        out = temp_dir(self)
        if warm:
            flags = ["--warm-start", "--preload=torch", *flags]
        result = run_dlrun(
            self,
            [
                *rendezvous,
                f"--nproc-per-node={world}",
                f"--max-restarts={max_restarts}",
                f"--recovery={recovery}",
                *flags,
                PYTHON,
                TRAIN,
                out,
                str(STEPS),
                *kills,
            ],
            env=clean_env(**self.job_env, **(env or {})),
            timeout=TIMEOUT_S,
        )
        self.assertEqual(result.returncode, 0, result)
        finals = [read_json(os.path.join(out, f"final_{r}.json")) for r in range(world)]
        return out, finals, result

    def reference(self):
        if InProcessCase.fault_free is None:
            _, finals, _ = self.job(recovery="restart", warm=False)
            self.assertEqual(len({f["sha256"] for f in finals}), 1, finals)
            InProcessCase.fault_free = finals[0]["sha256"]
        return InProcessCase.fault_free

    @staticmethod
    def processes(out, rank):
        """{pid: [steps it completed]} of one rank's processes."""
        found = {}
        for start in glob.glob(os.path.join(out, f"start_{rank}_*")):
            pid = int(start.rsplit("_", 1)[1])
            path = os.path.join(out, f"steps_{rank}_{pid}")
            with open(path) if os.path.exists(path) else open(os.devnull) as f:
                found[pid] = [int(line) for line in f if line.strip()]
        return found

    def check_recovered(self, out, finals, result, victim):
        """`victim`: the rank replaced, or the ranks (a lost host's)."""
        victims = {victim} if isinstance(victim, int) else set(victim)
        for rank in range(WORLD):
            processes = self.processes(out, rank)
            self.assertEqual(
                len(processes), 2 if rank in victims else 1, (rank, processes, result.stderr)
            )
            steps = sorted(s for taken in processes.values() for s in taken)
            self.assertEqual(steps, list(range(STEPS)), (rank, processes, result))
            if rank not in victims:  # the survivor's one process ran to the end
                self.assertEqual(finals[rank]["pid"], next(iter(processes)))
            self.assertEqual(finals[rank]["generation"], 1, finals[rank])
            phases = finals[rank]["last_recovery"]
            self.assertEqual(
                set(phases), {"leave", "meet", "group", "state", "total"}, finals[rank]
            )
            self.assertAlmostEqual(
                sum(phases.values()) - phases["total"], phases["total"], delta=0.05
            )
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        self.assertIn("in-process recovery", result.stderr)
        for rank in victims:
            self.assertRegex(
                result.stderr,
                rf"rank {rank} recovered in process, generation 1: "
                r"start [\d.]+ s, re-form [\d.]+ s, state [\d.]+ s",
            )


class InProcessRecoveryTest(InProcessCase):
    def test_a_killed_worker_is_replaced_and_the_survivors_go_on(self):
        for victim, warm in ((2, False), (0, True)):  # a replacement started anew, then forked
            with self.subTest(victim=victim, warm=warm):
                out, finals, result = self.job(f"{victim}:9", warm=warm)
                self.check_recovered(out, finals, result, victim)

    def test_a_worker_started_ahead_replaces_a_killed_one(self):
        # --ready-replacements: once the job runs, a worker for each local rank starts ahead and
        # waits in its loop (its warmup run); rank 1, killed once they all wait, is replaced by
        # the one of its local rank, which joins the survivors; the others are never placed.
        out, finals, result = self.job("1:9:ahead", flags=["--ready-replacements"])
        self.check_recovered(out, finals, result, 1)
        ahead, warm = (
            {int(p.rsplit("_", 1)[1]) for p in glob.glob(os.path.join(out, f"{kind}_*"))}
            for kind in ("reserve", "warm")
        )
        self.assertGreaterEqual(len(ahead), WORLD, result)
        placed = {r: set(self.processes(out, r)) & ahead for r in range(WORLD)}
        self.assertEqual(len(placed[1]), 1, (placed, result))
        self.assertLessEqual(placed[1], warm)
        self.assertEqual(finals[1]["pid"], next(iter(placed[1])))
        self.assertFalse(any(placed[r] for r in (0, 2, 3)), placed)

    def test_a_rank_lost_before_it_counted_its_save_is_recovered_in_process(self):
        # Every rank saves every step through dlrun.checkpoint; rank 2 dies as its copy of step 9
        # is made, before it counts it: step 9 never completes on every rank. The survivors'
        # next save does not wait for it (it waited 120 s, then failed the job's step), and the
        # job recovers in process as without the saves.
        out, finals, result = self.job("2:9:saved", env={"INPROCESS_CHECKPOINT": "1"})
        self.check_recovered(out, finals, result, 2)
        self.assertNotIn("not complete on every rank", result.stderr)

    def test_survivors_wait_for_a_replacement_in_a_few_store_requests(self):
        # A replacement started anew imports torch (seconds); the survivors wait for it in the
        # job's store (dlrund's, counted): one wait a look at the meeting, not a poll a
        # millisecond. The recovery's ADDs: the killed run's less the fault-free run's.
        adds = []
        for kills in ((), ("2:9",)):
            dlrund = start_dlrund(self, "--stats")
            endpoint = [  # elastic, for a store of its own: one node serves it in process
                "--nnodes=1:2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{dlrund.port}",
                "--rdzv-conf=last_call_timeout=0.1",
            ]
            out, finals, result = self.job(*kills, warm=False, rendezvous=endpoint)
            if kills:
                self.check_recovered(out, finals, result, 2)
            dlrund.proc.send_signal(signal.SIGTERM)
            stats = dlrund.proc.stdout.read().decode()
            self.assertEqual(dlrund.stop(), 0)
            adds.append(int(re.search(r"dlrund stats:.* ADD=(\d+)", stats).group(1)))
        self.assertLess(adds[1] - adds[0], 100, adds)

    def test_a_hung_worker_is_replaced_once_the_stacks_are_taken(self):
        # Rank 1 stops itself (SIGSTOP) at step 9; the others wait for it in the all-reduce.
        out, finals, result = self.job("1:9:stop", flags=["--hang-timeout=5"])
        self.check_recovered(out, finals, result, victim=1)
        self.assertIn("hang: rank 1 made no progress", result.stderr)
        taken = re.search(
            r"taking this node's stacks into (\S+), then replacing rank 1 in", result.stderr
        )
        self.assertIsNotNone(taken, result.stderr)
        # The stopped rank's native stack; the others' Python stacks alone, taken before the
        # kill (a debugger would stop them while they recover), in the backward that waits.
        hung = Path(taken[1], "rank_1.txt").read_text()
        self.assertIn("== native stacks (", hung)
        self.assertIn("no Python stacks: the process is stopped", hung)
        for rank in (0, 2, 3):
            report = Path(taken[1], f"rank_{rank}.txt").read_text()
            self.assertIn("== Python stacks (faulthandler) ==", report)
            self.assertIn(" in backward\n", report)
            self.assertNotIn("== native stacks", report)
            self.assertIn("no native stacks: its Python stack alone was asked for", report)

    def test_a_failure_after_the_group_re_formed_is_recovered_in_process_again(self):
        # Rank 2 dies at step 9; once generation 1 trains, rank 1 dies at step 15.
        out, finals, result = self.job("2:9", "1:15")
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        for rank in range(WORLD):
            steps = sorted(s for taken in self.processes(out, rank).values() for s in taken)
            self.assertEqual(steps, list(range(STEPS)), (rank, result))
            self.assertEqual(len(self.processes(out, rank)), 2 if rank in (1, 2) else 1, rank)
            self.assertEqual(finals[rank]["generation"], 2, finals[rank])

    def test_a_group_held_by_a_pending_collective_is_shut_down_and_nobody_is_replaced(self):
        # Rank 0 fails at step 9 with an all-reduce pending that its peers, in a barrier, never
        # match: its old group cannot be destroyed, and they wait on it. It goes on to the next
        # generation all the same; the peers are freed by their step watch as it arrives there,
        # or by its connections shut down 0.5 s on. Every rank recovers in its own process,
        # generation 1, nothing started anew.
        out, finals, result = self.job("0:9:pending")
        self.assertRegex(
            result.stderr,
            r"rank [123]: still in step 9 of generation 0 while the others meet in the next; "
            r"shutting its group's connections down|rank 0: the old process group did not "
            r"end within 0\.5 s \(a collective pending\); its connections shut down",
        )
        self.assertNotIn("exiting to be replaced", result.stderr)
        self.assertNotIn("replacement started", result.stderr)
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        for rank in range(WORLD):
            processes = self.processes(out, rank)
            self.assertEqual(len(processes), 1, (rank, processes))
            self.assertEqual(next(iter(processes.values())), list(range(STEPS)), rank)
            self.assertEqual(finals[rank]["generation"], 1, finals[rank])

    def test_a_group_that_still_does_not_close_ends_its_rank_which_is_replaced(self):
        # The same, but the group's destruction never returns and it stays registered: rank 0
        # exits (76), and its agent starts a replacement in its place; the others keep theirs.
        out, finals, result = self.job("0:9:stuck")
        self.assertIn("exiting to be replaced (exit 76)", result.stderr)
        self.assertRegex(
            result.stderr,
            r"rank 0 \(local 0\) exit code 76: in-process recovery, its "
            r"replacement started",
        )
        self.check_recovered(out, finals, result, victim=0)

    def test_a_rank_left_in_a_step_its_peers_left_is_freed_then_replaced(self):
        # Rank 2 dies at step 9; rank 1 stays in step 9 for good, no collective failing, and a
        # survivor whose all-reduce waits on rank 1 rather than on rank 2 waits as long. Once
        # the others meet in generation 1, each such rank's loop shuts its group's connections
        # down: the waiting survivor's all-reduce fails and it recovers in its process; rank 1,
        # still in its step a look later, exits (76) and is replaced. Bit-equal, every step once.
        out, finals, result = self.job("2:9", "1:9:hold")
        stuck = "rank 1: still in step 9 of generation 0 while the others meet in the next; "
        self.assertIn(stuck + "shutting its group's connections down", result.stderr)
        self.assertIn(stuck + "exiting to be replaced (exit 76)", result.stderr)
        self.assertRegex(
            result.stderr,
            r"rank 1 \(local 1\) exit code 76: in-process recovery, its replacement started",
        )
        self.check_recovered(out, finals, result, victim=(1, 2))

    def test_a_second_failure_during_recovery_restarts_the_whole_group(self):
        # Rank 3 dies at step 9, and rank 1 too while the first recovery is under way.
        out, finals, result = self.job("3:9", "1:9")
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        self.assertIn("restarting the whole group", result.stderr)
        # Every rank's last process started in the new attempt and trained from step 0.
        for rank in range(WORLD):
            self.assertEqual(finals[rank]["generation"], 0, finals[rank])
            self.assertGreater(len(self.processes(out, rank)), 1, rank)

    def test_a_failure_while_the_group_re_forms_restarts_the_whole_group(self):
        # Rank 3 dies at step 9; in that recovery rank 1 dies as the group forms again, or rank
        # 0 (the survivor that sends) as the state is sent, or as the recovery's last barrier
        # returns (before its mark says it recovered). Nothing waits: the others fall back, the
        # job ends 0, bit-equal.
        for kill in ("1:group", "0:state", "0:committed"):
            with self.subTest(kill=kill):
                out, finals, result = self.job("3:9", kill)
                self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
                self.assertIn("restarting the whole group", result.stderr)
                for rank in range(WORLD):
                    self.assertEqual(finals[rank]["generation"], 0, finals[rank])

    def test_a_failure_past_the_loop_restarts_the_whole_group_at_once(self):
        # Rank 2 dies once its loop is over: no rank is left in the loop to meet a replacement.
        out, finals, result = self.job("2:end")
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        self.assertIn(
            "no in-process recovery (it had left dlrun.recovery's loop): restarting "
            "the whole group",
            result.stderr,
        )
        self.assertNotIn("recovery failed", result.stderr)
        for rank in range(WORLD):
            self.assertEqual(finals[rank]["generation"], 0, finals[rank])
            self.assertEqual(len(self.processes(out, rank)), 2, rank)

    def test_without_in_process_recovery_the_group_restarts(self):
        out, finals, result = self.job("2:9", recovery="restart", warm=False)
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        for rank in range(WORLD):
            self.assertEqual(len(self.processes(out, rank)), 2, rank)
            self.assertEqual(finals[rank]["generation"], 0)
        self.assertNotIn("in-process recovery", result.stderr)

    def test_nccl_on_a_torch_that_cannot_abort_its_group_is_not_recovered_in_process(self):
        # torch before 2.5 has no process-group abort; it is taken away here to stand for one.
        script = os.path.join(temp_dir(self), "old_torch.py")
        with open(script, "w") as f:
            f.write(
                "import torch.distributed.distributed_c10d as c10d\n"
                "from dlrun import recovery\n"
                "before = recovery._can_recover('nccl')\n"
                "del c10d._abort_process_group\n"
                "print('recoverable', before, recovery._can_recover('nccl'),"
                " recovery._can_recover('gloo'))\n"
            )
        result = run_dlrun(
            self,
            ["--standalone", "--nproc-per-node=1", "--recovery=in-process", PYTHON, script],
            env=clean_env(),
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertIn("recoverable True False True", result.stdout, result)
        self.assertEqual(
            result.stderr.count(
                "cannot abort an NCCL process group (torch 2.5 can): a failure "
                "restarts the whole group"
            ),
            1,
            result,
        )


if __name__ == "__main__":
    main()
