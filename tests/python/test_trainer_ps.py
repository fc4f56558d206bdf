"""The trainer's parameter-server strategy (dlrun --roles ps:P,worker:W train --strategy ps).

- Async (the default), 1 ps and 2 workers: at least 0.86 test accuracy in 3 epochs (issue 16;
  seeds 1-5 end at 0.865-0.869 since a worker computes its gradient at the parameters predicted
  for its push, 0.858-0.861 before; --strategy allreduce with 2 workers ends at 0.869); the
  summary says the strategy and every process its bytes sent and received.
- --ps-sync at a fixed seed ends with the weights of --strategy allreduce (the same data, the
  same averaged gradient) within 1e-5; async ends elsewhere (the check has teeth). With the
  default math (AVX2 where the CPU has it): its results no longer hang on where each program's
  heap puts the buffers.
- A worker SIGKILLed mid-run comes back alone while the chief trains on (same process, its
  step count rising), and the run ends at the accuracy bar. A ps SIGKILLed ends the attempt;
  the job resumes from the chief's checkpoint and finishes.
- Bad input: --strategy ps without a ps, more servers than parameters, a role string that does
  not parse: one line and exit 2.
"""

import json
import os
import re
import signal
import subprocess
import unittest

from dlrun_fixture import Dlrun, clean_env, main, run_dlrun, temp_dir, wait_until
from trainer_fixture import (
    SINGLE_TIMEOUT_S,
    TrainJob,
    chief_summary,
    descendants,
    max_abs_difference,
    read_floats,
    require_data,
    run_train,
    train_binary,
)

ACCURACY_BAR = 0.86
SYNC_STEPS = 100
TOLERANCE = 1e-5
PROGRESS_WAIT_S = 90


class PsJob(TrainJob):
    """`dlrun --standalone --roles ROLES [flags] train --strategy ps [trainer flags]`."""

    def __init__(self, test, roles, trainer_args, launcher_flags=()):
        Dlrun.__init__(
            self,
            test,
            [
                "--standalone",
                f"--roles={roles}",
                *launcher_flags,
                "train",
                "--strategy",
                "ps",
                *trainer_args,
            ],
        )


def progress_steps(text):
    """The chief's progress lines' step numbers within their epoch, with the epoch."""
    return [(int(e), int(s)) for e, s in re.findall(r"\[\d+\]:epoch (\d+)/\d+ step (\d+)/", text)]


