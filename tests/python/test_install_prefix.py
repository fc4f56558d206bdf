"""cmake --install into a temporary prefix gives a tree that runs from anywhere (issue 17,
acceptance 3): with the build and source directories hidden (a tmpfs over each, in a mount
namespace of the run's own), the installed dlrun, started from another working directory, runs
the installed trainer on 2 workers, and the trainer finds its AVX2 module in the prefix's
library directory; a Python worker opens the checkpoint copy module the installed dlrun names.
The installed programs' --version names the version and the git commit."""

import os
import re
import subprocess
import sys
import unittest

from dlrun_fixture import main
from package_fixture import build_dir, class_temp_dir, install, run

TRAIN_TIMEOUT_S = 120


def cpu_has_avx2_and_fma():
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    return "avx2" in flags and "fma" in flags


def expected_commit():
    """What the build wrote into --version: HEAD's commit, "-dirty" or not, or "unknown" (also
    where no git is installed: the build could not ask it either)."""
    try:
        head = subprocess.run(
            ["git", "-C", os.environ["DLRUN_SOURCE_DIR"], "rev-parse", "--short=12", "HEAD"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except FileNotFoundError:
        return "unknown"
    return re.escape(head.stdout.strip()) + "(-dirty)?" if head.returncode == 0 else "unknown"


class InstallPrefixTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = class_temp_dir(cls)
        cls.prefix = install(os.path.join(cls.scratch, "prefix"))

    def hidden_build_run(self, args, cwd):
        """Runs args in cwd with the build and source directories hidden under empty tmpfs
        mounts; the mounts live in the command's own mount namespace and end with it."""
        hide = " && ".join(
            f"mount -t tmpfs hidden {path}"
            for path in (build_dir(), os.environ["DLRUN_SOURCE_DIR"])
        )
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        env = dict(os.environ, DLRUN_LOG_LEVEL="debug")
        hidden = os.path.join(build_dir(), "CMakeCache.txt")
        return run(
            [*unshare, "sh", "-c", f'{hide} && test ! -e {hidden} && exec "$@"', "sh", *args],
            timeout=TRAIN_TIMEOUT_S,
            cwd=cwd,
            env=env,
        )

    def test_installed_dlrun_trains_without_the_build(self):
        elsewhere = os.path.join(self.scratch, "elsewhere")
        os.mkdir(elsewhere)
        output = self.hidden_build_run(
            [
                os.path.join(self.prefix, "bin", "dlrun"),
                "--standalone",
                "--nproc-per-node=2",
                "train",
                "--epochs",
                "1",
                "--max-steps",
                "50",
            ],
            cwd=elsewhere,
        )
        self.assertRegex(output, r'"world_size": 2, .*"device": "cpu"')
        if cpu_has_avx2_and_fma():
            module = os.path.join(self.prefix, "lib", "dlrun", "trainer", "dlrun-train-avx2.so")
            self.assertEqual(output.count(f"debug: CPU math: avx2 ({module})"), 2, output)
        else:
            self.assertIn("CPU math: baseline (this CPU lacks AVX2 or FMA)", output)

    def test_installed_dlrun_gives_its_workers_the_checkpoint_copy_module(self):
        # dlrun.checkpoint's workers open it where the agent says (agents/checkpoint_copy.h).
        worker = (
            "import os, dlrun._copies as c; "
            "print('copy module:', os.environ['DLRUN_CHECKPOINT_COPY'], c._native() is not None)"
        )
        output = self.hidden_build_run(
            [
                os.path.join(self.prefix, "bin", "dlrun"),
                "--standalone",
                "--nproc-per-node=1",
                sys.executable,
                "-c",
                worker,
            ],
            cwd=self.scratch,
        )
        module = os.path.join(self.prefix, "lib", "dlrun", "checkpoint", "dlrun-checkpoint-copy.so")
        self.assertIn(f"copy module: {module} True", output)

    def test_version_names_the_commit(self):
        for program in ("dlrun", "dlrund", "dlrun-train"):
            version = run([os.path.join(self.prefix, "bin", program), "--version"])
            self.assertRegex(
                version,
                rf"^{program} {re.escape(os.environ['DLRUN_VERSION'])} "
                rf"\(git {expected_commit()}\)\n$",
            )


if __name__ == "__main__":
    main()
