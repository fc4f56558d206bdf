"""The Debian package on a fresh Debian 12 (issue 17, acceptance 2): in a minimal bookworm root
(debootstrap --variant=minbase, with man-db; chroot_fixture.py caches it), `apt-get install
./PACKAGE.deb` pulls the package's dependencies and the recommended data from the mirror; there
`dlrun --standalone --nproc-per-node=2 train --epochs 1` runs from PATH and `man dlrun` shows the
page. Needs root and a Debian mirror.

A CUDA build's package (dlrun-cuda) needs NVIDIA's runtime, which Debian does not ship: the
build's CUDA library directories (DLRUN_CUDA_LIBRARY_DIRS) are mounted read-only into the root
and given to the loader, as a site that installed CUDA has them."""
import os
import sys
import unittest

from chroot_fixture import run_in_root
from dlrun_fixture import main, temp_dir
from package_fixture import make_package

INSTALL_TIMEOUT_S = 600  # mounting, apt-get update and install, the training run, man

# Runs after chroot_fixture's MOUNT_SCRIPT, with PACKAGE CUDA_DIRS as its arguments.
SCRIPT = r"""
package=$1 cuda_dirs=$2
cp "$package" "$root/tmp/"
for dir in ${cuda_dirs//:/ }; do
  mkdir -p "$root$dir"
  mount --bind -o ro "$dir" "$root$dir"
  echo "$dir" >> "$root/etc/ld.so.conf.d/cuda.conf"
done
in_root apt-get update -q
in_root apt-get install -y -q "/tmp/$(basename "$package")"
in_root ldconfig
# libslurm38: a shared library's package, pulled through the computed Depends (gRPC is linked in)
echo "dpkg: $(in_root dpkg-query -W -f='${Status} ' dataset-fashion-mnist libslurm38)"
echo "dlrun on PATH: $(in_root sh -c 'command -v dlrun')"
in_root sh -c 'cd /tmp && dlrun --standalone --nproc-per-node=2 train --epochs 1'
in_root MANWIDTH=100 man dlrun
"""


def setUpModule():
    if os.geteuid() != 0:
        print("test_package_chroot: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("debootstrap, chroot and mounts need root")


class PackageChrootTest(unittest.TestCase):
    def test_package_installs_and_trains_on_fresh_debian(self):
        scratch = temp_dir(self)
        package = make_package(os.path.join(scratch, "package"))
        code, output = run_in_root(
            "bookworm", scratch, SCRIPT,
            [package, os.environ.get("DLRUN_CUDA_LIBRARY_DIRS", "")], INSTALL_TIMEOUT_S,
            include=["man-db"])
        self.assertEqual(code, 0, output[-6000:])
        self.assertIn("dpkg: install ok installed install ok installed", output)
        self.assertIn("dlrun on PATH: /usr/bin/dlrun", output)
        self.assertRegex(output, r'\[0\]:\{"epochs": 1, .*"world_size": 2, ')
        self.assertRegex(output, r"NAME\s+dlrun - launch workers on every node")


if __name__ == "__main__":
    main()
