"""The Debian package on a fresh Debian 12 (issue 17, acceptance 2): in a minimal bookworm root
(debootstrap --variant=minbase, with man-db), `apt-get install ./PACKAGE.deb` pulls the
package's dependencies and the recommended data from the mirror; there `dlrun --standalone
--nproc-per-node=2 train --epochs 1` runs from PATH and `man dlrun` shows the page. Needs root
and a Debian mirror (DLRUN_DEBIAN_MIRROR, else deb.debian.org).

The base root is made once and kept under DLRUN_CHROOT_CACHE (the build directory's
package-chroot-cache/; made again after CACHE_DAYS), with the downloaded .deb files beside it;
each run mounts an overlay over it, so the cached root stays pristine. Every mount is made in a
mount namespace of the run's own and goes with it, whatever happens to the run.

A CUDA build's package (dlrun-cuda) needs NVIDIA's runtime, which Debian does not ship: the
build's CUDA library directories (DLRUN_CUDA_LIBRARY_DIRS) are mounted read-only into the root
and given to the loader, as a site that installed CUDA has them."""
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

from dlrun_fixture import main, temp_dir
from package_fixture import build_dir, make_package

MIRROR = os.environ.get("DLRUN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE_DAYS = 7           # cached package lists and root older than this are made again
DEBOOTSTRAP_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 600  # mounting, apt-get update and install, the training run, man

# Runs in its own mount namespace as `bash -c SCRIPT bash BASE SCRATCH ARCHIVES PACKAGE CUDA`.
SCRIPT = r"""
set -euo pipefail
base=$1 scratch=$2 archives=$3 package=$4 cuda_dirs=$5
root=$scratch/root
mkdir -p "$scratch/upper" "$scratch/work" "$root"
mount -t overlay overlay -o "lowerdir=$base,upperdir=$scratch/upper,workdir=$scratch/work" "$root"
trap 'umount -R "$root"' EXIT  # the namespace would drop them too; nothing is left mounted
mount --bind "$root" "$root"   # / of the chroot a mount point of its own: network namespaces
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount -t tmpfs shm "$root/dev/shm"
mount --bind "$archives" "$root/var/cache/apt/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' > "$root/etc/hosts"
cp "$package" "$root/tmp/"
for dir in ${cuda_dirs//:/ }; do
  mkdir -p "$root$dir"
  mount --bind -o ro "$dir" "$root$dir"
  echo "$dir" >> "$root/etc/ld.so.conf.d/cuda.conf"
done
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C MANWIDTH=100 \
            DEBIAN_FRONTEND=noninteractive "$@"; }
in_root apt-get update -q
in_root apt-get install -y -q "/tmp/$(basename "$package")"
in_root ldconfig
# libslurm38: a shared library's package, pulled through the computed Depends (gRPC is linked in)
echo "dpkg: $(in_root dpkg-query -W -f='${Status} ' dataset-fashion-mnist libslurm38)"
echo "dlrun on PATH: $(in_root sh -c 'command -v dlrun')"
in_root sh -c 'cd /tmp && dlrun --standalone --nproc-per-node=2 train --epochs 1'
in_root man dlrun
"""


def run_bounded(args, timeout):
    """Runs args in a session of their own; on timeout kills the whole session (apt, dpkg,
    dlrun and its workers), then fails. Returns (exit code, output)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{args[0]} ran past {timeout} s:\n{output[-6000:]}")
    return proc.returncode, output


def base_root():
    """The cached bookworm root, made with debootstrap when missing or too old."""
    cache = os.environ.get("DLRUN_CHROOT_CACHE",
                           os.path.join(build_dir(), "package-chroot-cache"))
    base = os.path.join(cache, "bookworm-minbase")
    stamp = os.path.join(cache, "bookworm-minbase.done")
    os.makedirs(os.path.join(cache, "archives", "partial"), exist_ok=True)
    if os.path.exists(stamp) and time.time() - os.path.getmtime(stamp) < CACHE_DAYS * 86400:
        return base, os.path.join(cache, "archives")
    for old in (stamp, base):
        if os.path.isdir(old):
            shutil.rmtree(old)
        elif os.path.exists(old):
            os.remove(old)
    fresh = base + ".new"
    shutil.rmtree(fresh, ignore_errors=True)
    print(f"test_package_chroot: debootstrap bookworm from {MIRROR} into {base}", flush=True)
    code, output = run_bounded(["debootstrap", "--variant=minbase", "--include=man-db",
                                "bookworm", fresh, MIRROR], DEBOOTSTRAP_TIMEOUT_S)
    if code != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        raise AssertionError(f"debootstrap exited {code}:\n{output[-6000:]}")
    os.rename(fresh, base)
    open(stamp, "w").close()
    return base, os.path.join(cache, "archives")


def setUpModule():
    if os.geteuid() != 0:
        print("test_package_chroot: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("debootstrap, chroot and mounts need root")


class PackageChrootTest(unittest.TestCase):
    def test_package_installs_and_trains_on_fresh_debian(self):
        base, archives = base_root()
        scratch = temp_dir(self)
        package = make_package(os.path.join(scratch, "package"))
        code, output = run_bounded(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", SCRIPT, "bash",
             base, os.path.join(scratch, "chroot"), archives, package,
             os.environ.get("DLRUN_CUDA_LIBRARY_DIRS", "")], INSTALL_TIMEOUT_S)
        self.assertEqual(code, 0, output[-6000:])
        self.assertIn("dpkg: install ok installed install ok installed", output)
        self.assertIn("dlrun on PATH: /usr/bin/dlrun", output)
        self.assertRegex(output, r'\[0\]:\{"epochs": 1, .*"world_size": 2, ')
        self.assertRegex(output, r"NAME\s+dlrun - launch workers on every node")


if __name__ == "__main__":
    main()
