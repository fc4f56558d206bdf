"""A job comes back after a worker is killed: what the recovery tests share.

A job runs workers/recovery_train.py (a checkpointed DDP job over gloo, STEPS steps); in each
attempt of KILLS the victim rank writes its pid once the attempt's step is checkpointed, and
RecoveryCase.kill_victims SIGKILLs it there, so each kill lands mid-training at a known step.
assert_recovered then checks that the job came back and took every step once:

- every rank finished in the attempt after the last kill, with equal parameters;
- the final checkpoint's history lists steps 0..STEPS-1 once each, in order, each taken by the
  attempt the kills imply (attempt a took the steps after the previous kill's up to its own);
- each attempt began at the step after the last one checkpointed (begun.log): only a step lost
  with a killed attempt (begun, never checkpointed) was begun again;
- the parameters equal, to rounding, a replay of the STEPS steps in one process, and not a
  replay one step short: a step skipped or applied twice, or an optimizer state lost, shows.

Launchers are launcher_fixture.Launcher (on loopback or inside a simulated host, output in a
log file, stopped by PID in the test's cleanups). MASTER_PORT is never assumed to stay the same
from one attempt to the next.
"""

import glob
import os
import signal
import unittest

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    is_running,
    kill_if_ours,
    log_tails,
    read_json,
    runs_our_script,
    temp_dir,
    wait_until,
    worker,
)
from launcher_fixture import Launcher

RECOVERY_TRAIN = worker("recovery_train.py")
STEPS = 30
KILLS = {0: 4, 1: 12, 2: 20}  # attempt: the step after which its victim is killed
MAX_RESTARTS = len(KILLS)  # no restart to spare: each kill must cost exactly one
# One attempt's start on 2 loaded cores (torch's import, the rendezvous, init_process_group) and
# its steps up to the kill; a restart that cannot meet fails within init's 30 s timeout.
ATTEMPT_TIMEOUT_S = 75
JOB_TIMEOUT_S = 120  # the last attempt's start and steps, the end of the job
REPLAY_TOLERANCE = 1e-9  # float64 rounding; one step more or less moves ~1e-3


def dlrun_argv(*args):
    return [binary_from_env("DLRUN", "dlrun"), *args]


def kill_args():
    """KILLS as the workers' ATTEMPT:STEP arguments."""
    return [f"{attempt}:{step}" for attempt, step in sorted(KILLS.items())]


def train_argv(out, victim):
    """The worker's command line after dlrun's flags."""
    return [PYTHON, RECOVERY_TRAIN, out, str(STEPS), str(victim), *kill_args()]


def attempt_of_step(step):
    """The attempt that must take `step`: the first whose kill comes at or after it."""
    return next((a for a, at in sorted(KILLS.items()) if step <= at), MAX_RESTARTS)


def begun_steps(out):
    """{attempt: [steps rank 0 began, in order]} from begun.log."""
    begun = {}
    with open(os.path.join(out, "begun.log")) as f:
        for line in f:
            attempt, step = map(int, line.split())
            begun.setdefault(attempt, []).append(step)
    return begun


def kill_victims_later(out):
    """Cleanup: every victim whose pid file exists, if it still runs one of our scripts."""
    for path in glob.glob(os.path.join(out, "victim_*.pid")):
        with open(path) as f:
            kill_if_ours(int(f.read()))


