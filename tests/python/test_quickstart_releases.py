"""The README's quickstart on a fresh Debian 12 and 13 (issue 29, acceptance 5): in a minimal root
of each release (debootstrap --variant=minbase, cached by chroot_fixture.py) with the source tree
copied in (git's files, no build/ and no .git), `bash scripts/quickstart.sh --epochs 1`, as root,
installs what it needs from the mirror, builds and trains: it exits 0 with rank 0's summary, the
programs say `git unknown` outside a checkout, and the build went through ccache. In the same
root every package that `scripts/setup.sh --tests` would install resolves (apt-get --simulate),
so scripts/test.sh's set-up holds on both releases. Needs root and a Debian mirror.

Each release's ccache directory is kept in the build directory (RELEASE-ccache), so a build
after the first compiles little; the first takes some 20 minutes on 2 cores."""

import os
import re
import shutil
import subprocess
import sys
import unittest

from chroot_fixture import cache_dir, run_in_root
from dlrun_fixture import temp_dir

# apt-get update and install, the build, the training run, the simulation; the file runs under
# unittest.main, not dlrun_fixture.main, whose hang limit is minutes
RUN_TIMEOUT_S = 3000
MIN_ACCURACY = 0.80  # one epoch of four workers

# Runs after chroot_fixture's MOUNT_SCRIPT, with SOURCE CCACHE as its arguments.
SCRIPT = r"""
source=$1 ccache=$2
mkdir -p "$root/src" "$root/ccache"
mount --bind "$source" "$root/src"
mount --bind "$ccache" "$root/ccache"
in_root CCACHE_DIR=/ccache CCACHE_LOGFILE=/tmp/ccache.log \
        sh -c 'cd /src && bash scripts/quickstart.sh --epochs 1'
echo "version: $(in_root /src/build/bin/dlrun --version)"
# This run's compilations, from its own log (the cache's counters span runs)
echo "ccache: $(grep -cE 'Result: (cache_miss|(direct|preprocessed)_cache_hit)$' \
                 "$root/tmp/ccache.log") compilations, $(grep -cE 'Result: \w+_cache_hit$' \
                 "$root/tmp/ccache.log") from the cache"
tests=$(in_root DLRUN_SETUP_PRINT=packages bash /src/scripts/setup.sh --tests)
in_root apt-get install --simulate -q --no-install-recommends $tests > "$scratch/simulate.log"
echo "simulated: $(grep -c '^Inst ' "$scratch/simulate.log") packages to install for the tests"
"""


def copy_source(destination):
    """Copies the files git has (tracked, and untracked ones it does not ignore: a checkout of
    this change) from DLRUN_SOURCE_DIR, as they are in the working tree."""
    source = os.environ["DLRUN_SOURCE_DIR"]
    listed = subprocess.run(
        ["git", "-C", source, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        path = os.path.join(source, name)
        if os.path.isfile(path):  # not one deleted in the working tree
            os.makedirs(os.path.join(destination, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(path, os.path.join(destination, name), follow_symlinks=False)


def setUpModule():
    if os.geteuid() != 0:
        print("test_quickstart_releases: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("debootstrap, chroot and mounts need root")


class QuickstartReleasesTest(unittest.TestCase):
    def check_release(self, release):
        scratch = temp_dir(self)
        source = os.path.join(scratch, "src")
        copy_source(source)
        ccache = os.path.join(cache_dir(), f"{release}-ccache")
        os.makedirs(ccache, exist_ok=True)
        code, output = run_in_root(release, scratch, SCRIPT, [source, ccache], RUN_TIMEOUT_S)
        print(f"test_quickstart_releases: {release}:\n{output[-3000:]}", flush=True)
        self.assertEqual(code, 0, output[-6000:])
        summary = re.search(
            r'\[0\]:\{"epochs": 1, .*"world_size": 4, .*"test_accuracy": ([0-9.]+)', output
        )
        self.assertIsNotNone(summary, output[-6000:])
        self.assertGreaterEqual(float(summary.group(1)), MIN_ACCURACY, summary.group(0))
        self.assertRegex(output, r"ccache: [1-9]\d* compilations, ")
        self.assertRegex(output, r"version: dlrun \d+\.\d+\.\d+ \(git unknown\)")
        self.assertRegex(output, r"simulated: [1-9]\d* packages to install for the tests")

    def test_bookworm(self):
        self.check_release("bookworm")

    def test_trixie(self):
        self.check_release("trixie")


if __name__ == "__main__":
    unittest.main()
