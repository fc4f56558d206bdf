"""Worker output: each console line prefixed `[rank]:` by default, --local-ranks-filter for the
console, and per-rank files <log-dir>/<run-id>_<8 random>/attempt_0/<local_rank>/{stdout,stderr}.log
with --redirects (files only) and --tee (files and console)."""

import os
import unittest

from dlrun_fixture import (
    PYTHON,
    clean_env,
    kill_recorded_workers,
    main,
    run_dlrun,
    temp_dir,
    worker,
)

OUTPUT_WORKER = worker("output_worker.py")
FAIL_WORKER = worker("fail_worker.py")


def stdout_lines(rank):
    return [f"out 1 of rank {rank}", f"out 2 of rank {rank}"]


def worker_lines(text):
    """Console lines that came from workers (dlrun's own start with 'dlrun:')."""
    return [line for line in text.splitlines() if not line.startswith("dlrun:")]


class DlrunOutputTest(unittest.TestCase):
    def run_workers(self, *flags, nproc=2):
        # OMP_NUM_THREADS is set so dlrun has nothing to say about it.
        result = run_dlrun(
            self,
            [f"--nproc-per-node={nproc}", *flags, PYTHON, OUTPUT_WORKER],
            env=clean_env(OMP_NUM_THREADS="1"),
        )
        self.assertEqual(result.returncode, 0, result)
        return result

    def assert_rank_shown(self, result, rank):
        out, err = worker_lines(result.stdout), worker_lines(result.stderr)
        for line in stdout_lines(rank) + [f"tail of rank {rank}"]:
            self.assertIn(f"[{rank}]:{line}", out, result)
        self.assertIn(f"[{rank}]:err 1 of rank {rank}", err, result)

    def run_id(self, result, rank):
        ids = {
            line.split()[-1]
            for line in worker_lines(result.stdout)
            if line.startswith(f"[{rank}]:run id ")
        }
        self.assertEqual(len(ids), 1, result)
        return ids.pop()

    def run_dir(self, log_dir, run_id=None):
        """The launch's one directory in log_dir, named as torchrun names it: RUN_ID_XXXXXXXX,
        made private (0700) as tempfile.mkdtemp makes it."""
        (name,) = os.listdir(log_dir)
        self.assertRegex(name, r"^(.+)_[a-z0-9_]{8}$")
        if run_id is not None:
            self.assertEqual(name[:-9], run_id)
        self.assertEqual(os.stat(os.path.join(log_dir, name)).st_mode & 0o777, 0o700)
        return os.path.join(log_dir, name)

    def read_log(self, run_dir, rank, stream, attempt=0):
        with open(os.path.join(run_dir, f"attempt_{attempt}", str(rank), f"{stream}.log")) as f:
            return f.read()

    def test_default_prefix_on_every_line(self):
        result = self.run_workers(nproc=3)
        for text in (result.stdout, result.stderr):
            for line in worker_lines(text):
                self.assertRegex(line, r"^\[[0-2]\]:", result)
                rank = line[1]
                # A rank's prefix only ever carries that rank's own text.
                self.assertTrue(line.endswith(f"rank {rank}") or "run id" in line, line)
        for rank in range(3):
            self.assert_rank_shown(result, rank)
        self.assertEqual(len(worker_lines(result.stdout)), 3 * 4, result)
        self.assertEqual(len(worker_lines(result.stderr)), 3 * 1, result)

    def test_local_rank_macro_in_arguments(self):
        # torchrun's ${local_rank} (and $local_rank, $$ for a dollar sign) in the arguments.
        result = run_dlrun(
            self,
            [
                "--nproc-per-node=2",
                "--no-python",
                "echo",
                "shard-${local_rank}",
                "$local_rank",
                "$$HOME",
            ],
            env=clean_env(OMP_NUM_THREADS="1"),
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(
            sorted(worker_lines(result.stdout)),
            ["[0]:shard-0 0 $HOME", "[1]:shard-1 1 $HOME"],
            result,
        )

    def test_prefix_template(self):
        result = self.run_workers(
            "--log-line-prefix-template", "${role_name}/${local_rank}|", "--role", "trainer"
        )
        self.assertIn("trainer/1|out 1 of rank 1", worker_lines(result.stdout), result)

    def test_local_ranks_filter(self):
        result = self.run_workers("--local-ranks-filter=1", nproc=3)
        self.assert_rank_shown(result, 1)
        for text in (result.stdout, result.stderr):
            for line in worker_lines(text):
                self.assertTrue(line.startswith("[1]:"), result)

    def test_redirects_to_files_only(self):
        log_dir = temp_dir(self)
        result = self.run_workers("--log-dir", log_dir, "--redirects=3")
        self.assertEqual(worker_lines(result.stdout), [], result)
        self.assertEqual(worker_lines(result.stderr), [], result)
        run_dir = self.run_dir(log_dir)
        run_id = os.path.basename(run_dir)[:-9]
        for rank in range(2):
            out = self.read_log(run_dir, rank, "stdout")
            self.assertEqual(
                out, "\n".join(stdout_lines(rank)) + f"\nrun id {run_id}\ntail of rank {rank}"
            )
            self.assertEqual(self.read_log(run_dir, rank, "stderr"), f"err 1 of rank {rank}\n")

    def test_redirects_for_one_rank(self):
        log_dir = temp_dir(self)
        result = self.run_workers("--log-dir", log_dir, "--redirects", "1:3")
        self.assert_rank_shown(result, 0)
        for text in (result.stdout, result.stderr):
            self.assertFalse(
                [line for line in worker_lines(text) if line.startswith("[1]:")], result
            )
        run_dir = self.run_dir(log_dir)
        self.assertIn("out 1 of rank 1\n", self.read_log(run_dir, 1, "stdout"))
        self.assertEqual(self.read_log(run_dir, 1, "stderr"), "err 1 of rank 1\n")

    def test_tee_wins_over_redirects(self):
        # As torchrun: a stream both redirected and teed is in the file and on the console.
        log_dir = temp_dir(self)
        result = self.run_workers("--log-dir", log_dir, "--redirects=3", "--tee=1")
        for rank in range(2):
            self.assertIn(f"[{rank}]:out 1 of rank {rank}", worker_lines(result.stdout), result)
            self.assertIn(
                f"out 1 of rank {rank}\n",
                self.read_log(self.run_dir(log_dir, self.run_id(result, rank)), rank, "stdout"),
            )
        self.assertEqual(worker_lines(result.stderr), [], result)  # stderr: redirected only

    def test_duplicate_filters_copy_matching_lines(self):
        # torchrun's --duplicate-*-filters: the matching console lines of every rank, with
        # their prefix, in the attempt's filtered_stdout.log/filtered_stderr.log.
        log_dir = temp_dir(self)
        result = self.run_workers(
            "--log-dir",
            log_dir,
            "--duplicate-stdout-filters",
            "out 1,tail",
            "--duplicate-stderr-filters=err",
        )
        attempt = os.path.join(self.run_dir(log_dir), "attempt_0")
        with open(os.path.join(attempt, "filtered_stdout.log")) as f:
            self.assertEqual(
                sorted(f.read().splitlines()),
                [
                    "[0]:out 1 of rank 0",
                    "[0]:tail of rank 0",
                    "[1]:out 1 of rank 1",
                    "[1]:tail of rank 1",
                ],
                result,
            )
        with open(os.path.join(attempt, "filtered_stderr.log")) as f:
            self.assertEqual(
                sorted(f.read().splitlines()),
                ["[0]:err 1 of rank 0", "[1]:err 1 of rank 1"],
                result,
            )
        self.assert_rank_shown(result, 0)  # the console is unchanged

    def test_tee_stdout(self):
        log_dir = temp_dir(self)
        result = self.run_workers("--log-dir", log_dir, "--tee=1")
        for rank in range(2):
            self.assert_rank_shown(result, rank)
            run_id = self.run_id(result, rank)
            self.assertRegex(run_id, r"^\S+$")
            out = self.read_log(self.run_dir(log_dir, run_id), rank, "stdout")
            self.assertEqual(
                out, "\n".join(stdout_lines(rank)) + f"\nrun id {run_id}\ntail of rank {rank}"
            )
            # No prefixes in the files: they hold what the worker wrote.
            self.assertNotIn("[", out)

    def test_each_attempt_has_its_own_logs(self):
        log_dir, out = temp_dir(self), temp_dir(self)
        self.addCleanup(kill_recorded_workers, out)
        # Rank 1 fails with exit 3 on attempt 0 only; attempt 1 succeeds.
        result = run_dlrun(
            self,
            [
                "--nproc-per-node=2",
                "--max-restarts=1",
                "--log-dir",
                log_dir,
                "--redirects=3",
                PYTHON,
                FAIL_WORKER,
                out,
                "fail-first",
                "1",
                "3",
            ],
            env=clean_env(OMP_NUM_THREADS="1"),
        )
        self.assertEqual(result.returncode, 0, result)
        run_dir = self.run_dir(log_dir)
        self.assertEqual(sorted(os.listdir(run_dir)), ["attempt_0", "attempt_1"])
        first = self.read_log(run_dir, 1, "stderr")
        self.assertIn("last words of rank 1", first)
        self.assertEqual(first.count("failing now"), 1)
        self.assertNotIn("failing now", self.read_log(run_dir, 1, "stderr", attempt=1))

    def test_a_second_launch_under_the_same_id_keeps_the_first_ones_logs(self):
        log_dir = temp_dir(self)
        for word in ("first", "second"):
            result = run_dlrun(
                self,
                [
                    "--nproc-per-node=1",
                    "--rdzv-id=same",
                    "--log-dir",
                    log_dir,
                    "--redirects=1",
                    "--no-python",
                    "/bin/echo",
                    word,
                ],
                env=clean_env(OMP_NUM_THREADS="1"),
            )
            self.assertEqual(result.returncode, 0, result)
        runs = sorted(os.listdir(log_dir))
        self.assertEqual(len(runs), 2, runs)
        texts = set()
        for name in runs:
            self.assertRegex(name, r"^same_[a-z0-9_]{8}$")
            with open(os.path.join(log_dir, name, "attempt_0", "0", "stdout.log")) as f:
                texts.add(f.read())
        self.assertEqual(texts, {"first\n", "second\n"})


if __name__ == "__main__":
    main()
