"""dlrun.progress (python/dlrun/progress.py, docs/guides/progress.md), the module workers import to
report progress, in both eras (ctest runs this file under both interpreters; the workers run under
the test's). The package is the build tree's copy (DLRUN_PYTHONDIR): the agent puts its directory on
the workers' PYTHONPATH (the tests give them none), and this test puts it on its own Python's.

- Without dlrun (DLRUN_PROGRESS_FILE unset or empty): importing it imports no trainer library,
  step() returns at once, creates no file and says nothing; active() is False.
- A worker dlrun started ahead (DLRUN_RECOVERY_RESERVE) reports nothing until it took its place.
- Set but unusable (a missing file, no slot for LOCAL_RANK, LOCAL_RANK not a local rank or
  unset): one line on stderr naming the problem, no exception, and then nothing reported.
- Under dlrun (2 workers, --metrics-port): each worker's steps, loss, accuracy, epoch and
  samples are in its slot of the real board (read here), local rank 0's reach the agent's
  /api/state curve, the metrics side file holds the valid named values (at most 8 names), two
  bad calls make one warning and no report, and a forked child's step() leaves the slot alone.
  The same with --warm-start --preload=dlrun.progress: workers forked from a zygote that
  imported the module report to their own slots.
"""

import json
import math
import os
import struct
import subprocess
import unittest

from dlrun_fixture import (
    EVENT_TIMEOUT_S,
    PYTHON,
    Dlrun,
    clean_env,
    main,
    read_json,
    temp_dir,
    wait_until,
    worker,
)
from metrics_fixture import http_get, metrics_port

PACKAGE_DIR = os.environ.get("DLRUN_PYTHONDIR", "")
PROGRESS_WORKER = worker("progress_worker.py")
FINAL_STEP = 25
SLOT = struct.Struct("<QqqIIddq")  # common/progress_board.h's ProgressSlot
SLOT_FIELDS = ("beats", "step", "epoch", "phase", "results", "loss", "accuracy", "samples")
REPORTED_LOSS, REPORTED_ACCURACY = 1, 2
JOB_TIMEOUT_S = 60


def package_env(**overrides):
    """clean_env with the build tree's package on PYTHONPATH, for Python run without dlrun."""
    if not os.path.isfile(os.path.join(PACKAGE_DIR, "dlrun", "progress.py")):
        raise RuntimeError(
            f"DLRUN_PYTHONDIR must name the build tree's share/dlrun/python (got {PACKAGE_DIR!r})"
        )
    return clean_env(PYTHONPATH=PACKAGE_DIR, **overrides)


def job_env(**overrides):
    """clean_env without a PYTHONPATH: workers import dlrun.progress from the path the agent
    gives them, as users' workers do."""
    return clean_env(PYTHONPATH=None, **overrides)


def read_slot(board, local_rank):
    with open(board, "rb") as f:
        f.seek(64 * local_rank)
        return dict(zip(SLOT_FIELDS, SLOT.unpack(f.read(SLOT.size))))


def api_state(port):
    return json.loads(http_get(port, "/api/state")[2])


def curve_reaches(port, step):
    """The agent's last curve point ([time, step, epoch, loss, accuracy, samples/s]) once it is
    at `step`, else None."""
    curve = api_state(port)["curve"]
    return curve[-1] if curve and curve[-1][1] == step else None


class ProgressJob:
    """dlrun --standalone with 2 workers that report and then hold until release()."""

    def __init__(self, test, out, args, flags=(), env=None, workers=2, timeout=JOB_TIMEOUT_S):
        self.test, self.out, self.workers = test, out, workers
        self.dlrun = Dlrun(
            test,
            ["--standalone", f"--nproc-per-node={workers}", "--metrics-port=0", *flags, *args],
            env=env if env is not None else job_env(),
        )
        self.port = metrics_port(self.dlrun)
        paths = [os.path.join(out, f"ready_{r}.json") for r in range(workers)]
        wait_until(
            lambda: all(os.path.exists(p) for p in paths),
            timeout,
            "every worker's ready file",
            proc=self.dlrun.proc,
            on_timeout=self.dlrun.describe,
        )
        self.records = [read_json(p) for p in paths]
        self.dlrun.watch_workers(r["pid"] for r in self.records)

    def wait_for_curve(self, step):
        found = []
        wait_until(
            lambda: found.append(curve_reaches(self.port, step)) or found[-1],
            EVENT_TIMEOUT_S,
            f"the agent's curve to reach step {step}",
            proc=self.dlrun.proc,
            on_timeout=self.describe,
        )
        return found[-1]

    def describe(self):
        return f"--- /api/state curve ---\n{api_state(self.port)['curve']}\n{self.dlrun.describe()}"

    def release(self):
        with open(os.path.join(self.out, "release"), "w"):
            pass
        result = self.dlrun.wait(JOB_TIMEOUT_S)
        self.test.assertEqual(result.returncode, 0, result)
        return result


