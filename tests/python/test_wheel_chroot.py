"""dlrun's wheel on fresh Debian roots (issue 46, acceptance 2): the wheel that `scripts/wheel.sh
--built` packs from this build, in a minimal Debian 12 root and a minimal Debian 13 root that
have only Python (debootstrap --variant=minbase with python3-venv; chroot_fixture.py caches
them). In each: a venv, and `pip install` of the wheel with no network at all (a network namespace
of its own, no index given: a dependency to fetch would fail it); there `dlrun` is the venv's on
PATH; without Debian's dataset the trainer says in one line how to get the data (exit non-zero);
the main job, `dlrun --standalone --nproc-per-node=4 train`, trains on Fashion-MNIST copied into
the root and passed with --data-dir; `--synthetic` trains without it; a Python entry point runs
under the venv's interpreter; `python -m dlrun` runs dlrun. Needs root and a Debian mirror."""

import glob
import os
import re
import sys
import unittest

from chroot_fixture import run_in_root
from dlrun_fixture import main, temp_dir
from package_fixture import build_dir, class_temp_dir, run

ROOT_TIMEOUT_S = 600  # mounting, the venv, pip, the main job on 4 workers and the others
DATA_DIR = "/usr/share/datasets/fashion-mnist"  # the host's copy of the data (setup.sh)

# Runs after chroot_fixture's MOUNT_SCRIPT, with the wheel and the host's data as its arguments.
SCRIPT = r"""
wheel=$1 data=$2
cp "$wheel" "$root/tmp/"
mkdir -p "$root/data"
cp "$data"/*-ubyte.gz "$root/data/"
echo "python: $(in_root python3 --version)"
echo "dlrun before: $(in_root sh -c 'command -v dlrun || echo none')"
in_root python3 -m venv /opt/dlrun
unshare --net chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root \
  /opt/dlrun/bin/pip install --no-cache-dir --disable-pip-version-check "/tmp/${wheel##*/}"
venv() { in_root PATH=/opt/dlrun/bin:/usr/sbin:/usr/bin:/sbin:/bin sh -c "cd /tmp && $1"; }
echo "dlrun on PATH: $(venv 'command -v dlrun')"
set +e
nodata=$(venv 'dlrun-train --single --epochs 1' 2>&1)
echo "no data: exit $?, $(printf '%s\n' "$nodata" | wc -l) line(s): $nodata"
set -e
venv 'dlrun --standalone --nproc-per-node=4 train --data-dir /data --epochs 1'
venv 'dlrun --standalone --nproc-per-node=2 train --synthetic --epochs 1 --max-steps 20'
printf 'import sys\nprint("worker python:", sys.executable)\n' > "$root/tmp/probe.py"
venv 'dlrun --standalone --nproc-per-node=1 probe.py'
venv 'python -m dlrun --version'
"""


BOOKWORM_GLIBC = 36  # Debian 12's glibc, 2.36


def setUpModule():
    if os.geteuid() != 0:
        print("test_wheel_chroot: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("debootstrap, chroot and mounts need root")


class WheelChrootTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist = os.path.join(class_temp_dir(cls), "dist")
        source = os.environ["DLRUN_SOURCE_DIR"]
        run(
            ["bash", os.path.join(source, "scripts", "wheel.sh"), "--built"],
            env=dict(os.environ, DLRUN_BUILD_DIR=build_dir(), DLRUN_DIST_DIR=dist),
        )
        (cls.wheel,) = glob.glob(os.path.join(dist, "*.whl"))

    def check_release(self, release, python):
        code, output = run_in_root(
            release,
            temp_dir(self),
            SCRIPT,
            [self.wheel, DATA_DIR],
            ROOT_TIMEOUT_S,
            include=["python3-venv"],
        )
        self.assertEqual(code, 0, output[-6000:])
        print(f"--- {release} ---\n{output[-3000:]}")  # shown by ctest -V
        self.assertRegex(output, rf"python: Python {python}\.")
        self.assertIn("dlrun before: none", output)
        self.assertRegex(output, r"Successfully installed dlrun-\S+")
        self.assertIn("dlrun on PATH: /opt/dlrun/bin/dlrun", output)
        self.assertRegex(
            output,
            r"no data: exit [1-9]\d*, 1 line\(s\): dlrun-train: error: no "
            r"Fashion-MNIST in /usr/share/datasets/fashion-mnist: install "
            r"Debian's package dataset-fashion-mnist .*--data-dir DIR; "
            r"--synthetic trains on generated data",
        )
        self.assertRegex(
            output,
            r'\[0\]:\{"epochs": 1, "steps": \d+, "world_size": 4, .*'
            r'"test_accuracy": 0\.[6-9]\d*, .*"device": "cpu"',
        )
        self.assertRegex(output, r'\[0\]:\{"epochs": 1, "steps": 20, "world_size": 2, ')
        self.assertIn("worker python: /opt/dlrun/bin/python3", output)
        self.assertRegex(output, r"\ndlrun \d+\.\d+\.\d+ \(git \S+\)\n")

    def test_debian_12_minbase_with_only_python(self):
        # A wheel built on Debian 13 (glibc 2.41) is tagged manylinux_2_39 or newer, which
        # Debian 12's glibc 2.36 cannot run: pip refuses it there, as it should.
        glibc = int(re.search(r"manylinux_2_(\d+)_", self.wheel).group(1))
        if glibc <= BOOKWORM_GLIBC:
            self.check_release("bookworm", "3.11")
            return
        code, output = run_in_root(
            "bookworm",
            temp_dir(self),
            SCRIPT,
            [self.wheel, DATA_DIR],
            ROOT_TIMEOUT_S,
            include=["python3-venv"],
        )
        self.assertNotEqual(code, 0, output[-6000:])
        self.assertIn("is not a supported wheel on this platform", output)

    def test_debian_13_with_only_python(self):
        self.check_release("trixie", "3.13")


if __name__ == "__main__":
    main()
