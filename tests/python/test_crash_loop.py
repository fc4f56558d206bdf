"""Crash loops (issue 57; agents/crash_loop.h): failed attempts in a row without the job's step
advancing end the job with --no-restart-exit-code's code (93 unless set) instead of another
restart, and dlrun says why in one line; a job whose step advances keeps its restarts.

Runs under torch 2.13's interpreter (ctest: python_crash_loop); the worker reports its steps
through dlrun.progress.
"""

import glob
import os
import subprocess
import unittest

from dlrun_fixture import PYTHON, binary_from_env, clean_env, temp_dir

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "crash_worker.py")
TIMEOUT_S = 120


class CrashLoopTest(unittest.TestCase):
    def run_job(self, plan, *flags):
        out = temp_dir(self)
        done = subprocess.run(
            [
                binary_from_env("DLRUN", "dlrun"),
                "--standalone",
                "--nproc-per-node=1",
                *flags,
                PYTHON,
                WORKER,
                out,
                plan,
            ],
            env=clean_env(TMPDIR=out),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        attempts = len(glob.glob(os.path.join(out, "attempt_*")))
        return done.returncode, attempts, done.stderr

    def test_attempts_that_never_get_past_a_step_end_the_job_with_93(self):
        code, attempts, err = self.run_job("5", "--max-restarts=10", "--crash-loop-attempts=3")
        self.assertEqual((code, attempts), (93, 4), err)  # the first got to 5: then 3 did not
        self.assertIn(
            "dlrun: a crash loop: the last 3 attempts ended without a step past 5 "
            "(the last: rank 0, exit code 1); the job ends with 93 instead of a "
            "restart (--crash-loop-attempts)",
            err,
        )

    def test_without_reports_attempts_that_die_young_are_a_loop(self):
        code, attempts, err = self.run_job(
            "-", "--max-restarts=10", "--crash-loop-attempts=2", "--no-restart-exit-code=77"
        )
        self.assertEqual((code, attempts), (77, 2), err)
        self.assertIn("dlrun: a crash loop: the last 2 attempts ended within ", err)
        self.assertIn(
            " s of their start, no step reported (the last: rank 0, exit code 1); "
            "the job ends with 77",
            err,
        )

    def test_a_job_whose_step_advances_keeps_its_restarts(self):
        code, attempts, err = self.run_job("1,2,3,4", "--max-restarts=3", "--crash-loop-attempts=2")
        self.assertEqual((code, attempts), (1, 4), err)
        self.assertNotIn("crash loop", err)

    def test_off_by_default(self):
        code, attempts, err = self.run_job("5", "--max-restarts=3")
        self.assertEqual((code, attempts), (1, 4), err)
        self.assertNotIn("crash loop", err)


if __name__ == "__main__":
    unittest.main()
