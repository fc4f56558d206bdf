"""Checkpoints let a job carry on where it stopped.

- A worker that dies mid-run (rank 1 exits 1 after a step, on attempt 0 only, by the trainer's
  testing aid --fail-at-step) under `dlrun --max-restarts=1`: the restarted group resumes from
  the newest checkpoint ("resuming from checkpoint" in the log), runs only the steps that are
  left, and ends with the accuracy of an uninterrupted run with the same seed (within 0.5
  points).
- The same over Gloo with the default math (AVX2 where the CPU has it), on synthetic data: the
  resumed run ends with the very weights of the uninterrupted one, bit for bit, whatever the
  environment's size does to where malloc puts the model's buffers (the AVX2 softmax once
  rounded by their alignment, so a resume, or a run, could take another path).
- SIGUSR1 to dlrun (forwarded to every worker) makes the trainer checkpoint at the next step
  boundary and exit 0 on every rank; a second run resumes from that checkpoint.
- SIGTERM to a rank whose peer went silent (SIGSTOPped, its connections open: a host whose
  links went down), in the step's all-reduce over gloo, which would wait out gloo's 30 s: the
  rank ends by SIGTERM after its grace (2 s and four steps' time), saving nothing, well before.
- A run resumed with nothing left to do takes no step and reports the resumed model.
- --checkpoint-in-memory alone (the node's memory that dlrun holds, every step): a restarted
  group resumes from the step before the failure, with an uninterrupted run's weights; outside
  dlrun the flag is one line's error.
"""

import os
import signal
import unittest

from dlrun_fixture import clean_env, is_running, main, temp_dir, wait_until
from test_checkpoint import memory_dirs
from trainer_fixture import (
    TrainJob,
    checkpoints,
    descendants,
    dumped_weights,
    require_data,
    run_single,
    run_train,
    runs_trainer,
    summary,
)


