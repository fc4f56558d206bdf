#!/usr/bin/env python3
"""The whole test suite where the README's set-up runs on a fresh machine: in a minimal root of a
Debian release (debootstrap --variant=minbase, cached by tests/python/chroot_fixture.py) with
the tree of a commit (default HEAD, DLRUN_COMMIT) copied in and no git, `bash scripts/test.sh`,
as root. As on a machine, the machine's /sys (with its cgroup mounts, which slurmd reads), a
/dev/pts and a tmpfs /run are mounted in the root, /tmp is a folder of the machine's disk and
the machine's name resolves; and as on a fresh machine of the same site, the machine's pip
configuration (/etc/pip.conf and the local wheel folders under /opt it names) and extra
certificate authorities (/usr/local/share/ca-certificates) are carried in. Prints the end of
the suite's output and exits with test.sh's code. Needs root, a Debian mirror and PyPI; takes
some 40 minutes on 2 cores (the release's ccache, kept beside the cached roots, shortens the
build).

    sudo python3 scripts/suite_in_fresh_root.py [bookworm|trixie] [LOG]

DLRUN_BUILD_DIR names a configured build of this tree (default: build/), under which the roots
are cached (package-chroot-cache/)."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
os.environ.setdefault("DLRUN_BUILD_DIR", os.path.join(ROOT, "build"))
os.environ.setdefault("DLRUN_SOURCE_DIR", ROOT)

from chroot_fixture import cache_dir, run_in_root  # noqa: E402

RUN_TIMEOUT_S = 2 * 3600

# Runs after chroot_fixture's MOUNT_SCRIPT, with SOURCE CCACHE as its arguments.
SCRIPT = r"""
source=$1 ccache=$2
mkdir -p "$root/src" "$root/ccache"
mount --bind "$source" "$root/src"
mount --bind "$ccache" "$root/ccache"
mount --rbind /sys "$root/sys"  # with the machine's cgroup mounts: slurmd reads them
mkdir -p "$root/dev/pts" && mount -t devpts devpts "$root/dev/pts"
mount -t tmpfs run "$root/run"
# /tmp on the machine's own disk, as on a machine: tests make overlay roots there, and an
# overlay's upper directory cannot lie on another overlay (the root is one).
mkdir -p "$scratch/tmp" && chmod 1777 "$scratch/tmp" && mount --bind "$scratch/tmp" "$root/tmp"
# The machine's name resolves, as on a machine (slurmd looks its own up).
echo "127.0.1.1 $(hostname)" >> "$root/etc/hosts"
if [[ -f /etc/pip.conf ]]; then
  cp /etc/pip.conf "$root/etc/pip.conf"
  for d in $(grep -oE '/opt/[A-Za-z0-9._/-]+' /etc/pip.conf | sed -E 's#^(/opt/[^/]+).*#\1#' | sort -u); do
    [[ -d $d ]] && mkdir -p "$root$d" && mount --bind "$d" "$root$d"
  done
fi
mkdir -p "$root/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
if in_root sh -c "command -v git" >/dev/null; then echo "git is installed in the root"; exit 3; fi
in_root CCACHE_DIR=/ccache sh -c 'cd /src && bash scripts/test.sh'
"""


def main():
    release = sys.argv[1] if len(sys.argv) > 1 else "bookworm"
    log = sys.argv[2] if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory(prefix="dlrun-fresh-root-") as scratch:
        source = os.path.join(scratch, "src")
        os.makedirs(source)
        commit = os.environ.get("DLRUN_COMMIT", "HEAD")
        archive = subprocess.run(["git", "-C", ROOT, "archive", commit], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
        ccache = os.path.join(cache_dir(), f"{release}-ccache")
        os.makedirs(ccache, exist_ok=True)
        code, output = run_in_root(release, scratch, SCRIPT, [source, ccache], RUN_TIMEOUT_S)
    if log:
        with open(log, "w") as f:
            f.write(output)
    print(output[-8000:])
    print(f"suite_in_fresh_root: {release}: scripts/test.sh exited {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