class WithoutDlrunTest(unittest.TestCase):
    def run_python(self, code, env):
        cwd = temp_dir(self)
        result = subprocess.run(
            [PYTHON, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result)
        return result, os.listdir(cwd)

    def test_unset_or_empty_reports_nothing_and_costs_nothing(self):
        code = (
            "import sys, timeit\n"
            "import dlrun.progress as p\n"
            "assert not {'lightning', 'pytorch_lightning', 'transformers', 'torch'} & "
            "set(sys.modules)\n"
            "p.step(1, loss=0.5, accuracy=0.25, samples=8, epoch=0, lr=0.1)\n"
            "assert p.active() is False\n"
            "n = 100000\n"
            "t = min(timeit.repeat('p.step(2, loss=0.5, lr=0.1)', globals=globals(), "
            "number=n, repeat=3)) / n\n"
            "print(f'{t * 1e6:.3f}')\n"
        )
        for value in (None, ""):
            result, files = self.run_python(
                code, package_env(DLRUN_PROGRESS_FILE=value, LOCAL_RANK="0")
            )
            self.assertEqual((files, result.stderr), ([], ""))
            # Measured: about 0.1 us a call on a 2-core machine (either era).
            self.assertLess(float(result.stdout), 5.0, result.stdout)

    def test_set_but_unusable_warns_once_and_reports_nothing(self):
        directory = temp_dir(self)
        one_slot = os.path.join(directory, "board")
        with open(one_slot, "wb") as f:
            f.write(bytes(64))
        missing = os.path.join(directory, "missing")
        code = (
            "import dlrun.progress as p\n"
            "for n in range(3):\n"
            "    p.step(n, loss=0.5, lr=0.1)\n"
            "assert p.active() is False\n"
        )
        cases = [
            (missing, "0", f"DLRUN_PROGRESS_FILE={missing}: No such file or directory"),
            (one_slot, "1", f"DLRUN_PROGRESS_FILE={one_slot} has no slot for LOCAL_RANK 1"),
            (one_slot, "x", "LOCAL_RANK=x is not a local rank"),
            (one_slot, None, "DLRUN_PROGRESS_FILE is set but LOCAL_RANK is not"),
        ]
        for path, local_rank, problem in cases:
            with self.subTest(local_rank=local_rank, path=path):
                result, files = self.run_python(
                    code, package_env(DLRUN_PROGRESS_FILE=path, LOCAL_RANK=local_rank)
                )
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertTrue(lines[0].startswith("dlrun.progress: "), lines)
                self.assertIn(problem, lines[0])
                self.assertEqual(files, [])
        self.assertEqual(os.listdir(directory), ["board"])  # no metrics file beside it
        with open(one_slot, "rb") as f:
            self.assertEqual(f.read(), bytes(64))

    def test_a_worker_started_ahead_reports_only_once_it_took_its_place(self):
        # It holds the environment of the worker it may replace, whose slot is live; its place
        # taken (dlrun._reserve.take_place: the variable gone, the board looked for again), it
        # reports to that slot.
        board = os.path.join(temp_dir(self), "board")
        with open(board, "wb") as f:
            f.write(bytes(64))
        code = (
            "import os\n"
            "import dlrun.progress as p\n"
            "p.step(5, loss=0.5)\n"
            "assert p.active() is False\n"
            "with open(os.environ['DLRUN_PROGRESS_FILE'], 'rb') as f:\n"
            "    assert f.read() == bytes(64)\n"
            "del os.environ['DLRUN_RECOVERY_RESERVE']\n"
            "p._board = p._UNOPENED\n"
            "p.step(6, loss=0.25)\n"
            "assert p.active() is True\n"
        )
        result, _ = self.run_python(
            code,
            package_env(DLRUN_PROGRESS_FILE=board, LOCAL_RANK="0", DLRUN_RECOVERY_RESERVE="9"),
        )
        self.assertEqual(result.stderr, "")
        slot = read_slot(board, 0)
        self.assertEqual((slot["step"], slot["loss"]), (6, 0.25), slot)


class UnderDlrunTest(unittest.TestCase):
    def check_job(self, flags=()):
        out = temp_dir(self)
        job = ProgressJob(self, out, [PYTHON, PROGRESS_WORKER, out, str(FINAL_STEP)], flags)
        for local_rank, record in enumerate(job.records):
            self.assertEqual(record["package"], os.path.join(PACKAGE_DIR, "dlrun"))
            self.assertTrue(record["active"])
            slot = read_slot(record["board"], local_rank)
            self.assertEqual(
                slot,
                {
                    "beats": FINAL_STEP,
                    "step": FINAL_STEP,
                    "epoch": FINAL_STEP // 10,
                    "phase": 0,
                    "results": REPORTED_LOSS | REPORTED_ACCURACY,
                    "loss": 1.0 / FINAL_STEP,
                    "accuracy": 0.5 + 0.125 * local_rank,
                    "samples": 8 * FINAL_STEP,
                },
                record,
            )
            # Children forked before and after the worker opened the board reported nothing.
            self.assertEqual(
                (record["child_before_open_exit"], record["child_after_open_exit"]), (0, 0), record
            )
            self.assertTrue(record["slot_unchanged"] and record["metrics_file_unchanged"], record)

            expected = (
                {"lr": 0.1, "tokens_per_s": 1000.0, **{f"m{i}": float(i) for i in range(6)}}
                if local_rank == 0
                else {"lr": 0.1, "tokens_per_s": 1000.0}
            )
            metrics = read_json(record["metrics_file"])
            if record["steps_seconds"] >= 1:  # slower than the once-a-second limit: rewritten
                expected["lr"] = metrics["lr"]
            self.assertEqual(metrics, expected, record)
            self.assertTrue(all(math.isfinite(v) for v in metrics.values()))

        # Local rank 0's last report, as the agent sampled it from the board.
        point = job.wait_for_curve(FINAL_STEP)
        self.assertEqual(point[2], FINAL_STEP // 10)
        self.assertAlmostEqual(point[3], 1.0 / FINAL_STEP)
        self.assertEqual(point[4], 0.5)
        result = job.release()
        warnings = [line for line in result.stderr.splitlines() if "dlrun.progress:" in line]
        self.assertEqual(len(warnings), 1, result)
        self.assertIn("a step() report was dropped", warnings[0])

    def test_reports_reach_the_agent(self):
        self.check_job()

    def test_workers_forked_from_the_warm_start_zygote_report(self):
        self.check_job(["--warm-start", "--preload=dlrun.progress"])


if __name__ == "__main__":
    main()
