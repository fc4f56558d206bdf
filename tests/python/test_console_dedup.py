"""Identical lines printed once (issue 58; agents/console_dedup.h), on one node: the same line
of several ranks shown once with their ranks ("[0-7]: ..."), lines that differ each shown, each
rank's own order kept; on by default from 8 workers, off with --console-dedup=off, never under
--console-format=torchrun, refused with a prefix of the user's.

Runs under any Python 3 (ctest: python_console_dedup); the workers are plain Python.
"""

import glob
import os
import re
import subprocess
import sys
import unittest

from dlrun_fixture import binary_from_env, clean_env, temp_dir

TIMEOUT_S = 120
WORKER = """
import os
rank = os.environ["RANK"]
print("loading data", flush=True)
print("rank", rank, "has its own line", flush=True)
print("epoch 1 done", flush=True)
"""


class ConsoleDedupTest(unittest.TestCase):
    def run_job(self, nproc, *flags, code=WORKER, out=None):
        """dlrun running `code` (a Python worker) on `nproc` workers, in `out` (a new temporary
        directory by default)."""
        out = out or temp_dir(self)
        worker = os.path.join(out, "worker.py")
        with open(worker, "w") as f:
            f.write(code)
        return subprocess.run(
            [
                binary_from_env("DLRUN", "dlrun"),
                "--standalone",
                f"--nproc-per-node={nproc}",
                *flags,
                sys.executable,
                worker,
            ],
            env=clean_env(TMPDIR=out),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )

    def test_eight_ranks_lines_are_shown_once_each_ranks_order_kept(self):
        # A window long enough for every worker to start on a loaded machine.
        done = self.run_job(8, "--console-dedup-window=10")
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertEqual(lines.count("[0-7]:loading data"), 1, done.stdout)
        self.assertEqual(lines.count("[0-7]:epoch 1 done"), 1, done.stdout)
        self.assertEqual(len(lines), 2 + 8, done.stdout)
        for rank in range(8):
            own = lines.index(f"[{rank}]:rank {rank} has its own line")
            self.assertLess(lines.index("[0-7]:loading data"), own)
            self.assertLess(own, lines.index("[0-7]:epoch 1 done"))

    def test_off_shows_every_ranks_line(self):
        done = self.run_job(8, "--console-dedup=off")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(
            sorted(line for line in done.stdout.splitlines() if "loading" in line),
            [f"[{rank}]:loading data" for rank in range(8)],
        )

    def test_below_eight_workers_it_is_off_unless_asked(self):
        done = self.run_job(2)
        self.assertEqual(
            sorted(re.findall(r"\[.*\]:loading data", done.stdout)),
            ["[0]:loading data", "[1]:loading data"],
        )
        done = self.run_job(2, "--console-dedup=on", "--console-dedup-window=10")
        self.assertEqual(re.findall(r"\[.*\]:loading data", done.stdout), ["[0-1]:loading data"])

    def test_a_line_longer_than_64_kib_is_cut_with_a_mark_and_kept_whole_in_its_file(self):
        out = temp_dir(self)
        done = self.run_job(
            1,
            "--tee=1",
            f"--log-dir={out}/logs",
            code="print('x' * 100000, flush=True)\nprint('after', flush=True)\n",
            out=out,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        mark = " [dlrun: line cut at 64 KiB, it goes on below]"
        self.assertEqual(
            done.stdout.splitlines(),
            ["[0]:" + "x" * 65536 + mark, "[0]:" + "x" * (100000 - 65536), "[0]:after"],
        )
        (log,) = glob.glob(os.path.join(out, "logs", "*", "attempt_0", "0", "stdout.log"))
        with open(log) as f:
            self.assertEqual(f.read(), "x" * 100000 + "\nafter\n")

    def test_torchruns_format_is_untouched(self):
        done = self.run_job(8, "--console-format=torchrun", "--tee=3")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.count("loading data"), 8, done.stdout)
        self.assertNotIn("[0-7]", done.stdout)

    def test_on_with_a_prefix_of_the_users_is_refused(self):
        done = self.run_job(2, "--console-dedup=on", "--log-line-prefix-template=${rank}>")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--console-dedup=on needs dlrun's console lines", done.stderr)
        done = self.run_job(8, "--log-line-prefix-template=${rank}>")  # auto: off
        self.assertEqual(done.stdout.count("loading data"), 8, done.stdout)


if __name__ == "__main__":
    unittest.main()
