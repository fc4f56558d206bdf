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
some 40 minutes on 2 cores (the release's ccache and pip cache, kept in the build directory,
shorten the build and the set-up).

    sudo python3 scripts/suite_in_fresh_root.py [bookworm|trixie] [LOG] [-- CTEST_ARGS...]

CTEST_ARGS go to test.sh, which hands them to ctest (`-- -R python_slurm`: the set-up whole, then
that test alone).

DLRUN_BUILD_DIR names a configured build of this tree (default: build/), under which the ccache
and pip caches are kept (package-chroot-cache/); the roots are cached in the user's cache
(tests/python/chroot_fixture.py)."""

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

# Runs after chroot_fixture's MOUNT_SCRIPT, with SOURCE CCACHE PIPCACHE CTEST_ARGS... as its
# arguments.
SCRIPT = r"""
source=$1 ccache=$2 pipcache=$3
shift 3
mkdir -p "$root/src" "$root/ccache" "$root/root/.cache/pip"
mount --bind "$source" "$root/src"
mount --bind "$ccache" "$root/ccache"
# pip's download cache, as ccache: a second run fetches no wheel again (on Debian 13's Python
# 3.13 the tests' torch 2.13 is PyPI's build with CUDA's libraries, some GB).
mount --bind "$pipcache" "$root/root/.cache/pip"
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
  for d in $(grep -oE '/opt/[A-Za-z0-9._/-]+' /etc/pip.conf |
             sed -E 's#^(/opt/[^/]+).*#\1#' | sort -u); do
    [[ -d $d ]] && mkdir -p "$root$d" && mount --bind "$d" "$root$d"
  done
fi
mkdir -p "$root/usr/local/share/ca-certificates"
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null ||
  true
if in_root sh -c "command -v git" >/dev/null; then echo "git is installed in the root"; exit 3; fi
in_root CCACHE_DIR=/ccache bash -c 'cd /src && bash scripts/test.sh "$@"' bash "$@"
"""


def main():
    args = sys.argv[1:]
    ctest_args = args[args.index("--") + 1 :] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    release = args[0] if args else "bookworm"
    log = args[1] if len(args) > 1 else None
    with tempfile.TemporaryDirectory(prefix="dlrun-fresh-root-") as scratch:
        source = os.path.join(scratch, "src")
        os.makedirs(source)
        commit = os.environ.get("DLRUN_COMMIT", "HEAD")
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", commit], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
        caches = [os.path.join(cache_dir(), f"{release}-{name}") for name in ("ccache", "pip")]
        for cache in caches:
            os.makedirs(cache, exist_ok=True)
        code, output = run_in_root(
            release, scratch, SCRIPT, [source, *caches, *ctest_args], RUN_TIMEOUT_S
        )
    if log:
        with open(log, "w") as f:
            f.write(output)
    print(output[-8000:])
    print(f"suite_in_fresh_root: {release}: scripts/test.sh exited {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
