"""A failing worker stops the others; the group restarts while --max-restarts allows; when
none are left dlrun reports the root cause (rank, exit code or signal, error file, last stderr
lines) and exits with the failed worker's code (128 + signal for a signal)."""

import os
import re
import signal
import unittest

from dlrun_fixture import (
    PYTHON,
    is_running,
    kill_recorded_workers,
    main,
    read_json,
    run_dlrun,
    temp_dir,
    wait_until,
    worker,
)

FAIL_WORKER = worker("fail_worker.py")
NPROC = 2
FAILING_RANK = 1


class DlrunRestartTest(unittest.TestCase):
    def run_failing(self, mode, arg="", *flags, nproc=NPROC, failing_rank=FAILING_RANK):
        out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, out)  # runs before the directory is removed
        result = run_dlrun(
            self,
            [
                f"--nproc-per-node={nproc}",
                *flags,
                PYTHON,
                FAIL_WORKER,
                out,
                mode,
                str(failing_rank),
                arg,
            ],
        )
        return out, result

    def attempts(self, out):
        """{(attempt, rank): record} of every attempt_<k>_rank_<r>.json the workers wrote."""
        seen = {}
        for name in os.listdir(out):
            m = re.fullmatch(r"attempt_(\d+)_rank_(\d+)\.json", name)
            if m:
                seen[(int(m.group(1)), int(m.group(2)))] = read_json(os.path.join(out, name))
        return seen

    def assert_report_names_rank(self, result, rank):
        report = "\n".join(result.dlrun_lines())
        self.assertRegex(report, rf"\brank {rank}\b", result)
        return report

    def test_restart_after_a_failure_succeeds(self):
        out, result = self.run_failing("fail-first", "3", "--max-restarts=1")
        self.assertEqual(result.returncode, 0, result)
        seen = self.attempts(out)
        self.assertEqual(sorted(seen), [(0, 0), (0, 1), (1, 0), (1, 1)], result)
        for (attempt, rank), env in seen.items():
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], str(attempt))
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "1")
            self.assertEqual(env["RANK"], str(rank))
        # One run: the id stays; each attempt gets its own error files.
        self.assertEqual(len({env["TORCHELASTIC_RUN_ID"] for env in seen.values()}), 1)
        self.assertNotEqual(
            seen[(0, 1)]["TORCHELASTIC_ERROR_FILE"], seen[(1, 1)]["TORCHELASTIC_ERROR_FILE"]
        )

    def test_restarts_run_out(self):
        out, result = self.run_failing("exit", "3", "--max-restarts=2")
        self.assertEqual(result.returncode, 3, result)
        self.assertEqual(
            sorted(self.attempts(out)), [(a, r) for a in range(3) for r in range(NPROC)], result
        )
        self.assert_report_names_rank(result, FAILING_RANK)

    def test_the_no_restart_exit_code_ends_the_job_without_restarts_left_unused(self):
        out, result = self.run_failing(
            "exit", "93", "--max-restarts=3", "--no-restart-exit-code=93"
        )
        self.assertEqual(result.returncode, 93, result)
        self.assertEqual(sorted(self.attempts(out)), [(0, 0), (0, 1)], result)
        self.assertIn(
            "dlrun: rank 1 exited with 93, --no-restart-exit-code: the job ends without a restart",
            result.stderr,
        )
        # Another code restarts as before.
        out, result = self.run_failing("exit", "3", "--max-restarts=1", "--no-restart-exit-code=93")
        self.assertEqual(result.returncode, 3, result)
        self.assertEqual(len(self.attempts(out)), 2 * NPROC, result)

    def test_no_restarts_exits_with_the_workers_code(self):
        # Rank 0 would wait 60 s: dlrun must stop it to finish in time.
        out, result = self.run_failing("fail-first", "3", "--max-restarts=0")
        self.assertEqual(result.returncode, 3, result)
        self.assertEqual(sorted(self.attempts(out)), [(0, 0), (0, 1)], result)
        report = self.assert_report_names_rank(result, FAILING_RANK)
        self.assertIn("exit code 3", report)
        # The last lines of the failed rank's stderr are in the report.
        self.assertIn(f"last words of rank {FAILING_RANK}", report)
        self.assertIn("failing now", report)

    def test_report_keeps_stderr_the_console_did_not_show(self):
        log_dir = temp_dir(self)
        for flags in (["--local-ranks-filter=0"], ["--log-dir", log_dir, "--redirects=3"]):
            with self.subTest(flags=flags):
                _, result = self.run_failing("exit", "3", *flags)
                self.assertEqual(result.returncode, 3, result)
                report = self.assert_report_names_rank(result, FAILING_RANK)
                self.assertIn(f"last words of rank {FAILING_RANK}", report)

    def test_worker_killed_by_a_signal(self):
        for name, number in (("SIGSEGV", signal.SIGSEGV), ("SIGKILL", signal.SIGKILL)):
            with self.subTest(signal=name):
                _, result = self.run_failing("signal", name)
                self.assertEqual(result.returncode, 128 + number, result)
                report = self.assert_report_names_rank(result, FAILING_RANK)
                self.assertIn(name, report)

    def test_error_file_message_is_in_the_report(self):
        message = "ValueError: the learning rate 1e9 is too high"
        _, result = self.run_failing("error-file", message)
        self.assertEqual(result.returncode, 1, result)
        report = self.assert_report_names_rank(result, FAILING_RANK)
        self.assertIn(message, report)

    def test_unreadable_error_file_still_gives_the_report(self):
        # Whatever a worker leaves at its error file's path, the worker's own exit decides.
        _, result = self.run_failing("error-dir", "3")
        self.assertEqual(result.returncode, 3, result)
        report = self.assert_report_names_rank(result, FAILING_RANK)
        self.assertIn("last words of rank 1", report)

    def test_torch_record_error_file(self):
        message = "the data loader ran dry"
        _, result = self.run_failing("record", message)
        self.assertEqual(result.returncode, 1, result)
        report = self.assert_report_names_rank(result, FAILING_RANK)
        self.assertIn(f"RuntimeError: {message}", report)

    def assert_grandchildren_gone(self, out, count, result):
        pids = []
        for name in os.listdir(out):
            if name.startswith("grandchild_"):
                with open(os.path.join(out, name)) as f:
                    pids.append(int(f.read()))
        try:
            self.assertEqual(len(pids), count, result)
            wait_until(
                lambda: not any(is_running(pid) for pid in pids),
                2,
                f"the workers' children {pids} to be gone",
            )
        finally:
            for pid in pids:
                if is_running(pid):
                    os.kill(pid, signal.SIGKILL)

    def test_failed_workers_children_are_stopped(self):
        out, result = self.run_failing("grandchild", "", nproc=1, failing_rank=0)
        self.assertEqual(result.returncode, 1, result)
        self.assert_grandchildren_gone(out, 1, result)

    def test_the_children_of_a_worker_restarted_alone_are_stopped_too(self):
        out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, out)
        result = run_dlrun(
            self,
            [
                "--roles",
                "steady:1,flaky:1:alone",
                "--max-restarts=1",
                PYTHON,
                FAIL_WORKER,
                out,
                "grandchild",
                "1",
            ],
        )
        self.assertEqual(result.returncode, 1, result)
        self.assertTrue(any("restarted alone" in line for line in result.dlrun_lines()), result)
        self.assert_grandchildren_gone(out, 2, result)


if __name__ == "__main__":
    main()
