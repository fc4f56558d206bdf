"""Fresh Debian roots for the tests that install into one (test_package_chroot.py,
test_quickstart_releases.py). Needs root and a Debian mirror (DLRUN_DEBIAN_MIRROR, else
deb.debian.org).

A release's base root (debootstrap --variant=minbase) is made once and kept under roots_dir()
(made again after CACHE_DAYS): DLRUN_CHROOT_CACHE, else the user's cache, so that a fresh clone's
build reuses the roots an earlier one made (a debootstrap takes a minute or two, each chroot test
needs one or two). The downloaded .deb files, which apt locks while a run installs, stay with the
build (cache_dir()). Each run mounts an overlay over the base root, so the cached root stays
pristine, and holds a shared lock on it, so it is not made again under a run of another build.
Every mount is made in a mount namespace of the run's own and goes with it, whatever happens to
the run."""

import contextlib
import fcntl
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
    """This build's caches: the .deb files apt downloads, quickstart's ccache and pip caches."""
    return os.environ.get("DLRUN_CHROOT_CACHE") or os.path.join(build_dir(), "package-chroot-cache")


def roots_dir():
    """The base roots: DLRUN_CHROOT_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dlrun/chroot-roots."""
    if os.environ.get("DLRUN_CHROOT_CACHE"):
        return os.environ["DLRUN_CHROOT_CACHE"]
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(user_cache, "dlrun", "chroot-roots")


@contextlib.contextmanager
def base_root(release, include=()):
    """The cached minbase root of release with the packages include, made with debootstrap when
    missing or too old, held (a shared lock) while the block runs. Yields (root, the directory
    of the build's downloaded .deb files)."""
    name = "-".join([release, "minbase", *include])
    os.makedirs(roots_dir(), exist_ok=True)
    base = os.path.join(roots_dir(), name)
    archives = os.path.join(cache_dir(), f"{release}-archives")
    os.makedirs(os.path.join(archives, "partial"), exist_ok=True)
    with open(base + ".lock", "w") as lock:
        # Made under an exclusive lock: not twice at once, nor while a run of another build
        # has it mounted; then shared, as every run holds it. A root another run holds is used
        # as it is, even past CACHE_DAYS (a run may hold it for hours: the whole suite's). One
        # shared once it was there whose remaking then failed (another build's debootstrap) is
        # made here.
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                exclusive = True
            except BlockingIOError:
                exclusive = not os.path.exists(base + ".done")  # else made: wait to share it
                fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            if exclusive:
                make_root(release, include, base)
                fcntl.flock(lock, fcntl.LOCK_SH)
            if os.path.exists(base + ".done"):
                break
            fcntl.flock(lock, fcntl.LOCK_UN)
        yield base, archives


def make_root(release, include, base):
    """debootstrap of base unless it is there and younger than CACHE_DAYS."""
    stamp = base + ".done"
    if os.path.exists(stamp) and time.time() - os.path.getmtime(stamp) < CACHE_DAYS * 86400:
        return
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


def run_in_root(release, scratch, script, args, timeout, include=()):
    """Runs MOUNT_SCRIPT then script (bash) in a mount namespace of its own, over a fresh overlay
    of release's base root in scratch, with args as its $@. Returns (exit code, output)."""
    with base_root(release, include) as (base, archives):
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
