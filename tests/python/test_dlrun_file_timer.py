"""torch's file-based timer under dlrun: with TORCHELASTIC_ENABLE_FILE_TIMER=1 the agent serves
the FIFO that torch's FileTimerClient and expires() write to (TORCHELASTIC_TIMER_FILE), a block
that overruns its timer gets the worker killed as torch's agent would (SIGKILL, torch's default),
and the report names the timer; a block that ends in time changes nothing.

A worker that cannot reach a timer server fails at once (torch's client raises BrokenPipeError,
exit 1), so neither a SIGKILL exit nor a clean exit can come from a missing server."""

import os
import signal
import time
import unittest

from dlrun_fixture import (
    EVENT_TIMEOUT_S,
    PYTHON,
    Dlrun,
    clean_env,
    is_running,
    kill_recorded_workers,
    main,
    read_json,
    run_dlrun,
    temp_dir,
    wait_until,
    worker,
)

TIMER_WORKER = worker("timer_worker.py")
NPROC = 2
SLOW_RANK = 1
TIMER_S = 1  # the worker's expires(after=1)
KILLED_WITHIN_S = 5  # the timer, the agent's 0.1 s checks and a loaded machine


class DlrunFileTimerTest(unittest.TestCase):
    def out_dir(self):
        out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, out)  # runs before the directory is removed
        return out

    def records(self, out):
        return [read_json(os.path.join(out, f"rank_{r}.json")) for r in range(NPROC)]

    def test_an_overrunning_block_is_killed_and_named(self):
        out = self.out_dir()
        launcher = Dlrun(
            self,
            [
                "--standalone",
                f"--nproc-per-node={NPROC}",
                PYTHON,
                TIMER_WORKER,
                out,
                "overrun",
                str(SLOW_RANK),
            ],
            env=clean_env(TORCHELASTIC_ENABLE_FILE_TIMER="1"),
        )
        entered = os.path.join(out, f"entering_{SLOW_RANK}")
        wait_until(
            lambda: os.path.exists(entered),
            EVENT_TIMEOUT_S,
            f"rank {SLOW_RANK} to enter its block",
            proc=launcher.proc,
            on_timeout=launcher.describe,
        )
        entered_at = time.monotonic()
        slow = read_json(os.path.join(out, f"rank_{SLOW_RANK}.json"))
        launcher.watch_workers([slow["pid"]])
        wait_until(
            lambda: not is_running(slow["pid"]),
            KILLED_WITHIN_S,
            f"rank {SLOW_RANK} (pid {slow['pid']}) to be killed",
            on_timeout=launcher.describe,
        )
        killed_after = time.monotonic() - entered_at
        result = launcher.wait()

        self.assertEqual(result.returncode, 128 + signal.SIGKILL, result)
        self.assertFalse(os.path.exists(os.path.join(out, f"survived_{SLOW_RANK}")), result)
        # Not before the timer's deadline: the timer, not something else, ended it.
        self.assertGreaterEqual(killed_after, TIMER_S * 0.8, result)
        self.assertTrue(slow["is_fifo"], slow)
        self.assertIn(
            f"dlrun: rank {SLOW_RANK} (pid {slow['pid']}): timer 'slow_block' expired;"
            " sending SIGKILL",
            result.dlrun_lines(),
            result,
        )
        report = "\n".join(result.dlrun_lines())
        self.assertRegex(
            report,
            rf"worker failed: rank {SLOW_RANK} \(local rank {SLOW_RANK}\) "
            r"ended with signal SIGKILL",
            result,
        )
        self.assertRegex(
            report,
            r"dlrun: timer 'slow_block' expired at \d{4}-\d\d-\d\d "
            r"[0-9:.]+ UTC; dlrun sent SIGKILL to pid "
            rf"{slow['pid']}",
            result,
        )
        # The only timer that expired is the one that overran.
        self.assertNotIn("quick_block", result.stderr, result)
        # The FIFO lived in dlrun's temporary log root, removed at the end.
        self.assertFalse(os.path.exists(slow["timer_file"]), slow)

    def test_a_block_that_ends_in_time_changes_nothing(self):
        out = self.out_dir()
        # A path the user chose is used, as torch's agent uses it.
        fifo = os.path.join(temp_dir(self), "my-timer")
        result = run_dlrun(
            self,
            ["--standalone", f"--nproc-per-node={NPROC}", PYTHON, TIMER_WORKER, out, "in-time"],
            env=clean_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=fifo),
        )
        self.assertEqual(result.returncode, 0, result)
        for record in self.records(out):
            self.assertEqual(record["timer_file"], fifo, record)
            self.assertTrue(record["is_fifo"], record)
        self.assertNotIn("expired", result.stderr, result)
        self.assertFalse(os.path.exists(fifo), "the FIFO is removed when dlrun ends")

    def test_a_path_that_is_not_a_fifo_is_refused_before_any_worker_starts(self):
        out = self.out_dir()
        taken = os.path.join(temp_dir(self), "taken")
        with open(taken, "w") as f:
            f.write("someone's data")
        result = run_dlrun(
            self,
            ["--standalone", "--nproc-per-node=1", PYTHON, TIMER_WORKER, out, "env"],
            env=clean_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=taken),
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.dlrun_lines()), 1, result)
        self.assertIn(taken, result.dlrun_lines()[0], result)
        self.assertEqual(os.listdir(out), [], "no worker started")
        with open(taken) as f:
            self.assertEqual(f.read(), "someone's data")

    def test_no_timer_unless_enabled(self):
        out = self.out_dir()
        result = run_dlrun(
            self, ["--standalone", f"--nproc-per-node={NPROC}", PYTHON, TIMER_WORKER, out, "env"]
        )
        self.assertEqual(result.returncode, 0, result)
        for record in self.records(out):
            self.assertIsNone(record["timer_file"], record)


if __name__ == "__main__":
    main()
