"""--hang-timeout on one node, with workers that know nothing of dlrun but its heartbeat file.

- A shell worker writes step numbers to DLRUN_HEARTBEAT_FILE, then stops: under
  --hang-action=exit dlrun names it (its last step too) and the job ends with exit 124.
- A worker that never reports progress is never called hung, however long it is quiet.
- --hang-action=report: the hang is reported and the job keeps running; once the worker goes
  on, the job ends with exit 0.
- An unmodified torch gloo job (it only writes its step to the heartbeat file) whose rank 1
  sleeps before an all_reduce: the other ranks' stacks show them waiting in all_reduce, and the
  summary names rank 1, in its sleeping frame, as the suspect.
"""

import glob
import os
import re
import unittest

from dlrun_fixture import PYTHON, Dlrun, main, run_dlrun, temp_dir, wait_until, worker

HANG_TIMEOUT = "1"
EVENT_TIMEOUT_S = 30
HANG_EXIT_CODE = 124


class HangTest(unittest.TestCase):
    def sh(self, script, *flags, nproc=1):
        return [
            f"--nproc-per-node={nproc}",
            "--standalone",
            f"--hang-timeout={HANG_TIMEOUT}",
            *flags,
            "/bin/sh",
            "-c",
            script,
        ]

    def test_a_worker_that_stops_writing_its_heartbeat_is_hung(self):
        # Steps 1..3, then silence (the sleep stands for a stuck program).
        script = 'for s in 1 2 3; do echo $s > "$DLRUN_HEARTBEAT_FILE"; done; exec sleep 300'
        result = run_dlrun(self, self.sh(script, "--hang-action=exit"), timeout=EVENT_TIMEOUT_S)
        self.assertEqual(result.returncode, HANG_EXIT_CODE, result)
        self.assertTrue(
            any(
                re.match(
                    r"dlrun: hang: rank 0 made no progress for [0-9.]+ s after "
                    r"step 3 \(--hang-timeout\)",
                    line,
                )
                for line in result.dlrun_lines()
            ),
            result,
        )
        self.assertRegex(result.stderr, r"suspect: rank 0 on this node, last step 3, silent")
        # The root-cause report at the end names the hang.
        self.assertTrue(
            any(
                line.startswith("dlrun: hang: rank 0 made no progress")
                and "stacks of every rank are in" in line
                for line in result.dlrun_lines()
            ),
            result,
        )

    def test_a_worker_that_never_reports_progress_is_not_hung(self):
        # Quiet for three timeouts, and it never touched its heartbeat file.
        result = run_dlrun(self, self.sh("sleep 3"), timeout=EVENT_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)
        self.assertNotIn("hang", result.stderr, result)

    def test_report_only_keeps_the_job_running(self):
        go = os.path.join(temp_dir(self), "go")
        script = (
            'echo 1 > "$DLRUN_HEARTBEAT_FILE"; '
            f"while [ ! -e {go} ]; do sleep 0.05; done; "
            'echo 2 > "$DLRUN_HEARTBEAT_FILE"'
        )
        dlrun = Dlrun(self, self.sh(script, "--hang-action=report"))
        wait_until(
            lambda: "the job goes on (--hang-action=report)" in dlrun.output()[1],
            EVENT_TIMEOUT_S,
            "the hang report",
            proc=dlrun.proc,
            on_timeout=dlrun.describe,
        )
        self.assertIsNone(dlrun.proc.poll(), dlrun.describe())  # still running
        with open(go, "w"):
            pass
        result = dlrun.wait(EVENT_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(
            len([line for line in result.dlrun_lines() if line.startswith("dlrun: hang: rank 0")]),
            1,
            result,
        )
        self.assertNotIn("restarting", result.stderr, result)

    def test_a_torch_rank_sleeping_before_all_reduce_is_the_suspect(self):
        log_dir = os.path.join(temp_dir(self), "logs")
        result = run_dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=3",
                "--hang-timeout=2",
                "--hang-action=exit",
                f"--log-dir={log_dir}",
                PYTHON,
                worker("hang_gloo_worker.py"),
                "1",
                "5",
            ],
            timeout=90,
        )
        self.assertEqual(result.returncode, HANG_EXIT_CODE, result)
        self.assertRegex(
            result.stderr,
            r"suspect: rank 1 on this node, last step 5, silent "
            r"[0-9.]+ s, not in a collective\n    "
            r"stuck_before_all_reduce",
        )
        for rank in (0, 2):
            self.assertRegex(
                result.stderr,
                rf"rank {rank} on this node, last step 5, silent "
                rf"[0-9.]+ s, waiting in all_reduce",
            )
        stacks = {
            int(re.search(r"rank_(\d+)\.txt$", path).group(1)): path
            for path in glob.glob(os.path.join(log_dir, "*", "attempt_0", "stacks", "rank_*.txt"))
        }
        self.assertEqual(sorted(stacks), [0, 1, 2], result)
        for rank, path in stacks.items():
            with open(path) as f:
                text = f.read()
            if rank == 1:
                self.assertIn("stuck_before_all_reduce", text)
            else:
                self.assertIn("waiting in: all_reduce", text)
                self.assertIn("all_reduce (distributed_c10d.py", text)

    def test_hang_action_without_a_timeout_is_one_line(self):
        result = run_dlrun(self, ["--standalone", "--hang-action=exit", "/bin/true"])
        self.assertEqual(result.returncode, 2, result)
        self.assertIn("--hang-action needs --hang-timeout", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result)


if __name__ == "__main__":
    main()
