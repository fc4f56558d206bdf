"""The short chaos soak in the default run: bench/chaos_soak.py for 60 s with a fixed seed, half
on etcd (3 members on hosts of their own) and half on c10d behind dlrund, the bundled trainer on 4
simulated hosts (network namespaces) while a fault is injected every few seconds. Every check of
the soak must hold: every surviving agent exits 0, every training step is taken once, no process
is left, no fault costs more restarts than its kind allows (bench/chaos_faults.py, EXPECTED).
The longer soak (10 minutes, twice with different seeds) is bench/chaos_soak.sh run by hand.

Needs root (namespaces, tmpfs mounts); skipped without it.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

from dlrun_fixture import PR_SET_PDEATHSIG, binary_from_env

HERE = os.path.dirname(os.path.abspath(__file__))
SOAK = os.path.normpath(os.path.join(HERE, "..", "..", "bench", "chaos_soak.py"))
SEED = 20261127
DURATION_S = 60
# Faults for 60 s, then each backend's last job ends within 120 s, plus the clusters' start.
SOAK_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60  # after SIGTERM, the soak takes its hosts down and unmounts


def terminate_with_parent():
    """Popen preexec_fn: the soak gets SIGTERM, on which it takes its hosts down and unmounts,
    if the test process dies first."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def unmount_under(directory):
    """Unmounts whatever is still mounted under `directory` (a soak killed before its cleanup)."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in points:
        if point.startswith(directory + os.sep):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=10)


def setUpModule():
    if os.geteuid() != 0:
        print("test_chaos_soak: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("network namespaces need root")


class ChaosSoakTest(unittest.TestCase):
    def test_a_short_seeded_soak_on_both_backends_holds_every_check(self):
        build = os.path.dirname(os.path.dirname(binary_from_env("DLRUN", "dlrun")))
        out = tempfile.mkdtemp(prefix="dlrun-chaos-test-")  # kept when the soak fails
        summary = os.path.join(out, "summary.json")
        output = self.run_soak(
            [
                "--seed",
                str(SEED),
                "--duration",
                str(DURATION_S),
                "--backend",
                "both",
                "--build",
                build,
                "--out",
                os.path.join(out, "logs"),
                "--json",
                summary,
            ],
            out,
        )
        with open(summary) as f:
            result = json.load(f)
        self.assertEqual(result["errors"], [], output)
        self.assertGreater(len(result["faults"]), 0, output)
        self.assertEqual({f["backend"] for f in result["faults"]}, {"etcd", "c10d"}, output)
        shutil.rmtree(out, ignore_errors=True)

    def run_soak(self, args, out):
        """Runs the soak to its end (SIGTERM past SOAK_TIMEOUT_S, or when the test is cut short:
        it takes its hosts down); fails unless it exits 0. Returns its output."""
        proc = subprocess.Popen(
            [sys.executable, SOAK, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=terminate_with_parent,
        )
        output = ""
        try:
            output, _ = proc.communicate(timeout=SOAK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"the soak ran past {SOAK_TIMEOUT_S}s")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    output, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    output, _ = proc.communicate()
                print(output, file=sys.stderr)
            unmount_under(out)
        print(output, file=sys.stderr)
        self.assertEqual(proc.returncode, 0, output)
        return output


if __name__ == "__main__":
    unittest.main()