def role_process(job, role, role_rank):
    """The pid of the trainer process with ROLE_NAME `role` and ROLE_RANK `role_rank`."""
    for pid in descendants(job.proc.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if (
            env.get(b"ROLE_NAME") == role.encode()
            and env.get(b"ROLE_RANK") == str(role_rank).encode()
            and os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(train_binary())
        ):
            return pid
    return None


def traffic_lines(result):
    lines = []
    for line in result.stdout.splitlines():
        text = line.split(":", 1)[1] if line.startswith("[") else line
        if text.startswith("{") and '"role"' in text:
            lines.append(json.loads(text))
    return lines


class TrainerPsTest(unittest.TestCase):
    def setUp(self):
        require_data(self)

    def test_async_reaches_the_bar_in_three_epochs_and_reports_traffic(self):
        job = PsJob(self, "ps:1,worker:2", ["--epochs", "3", "--progress-every", "1000"])
        result = job.wait()
        self.assertEqual(result.returncode, 0, result)
        report = self.chief_summary(result)
        self.assertEqual(report["strategy"], "ps")
        self.assertGreaterEqual(report["test_accuracy"], ACCURACY_BAR, result)
        self.assertGreater(report["bytes_sent"], 0)
        self.assertGreater(report["bytes_received"], 0)
        others = traffic_lines(result)
        self.assertEqual(sorted(o["role"] for o in others), ["ps", "worker"], result)
        for other in others:
            self.assertEqual(other["strategy"], "ps")
            self.assertGreater(other["bytes_sent"], 0)
            self.assertGreater(other["bytes_received"], 0)

    def chief_summary(self, result):
        return chief_summary(self, result)

    def sync_weights(self, strategy_args, roles=None):
        path = os.path.join(temp_dir(self), "weights")
        args = [
            "--epochs",
            "1",
            "--max-steps",
            str(SYNC_STEPS),
            "--seed",
            "7",
            "--dump-weights",
            path,
        ]
        if roles:
            result = PsJob(self, roles, [*args, *strategy_args]).wait()
        else:
            result = run_train(self, args, 2)
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(self.chief_summary(result)["steps"], SYNC_STEPS, result)
        return read_floats(path)

    def test_sync_steps_match_allreduce(self):
        allreduce = self.sync_weights([])
        sync = self.sync_weights(["--ps-sync"], roles="ps:2,worker:2")
        self.assertLessEqual(max_abs_difference(allreduce, sync), TOLERANCE)
        asynchronous = self.sync_weights([], roles="ps:2,worker:2")
        self.assertGreater(max_abs_difference(allreduce, asynchronous), 100 * TOLERANCE)

    def test_a_killed_worker_restarts_alone_while_the_chief_trains_on(self):
        # One epoch more than the undisturbed run: the killed worker's pushes in flight are
        # lost and its replacement starts from the servers' parameters, which cost an async run
        # about as much accuracy as the undisturbed one has above the bar (0.858 in 3 epochs
        # once, on cores at half pace).
        job = PsJob(
            self,
            "ps:1,worker:2:alone",
            ["--epochs", "4", "--progress-every", "50"],
            ["--max-restarts=1"],
        )
        wait_until(
            lambda: len(progress_steps(job.output()[0])) >= 4,
            PROGRESS_WAIT_S,
            "the chief to report progress",
            proc=job.proc,
            on_timeout=job.describe,
        )
        chief, victim = role_process(job, "worker", 0), role_process(job, "worker", 1)
        self.assertIsNotNone(chief)
        self.assertIsNotNone(victim)
        os.kill(victim, signal.SIGKILL)
        seen = len(progress_steps(job.output()[0]))
        wait_until(
            lambda: "restarted alone" in job.output()[1],
            PROGRESS_WAIT_S,
            "dlrun to restart the worker",
            proc=job.proc,
            on_timeout=job.describe,
        )
        # The chief never stopped: the same process reports more steps.
        wait_until(
            lambda: len(progress_steps(job.output()[0])) >= seen + 2,
            PROGRESS_WAIT_S,
            "the chief's steps to keep rising",
            proc=job.proc,
            on_timeout=job.describe,
        )
        self.assertEqual(role_process(job, "worker", 0), chief)
        result = job.wait()
        self.assertEqual(result.returncode, 0, result)
        self.assertNotIn("resuming from checkpoint", result.stdout)
        self.assertGreaterEqual(self.chief_summary(result)["test_accuracy"], ACCURACY_BAR, result)

    def test_a_killed_server_ends_the_attempt_and_the_job_resumes_from_the_checkpoint(self):
        checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
        job = PsJob(
            self,
            "ps:1,worker:2:alone",
            [
                "--epochs",
                "2",
                "--progress-every",
                "50",
                "--checkpoint-dir",
                checkpoint_dir,
                "--checkpoint-every",
                "100",
            ],
            ["--max-restarts=1"],
        )
        wait_until(
            lambda: any(step >= 250 for _, step in progress_steps(job.output()[0])),
            PROGRESS_WAIT_S,
            "the chief to pass step 250",
            proc=job.proc,
            on_timeout=job.describe,
        )
        os.kill(role_process(job, "ps", 0), signal.SIGKILL)
        result = job.wait()
        self.assertEqual(result.returncode, 0, result)
        self.assertTrue(
            any("restarting, attempt 1 of 1" in line for line in result.dlrun_lines()), result
        )
        self.assertIn("resuming from checkpoint", result.stdout)
        report = self.chief_summary(result)
        self.assertEqual(report["epochs"], 2, result)
        self.assertGreaterEqual(report["test_accuracy"], 0.84, result)

    def test_bad_input_is_one_line_and_exit_2(self):
        no_ps = run_train(self, ["--strategy", "ps", "--epochs", "1"], 2)
        self.assertEqual(no_ps.returncode, 2, no_ps)
        self.assertIn("--strategy ps: the job has no ps process", no_ps.stderr)

        bad_roles = run_dlrun(
            self, ["--standalone", "--roles=ps:x,worker:2", "train", "--strategy", "ps"]
        )
        self.assertEqual(bad_roles.returncode, 2, bad_roles)
        self.assertEqual(len(bad_roles.stderr.strip().splitlines()), 1, bad_roles)
        self.assertIn("--roles 'ps:x,worker:2'", bad_roles.stderr)

        # More servers than the 805 parameters of --hidden 1: the worker refuses at once.
        servers = [f"127.0.0.1:{10000 + i}" for i in range(806)]
        tf_config = json.dumps(
            {
                "cluster": {"ps": servers, "worker": ["127.0.0.1:9999"]},
                "task": {"type": "worker", "index": 0},
            }
        )
        env = clean_env(
            RANK="806",
            WORLD_SIZE="807",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="1",
            TF_CONFIG=tf_config,
        )
        done = subprocess.run(
            [train_binary(), "--strategy", "ps", "--hidden", "1"],
            env=env,
            capture_output=True,
            timeout=SINGLE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        stderr = done.stderr.decode()
        self.assertEqual(done.returncode, 2, stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("806 parameter servers for 805 parameters", stderr)


if __name__ == "__main__":
    main()