def rank_of(pid):
    """A worker's RANK, from its environment."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    return int(entries[b"RANK"])


NPROC = 2
EPOCHS = 2
STEPS_PER_EPOCH = 469  # ceil(60000 / 2 / 64)
CHECKPOINT_EVERY = 100
FAIL_AT_STEP = 250  # between two checkpoints: the restart redoes steps 201..250
SEED = 5
ACCURACY_POINTS = 0.005
# Environment sizes for the bitwise test: each shifts every process's heap (before the fix one
# in a few runs, and a padding of 8 here, rounded differently).
PADDINGS = (0, 8, 24, 40)
SIGNAL_AFTER_STEP = 20
SIGNAL_WAIT_S = 60
STOP_GRACE_LIMIT_S = 15  # a SIGTERMed rank with a silent peer ends within it (gloo's wait: 30 s)


class TrainerResumeTest(unittest.TestCase):
    def setUp(self):
        require_data(self)

    def test_restart_after_a_failure_resumes_from_the_checkpoint(self):
        common = ["--epochs", str(EPOCHS), "--seed", str(SEED), "--progress-every", "1000"]
        straight = run_train(self, common, NPROC)
        self.assertEqual(straight.returncode, 0, straight)
        expected = summary(self, straight)

        checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
        result = run_train(
            self,
            [
                *common,
                "--checkpoint-dir",
                checkpoint_dir,
                "--checkpoint-every",
                str(CHECKPOINT_EVERY),
                "--fail-at-step",
                str(FAIL_AT_STEP),
            ],
            NPROC,
            launcher_flags=["--max-restarts=1"],
        )
        self.assertEqual(result.returncode, 0, result)
        # Attempt 0 lost rank 1 after step 250; attempt 1 went on from the step-200 checkpoint.
        self.assertIn(
            f"[1]:dlrun-train: --fail-at-step {FAIL_AT_STEP}: rank 1 exits with code 1",
            result.stderr,
            result,
        )
        self.assertTrue(
            any("restarting, attempt 1 of 1" in line for line in result.dlrun_lines()), result
        )
        resumed = [
            line
            for line in result.stdout.splitlines()
            if line.startswith("[0]:resuming from checkpoint")
        ]
        self.assertEqual(len(resumed), 1, result)
        last_checkpoint = FAIL_AT_STEP // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        self.assertIn(f"step {last_checkpoint}", resumed[0])
        self.assertIn(f"{last_checkpoint * NPROC * 64} samples into it", resumed[0])

        got = summary(self, result)
        self.assertEqual(got["epochs"], EPOCHS, result)
        self.assertEqual(got["steps"], EPOCHS * STEPS_PER_EPOCH, result)  # none twice, none lost
        self.assertAlmostEqual(
            got["test_accuracy"],
            expected["test_accuracy"],
            delta=ACCURACY_POINTS,
            msg=f"{result}\nuninterrupted: {expected}",
        )
        # The end of the run is checkpointed too.
        self.assertIn(EPOCHS * STEPS_PER_EPOCH, checkpoints(checkpoint_dir))

    def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(self):
        common = [
            "--synthetic",
            "--epochs",
            "1",
            "--seed",
            "3",
            "--allreduce",
            "gloo",
            "--progress-every",
            "1000",
        ]

        straight = dumped_weights(self, common, 3, env=clean_env(PADDING=""))[0]
        for padding in PADDINGS:
            checkpoint_dir = os.path.join(temp_dir(self), f"checkpoints-{padding}")
            resumed, result, _ = dumped_weights(
                self,
                [*common, "--checkpoint-dir", checkpoint_dir, "--checkpoint-every", "20"]
                + ["--fail-at-step", "20"],
                3,
                ["--max-restarts=1"],
                clean_env(PADDING="x" * padding),
            )
            self.assertIn("[0]:resuming from checkpoint", result.stdout, result)
            self.assertTrue(
                resumed == straight, f"padding {padding}: the resumed weights differ\n{result}"
            )

    def test_checkpoints_in_memory_alone_resume_a_restarted_group(self):
        # --checkpoint-in-memory, every step, no directory: rank 1 fails after step 20 and the
        # restarted group resumes from step 20 out of the node's memory, ending with the weights
        # of an uninterrupted run; the memory goes with the job.
        common = [
            "--synthetic",
            "--epochs",
            "1",
            "--max-steps",
            "40",
            "--seed",
            "3",
            "--allreduce",
            "gloo",
            "--progress-every",
            "1000",
        ]

        straight, _, job = dumped_weights(self, common, NPROC)
        self.assertEqual(memory_dirs(job.pid), [], "shared memory left after the job")
        resumed, result, job = dumped_weights(
            self,
            [*common, "--checkpoint-in-memory", "--checkpoint-every", "1", "--fail-at-step", "20"],
            NPROC,
            ["--max-restarts=1"],
        )
        self.assertEqual(memory_dirs(job.pid), [], "shared memory left after the job")
        self.assertIn(
            f"[0]:resuming from checkpoint: epoch 1, {20 * NPROC * 64} samples into it, step 20",
            result.stdout,
            result,
        )
        self.assertTrue(resumed == straight, f"the resumed weights differ\n{result}")

    def test_checkpoints_in_memory_need_dlrun(self):
        result = run_single(self, ["--synthetic", "--checkpoint-in-memory"])
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(
            result.stderr.strip(),
            "dlrun-train: error: --checkpoint-in-memory needs "
            "the node memory dlrun holds for the job (DLRUN_CHECKPOINT_SHM is not "
            "set): run under dlrun, or use --checkpoint-dir",
        )

    def test_sigusr1_checkpoints_and_stops_then_a_second_run_resumes(self):
        checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
        common = ["--epochs", "1", "--seed", str(SEED), "--checkpoint-dir", checkpoint_dir]
        job = TrainJob(self, [*common, "--progress-every", str(SIGNAL_AFTER_STEP)], NPROC)

        # Rank 0's first progress line: every rank has passed an all-reduce, so every rank is in
        # the training loop with its handlers installed.
        def trained_a_little():
            return f"[0]:epoch 1/1 step {SIGNAL_AFTER_STEP}/" in job.output()[0]

        wait_until(
            trained_a_little,
            SIGNAL_WAIT_S,
            f"rank 0 to report step {SIGNAL_AFTER_STEP}",
            proc=job.proc,
            on_timeout=job.describe,
        )
        job.signal(signal.SIGUSR1)
        result = job.wait()
        # dlrun exits 0 only when every worker did.
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual([line for line in result.dlrun_lines() if "fail" in line], [], result)
        stopped = summary(self, result)
        stopped_at = stopped["steps"]
        self.assertGreaterEqual(stopped_at, SIGNAL_AFTER_STEP, result)
        self.assertLess(stopped_at, STEPS_PER_EPOCH, result)  # stopped early, not at the end
        # The checkpoint is of the step the run stopped after.
        self.assertEqual(max(checkpoints(checkpoint_dir)), stopped_at, result)

        more = 10
        second = run_train(self, [*common, "--max-steps", str(stopped_at + more)], NPROC)
        self.assertEqual(second.returncode, 0, second)
        self.assertIn(
            f"[0]:resuming from checkpoint: epoch 1, "
            f"{stopped_at * NPROC * 64} samples into it, step {stopped_at}",
            second.stdout,
            second,
        )
        self.assertEqual(summary(self, second)["steps"], stopped_at + more, second)

    def test_a_sigterm_with_a_silent_peer_ends_the_rank_within_its_grace(self):
        job = TrainJob(
            self,
            ["--epochs", "1", "--seed", str(SEED), "--allreduce", "gloo"]
            + ["--progress-every", str(SIGNAL_AFTER_STEP)],
            NPROC,
            ["--stop-timeout=5"],
        )
        wait_until(
            lambda: f"[0]:epoch 1/1 step {SIGNAL_AFTER_STEP}/" in job.output()[0],
            SIGNAL_WAIT_S,
            f"rank 0 to report step {SIGNAL_AFTER_STEP}",
            proc=job.proc,
            on_timeout=job.describe,
        )
        ranks = {rank_of(pid): pid for pid in descendants(job.proc.pid) if runs_trainer(pid)}
        self.assertEqual(set(ranks), {0, 1}, ranks)
        os.kill(ranks[1], signal.SIGSTOP)  # silent: rank 0's next all-reduce waits on it
        self.addCleanup(lambda: runs_trainer(ranks[1]) and os.kill(ranks[1], signal.SIGCONT))
        os.kill(ranks[0], signal.SIGTERM)
        wait_until(
            lambda: not is_running(ranks[0]),
            STOP_GRACE_LIMIT_S,
            "rank 0 to end after its SIGTERM",
            on_timeout=job.describe,
        )
        os.kill(ranks[1], signal.SIGCONT)
        result = job.wait()
        self.assertNotEqual(result.returncode, 0, result)
        self.assertIn("rank 0 (local rank 0) ended with signal SIGTERM", result.stderr, result)

    def test_resuming_with_nothing_left_reports_the_model(self):
        # A run resumed at its --max-steps takes no further step and still reports the
        # accuracy of the model it resumed (not zeros).
        checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
        flags = [
            "--synthetic",
            "--epochs",
            "1",
            "--max-steps",
            "20",
            "--seed",
            str(SEED),
            "--checkpoint-dir",
            checkpoint_dir,
        ]
        first = run_single(self, flags)
        self.assertEqual(first.returncode, 0, first)
        again = run_single(self, flags)
        self.assertEqual(again.returncode, 0, again)
        self.assertIn("resuming from checkpoint", again.stdout, again)
        self.assertEqual(summary(self, again)["steps"], 20, again)
        self.assertEqual(
            summary(self, again)["test_accuracy"], summary(self, first)["test_accuracy"], again
        )
        self.assertEqual(sorted(checkpoints(checkpoint_dir)), [20])


if __name__ == "__main__":
    main()
