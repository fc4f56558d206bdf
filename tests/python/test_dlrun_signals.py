"""Signals and orphans: SIGKILL to dlrun leaves no worker behind (PR_SET_PDEATHSIG); SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlrun reach every worker; stopping is
SIGTERM, the --stop-timeout grace period, then SIGKILL; --signals-to-handle picks the signals
that stop the job.

Each worker installs its handlers and then writes its PID file, so once every PID file exists
the test knows all workers run and are ready for the signal."""

import os
import signal
import time
import unittest

from dlrun_fixture import (
    EVENT_TIMEOUT_S,
    PYTHON,
    Dlrun,
    is_running,
    main,
    temp_dir,
    wait_for_pid_files,
    wait_until,
    worker,
)

SIGNAL_WORKER = worker("signal_worker.py")
GONE_WITHIN_S = 2


class DlrunSignalTest(unittest.TestCase):
    def start(self, nproc, mode, *extra, flags=()):
        out = temp_dir(self)
        launcher = Dlrun(
            self, [f"--nproc-per-node={nproc}", *flags, PYTHON, SIGNAL_WORKER, out, mode, *extra]
        )
        pids = wait_for_pid_files(self, launcher, out, nproc)
        return out, launcher, pids

    def assert_gone(self, pids, launcher):
        wait_until(
            lambda: not any(is_running(p) for p in pids.values()),
            GONE_WITHIN_S,
            f"workers {sorted(pids.values())} to be gone",
            on_timeout=lambda: (
                "still running: "
                + str([p for p in pids.values() if is_running(p)])
                + "\n"
                + launcher.describe()
            ),
        )

    def assert_markers(self, out, sig, ranks):
        missing = [r for r in ranks if not os.path.exists(os.path.join(out, f"got_{sig.name}_{r}"))]
        self.assertEqual(missing, [], f"ranks that did not get {sig.name}")

    def assert_stops_the_job(self, sig, nproc, flags=()):
        """`sig` to dlrun reaches every worker and stops the job: dlrun exits 128 + sig."""
        out, launcher, pids = self.start(nproc, "trap", flags=flags)
        launcher.signal(sig)
        result = launcher.wait()
        self.assertEqual(result.returncode, 128 + sig, result)
        self.assert_markers(out, sig, range(nproc))
        self.assert_gone(pids, launcher)

    def test_sigkill_leaves_no_orphans(self):
        _, launcher, pids = self.start(4, "plain")
        launcher.signal(signal.SIGKILL)
        launcher.proc.wait(5)
        self.assert_gone(pids, launcher)

    def test_sigterm_reaches_every_worker(self):
        self.assert_stops_the_job(signal.SIGTERM, 4)

    def test_terminating_signals_reach_every_worker(self):
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            with self.subTest(signal=sig.name):
                self.assert_stops_the_job(sig, 2)

    def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(self):
        grace_s = 1
        out, launcher, pids = self.start(
            2, "ignore-term", "1", flags=["--stop-timeout", str(grace_s)]
        )
        start = time.monotonic()
        launcher.signal(signal.SIGTERM)
        result = launcher.wait(timeout=grace_s + 10)
        elapsed = time.monotonic() - start
        self.assertEqual(result.returncode, 128 + signal.SIGTERM, result)
        self.assert_markers(out, signal.SIGTERM, [0])
        self.assertFalse(os.path.exists(os.path.join(out, "got_SIGTERM_1")))
        # Rank 1 outlived SIGTERM: only SIGKILL after the grace period can have ended it.
        self.assertGreaterEqual(elapsed, grace_s * 0.9, result)
        self.assert_gone(pids, launcher)

    def test_user_signals_are_forwarded(self):
        for sig, nproc in ((signal.SIGUSR1, 4), (signal.SIGUSR2, 2)):
            with self.subTest(signal=sig.name):
                out, launcher, pids = self.start(nproc, "trap")
                launcher.signal(sig)
                result = launcher.wait()
                # Every worker exits 0 on the signal: a job that ends well.
                self.assertEqual(result.returncode, 0, result)
                self.assert_markers(out, sig, range(nproc))
                self.assert_gone(pids, launcher)

    def test_a_listed_user_signal_stops_the_job(self):
        # Stopped by it, where SIGUSR1 only forwarded ends this job well (exit 0, above).
        self.assert_stops_the_job(signal.SIGUSR1, 2, flags=["--signals-to-handle=SIGTERM,SIGUSR1"])

    def test_a_default_signal_left_out_is_ignored(self):
        out, launcher, pids = self.start(
            2, "trap", flags=["--signals_to_handle=SIGTERM,SIGINT,SIGQUIT"]
        )
        launcher.signal(signal.SIGHUP)
        ignored = "received SIGHUP, which --signals-to-handle leaves out: ignored"
        wait_until(
            lambda: ignored in launcher.output()[1],
            EVENT_TIMEOUT_S,
            "dlrun to ignore SIGHUP",
            proc=launcher.proc,
            on_timeout=launcher.describe,
        )
        self.assertTrue(all(is_running(p) for p in pids.values()), launcher.describe())
        launcher.signal(signal.SIGTERM)
        result = launcher.wait()
        self.assertEqual(result.returncode, 128 + signal.SIGTERM, result)
        self.assert_markers(out, signal.SIGTERM, range(2))
        self.assertFalse([n for n in os.listdir(out) if n.startswith("got_SIGHUP")])


if __name__ == "__main__":
    main()