class RecoveryCase(unittest.TestCase):
    def setUp(self):
        self.logs = temp_dir(self)
        self.launchers = []

    def launch(self, name, argv, env, hosts=None, host=None):
        launcher = Launcher(self, name, argv, env, self.logs, hosts=hosts, host=host)
        self.launchers.append(launcher)
        return launcher

    def all_logs(self):
        return log_tails(self.logs, tail=6000)

    def out_dir(self):
        out = temp_dir(self)
        self.addCleanup(kill_victims_later, out)  # before the directory goes (LIFO)
        return out

    def env(self, **overrides):
        return clean_env(PYTHON_EXEC=PYTHON, TMPDIR=self.logs, **overrides)

    def wait_for_file(self, path, timeout, what):
        """Waits for `path`; fails at once when a launcher exits first."""

        def exited():
            return [one.name for one in self.launchers if one.proc.poll() is not None]

        wait_until(
            lambda: os.path.exists(path) or exited(), timeout, what, on_timeout=self.all_logs
        )
        if not os.path.exists(path):
            self.fail(f"{exited()} exited before {what}\n{self.all_logs()}")

    def kill_victims(self, out):
        """SIGKILLs the victim of each attempt of KILLS once it has written its pid."""
        for attempt, step in sorted(KILLS.items()):
            path = os.path.join(out, f"victim_{attempt}.pid")
            self.wait_for_file(
                path, ATTEMPT_TIMEOUT_S, f"attempt {attempt}'s victim to checkpoint step {step}"
            )
            with open(path) as f:
                pid = int(f.read())
            self.assertTrue(
                is_running(pid) and runs_our_script(pid),
                f"the victim of attempt {attempt} (pid {pid}) is not running\n{self.all_logs()}",
            )
            os.kill(pid, signal.SIGKILL)

    def run_killed_job(self, launchers, out):
        """Kills the victims, then waits for every launcher to exit 0."""
        self.kill_victims(out)
        for launcher in launchers:
            self.assertEqual(launcher.wait(JOB_TIMEOUT_S), 0, self.all_logs())

    def assert_recovered(self, out, world):
        detail = self.all_logs()
        paths = [os.path.join(out, f"done_{rank}.json") for rank in range(world)]
        missing = [p for p in paths if not os.path.exists(p)]
        self.assertEqual(missing, [], detail)
        done = [read_json(p) for p in paths]
        last = MAX_RESTARTS
        self.assertEqual([d["rank"] for d in done], list(range(world)))
        self.assertEqual({d["world"] for d in done}, {world}, done)
        self.assertEqual({d["attempt"] for d in done}, {last}, done)
        self.assertEqual({d["start"] for d in done}, {KILLS[last - 1] + 1}, done)
        self.assertEqual(len({d["checksum"] for d in done}), 1, done)

        history = done[0]["history"]
        self.assertEqual([step for step, _ in history], list(range(STEPS)), history)
        self.assertEqual(
            [attempt for _, attempt in history],
            [attempt_of_step(step) for step in range(STEPS)],
            history,
        )
        begun = begun_steps(out)
        self.assertEqual(sorted(begun), list(range(last + 1)), begun)
        for attempt, steps in begun.items():
            first = KILLS[attempt - 1] + 1 if attempt else 0
            self.assertEqual(steps, list(range(first, first + len(steps))), begun)
            # A killed attempt got to its kill and at most began the next step.
            ends = [STEPS - 1] if attempt == last else [KILLS[attempt], KILLS[attempt] + 1]
            self.assertIn(steps[-1], ends, begun)

        self.assertLessEqual(done[0]["replay_diff"], REPLAY_TOLERANCE, done[0])
        self.assertGreater(done[0]["one_short_diff"], 1000 * REPLAY_TOLERANCE, done[0])
        return done

    def isolation_records(self, out, restarts, world, code):
        """workers/store_isolation.py's records: {attempt: [ranks 0..world-1]} of every
        attempt 0..restarts, checked to have seen no key of an earlier attempt and the job
        (exit `code`) to have ended 0."""
        found = {}
        for path in glob.glob(os.path.join(out, "attempt_*_*.json")):
            record = read_json(path)
            found.setdefault(record["attempt"], {})[record["rank"]] = record
        seen = {
            (a, r): f"{len(rec['seen'])} keys, first {rec['seen'][0]}"
            for a, ranks in sorted(found.items())
            for r, rec in sorted(ranks.items())
            if rec["seen"]
        }
        self.assertEqual(seen, {}, "(attempt, rank): keys of earlier attempts it could read")
        self.assertEqual(code, 0, self.all_logs())
        self.assertEqual(
            {a: sorted(ranks) for a, ranks in found.items()},
            {a: list(range(world)) for a in range(restarts + 1)},
            self.all_logs(),
        )
        return {a: [found[a][r] for r in range(world)] for a in sorted(found)}
