"""Fresh Debian roots for the tests that install into one (test_package_chroot.py,
test_quickstart_releases.py). Needs root and a Debian mirror (DLRUN_DEBIAN_MIRROR, else
deb.debian.org).

A release's base root (debootstrap --variant=minbase) is made once and kept under
DLRUN_CHROOT_CACHE (the build directory's package-chroot-cache/; made again after CACHE_DAYS),
with its downloaded .deb files beside it; each run mounts an overlay over it, so the cached root
stays pristine. Every mount is made in a mount namespace of the run's own and goes with it,
whatever happens to the run."""

import os
import shutil
import signal
import subprocess
import time

from package_fixture import build_dir

MIRROR = os.environ.get("DLRUN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE_DAYS = 7  # cached roots older than this are made again
DEBOOTSTRAP_TIMEOUT_S = 900

# The start of every run's script, run as `bash -c SCRIPT bash BASE SCRATCH ARCHIVES ARGS...`:
# the root ($root) mounted and ready, `in_root COMMAND` to run in it with a clean environment
# (VAR=value words first set more of it), the run's own ARGS left in $@.
MOUNT_SCRIPT = r"""
set -euo pipefail
base=$1 scratch=$2 archives=$3
shift 3
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
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C HOME=/root \
            DEBIAN_FRONTEND=noninteractive "$@"; }
"""


def run_bounded(args, timeout):
    """Runs args in a session of their own; on timeout kills the whole session (apt, dpkg,
    dlrun and its workers), then fails. Returns (exit code, output)."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"{args[0]} ran past {timeout} s:\n{output[-6000:]}") from None
    return proc.returncode, output


def cache_dir():
    return os.environ.get("DLRUN_CHROOT_CACHE") or os.path.join(build_dir(), "package-chroot-cache")


def base_root(release, include=()):
    """The cached minbase root of release with the packages include, made with debootstrap when
    missing or too old. Returns (root, the directory of its downloaded .deb files)."""
    cache = cache_dir()
    name = "-".join([release, "minbase", *include])
    base = os.path.join(cache, name)
    stamp = base + ".done"
    archives = os.path.join(cache, f"{release}-archives")
    os.makedirs(os.path.join(archives, "partial"), exist_ok=True)
    if os.path.exists(stamp) and time.time() - os.path.getmtime(stamp) < CACHE_DAYS * 86400:
        return base, archives
    for old in (stamp, base):
        if os.path.isdir(old):
            shutil.rmtree(old)
        elif os.path.exists(old):
            os.remove(old)
    fresh = base + ".new"
    shutil.rmtree(fresh, ignore_errors=True)
    print(f"chroot_fixture: debootstrap {release} from {MIRROR} into {base}", flush=True)
    options = ["--variant=minbase"] + ([f"--include={','.join(include)}"] if include else [])
    code, output = run_bounded(
        ["debootstrap", *options, release, fresh, MIRROR], DEBOOTSTRAP_TIMEOUT_S
    )
    if code != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        raise AssertionError(f"debootstrap exited {code}:\n{output[-6000:]}")
    os.rename(fresh, base)
    open(stamp, "w").close()
    return base, archives


def run_in_root(release, scratch, script, args, timeout, include=()):
    """Runs MOUNT_SCRIPT then script (bash) in a mount namespace of its own, over a fresh overlay
    of release's base root in scratch, with args as its $@. Returns (exit code, output)."""
    base, archives = base_root(release, include)
    return run_bounded(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "bash",
            "-c",
            MOUNT_SCRIPT + script,
            "bash",
            base,
            os.path.join(scratch, "chroot"),
            archives,
            *args,
        ],
        timeout,
    )
