"""The Debian packages on a fresh Debian (issue 17, acceptance 2; issue 33, acceptance 1): in a
minimal root of the release they were built on (their Depends name its libraries: a package built
on Debian 13 is for Debian 13), without CUDA (debootstrap --variant=minbase, with man-db;
chroot_fixture.py caches it), `apt-get install ./dlrun_*.deb` (and, from a build with CUDA, the
add-on ./dlrun-cuda_*.deb) pulls the dependencies and the recommended data from the mirror; there
`dlrun --standalone --nproc-per-node=2 train --epochs 1` runs from PATH on the CPU, `man dlrun`
shows the page, `dlrun-train --device cuda` is one line naming what is missing (the CUDA
runtime the add-on's module needs, or the add-on itself) with exit 2, and `--device auto` says
it trains on the CPU. Needs root and a Debian mirror."""

import os
import sys
import unittest

from chroot_fixture import run_in_root
from dlrun_fixture import main, temp_dir
from package_fixture import make_packages, with_cuda

INSTALL_TIMEOUT_S = 600  # mounting, apt-get update and install, the training run, man

# Runs after chroot_fixture's MOUNT_SCRIPT, with the packages' paths as its arguments.
SCRIPT = r"""
names=()
for package in "$@"; do
  cp "$package" "$root/tmp/"
  names+=("/tmp/$(basename "$package")")
done
in_root apt-get update -q
in_root apt-get install -y -q "${names[@]}"
# libgloo0: a shared library's package, pulled through the computed Depends (gRPC is linked in);
# no libslurm: dlrun opens the node's own at run time, where it has one
echo "dpkg: $(in_root dpkg-query -W -f='${Status} ' dataset-fashion-mnist libgloo0)"
echo "libslurm files: $(in_root sh -c 'ls /usr/lib/x86_64-linux-gnu | grep -c ^libslurm')"
echo "dlrun on PATH: $(in_root sh -c 'command -v dlrun')"
in_root sh -c 'cd /tmp && dlrun --standalone --nproc-per-node=2 train --epochs 1'
in_root MANWIDTH=100 man dlrun
set +e
cuda=$(in_root sh -c 'cd /tmp && dlrun-train --single --device cuda --epochs 1' 2>&1)
echo "device cuda: exit $?, $(printf '%s\n' "$cuda" | wc -l) line(s): $cuda"
in_root sh -c 'cd /tmp && dlrun-train --single --device auto --epochs 1 --max-steps 1' 2>&1 |
  grep -- '--device auto'
"""


def this_release():
    """The codename of the machine the packages were built on (bookworm, trixie)."""
    with open("/etc/os-release") as f:
        fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    return fields["VERSION_CODENAME"].strip('"')


def setUpModule():
    if os.geteuid() != 0:
        print("test_package_chroot: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("debootstrap, chroot and mounts need root")


class PackageChrootTest(unittest.TestCase):
    def test_packages_install_and_train_on_fresh_debian_without_cuda(self):
        scratch = temp_dir(self)
        packages = make_packages(os.path.join(scratch, "package"))
        code, output = run_in_root(
            this_release(),
            scratch,
            SCRIPT,
            sorted(packages.values()),
            INSTALL_TIMEOUT_S,
            include=["man-db"],
        )
        self.assertEqual(code, 0, output[-6000:])
        self.assertIn("dpkg: install ok installed install ok installed", output)
        self.assertIn("libslurm files: 0", output)
        self.assertIn("dlrun on PATH: /usr/bin/dlrun", output)
        self.assertRegex(output, r'\[0\]:\{"epochs": 1, .*"world_size": 2, .*"device": "cpu"')
        self.assertRegex(output, r"NAME\s+dlrun - launch workers on every node")
        if with_cuda():
            # The module is there; the first NVIDIA library the loader misses is named.
            missing = (
                r"the CUDA engine needs (libcudart|libnccl|libcublas)\S*\.so\S*, which this"
                r" machine lacks"
            )
        else:
            missing = r"this dlrun-train has no CUDA engine .*install the package dlrun-cuda\)"
        self.assertRegex(
            output,
            r"device cuda: exit 2, 1 line\(s\): dlrun-train: error: "
            r"--device cuda: " + missing,
        )
        self.assertRegex(output, r"dlrun-train: --device auto: cpu, as " + missing)


if __name__ == "__main__":
    main()
