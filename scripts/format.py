#!/usr/bin/env python3
"""Formats the tree's C++ (every .cpp, .h and .cu file outside build folders) with .clang-format, or with --check
lists the files that formatting would change and exits 1 when there is one.

    python3 scripts/format.py [--check] [--clang-format PATH] [SOURCE_DIR]

PATH defaults to the clang-format of the tests' venv, which scripts/setup.sh --tests pins: one
version, so that Debian 12 and 13 (clang-format 14 and 19, which disagree) format alike."""
import argparse
import os
import subprocess
import sys


VENV_CLANG_FORMAT = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                 "dlrun", "venv", "bin", "clang-format")


def sources(root):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("build", ".")) and d != "__pycache__")
        yield from (os.path.join(top, name) for name in sorted(files)
                    if name.endswith((".cpp", ".h", ".cu")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; list what would")
    parser.add_argument("--clang-format", default=VENV_CLANG_FORMAT, dest="clang_format")
    parser.add_argument("root", nargs="?",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parser.parse_args()
    if not os.access(args.clang_format, os.X_OK):
        sys.exit(f"format: no clang-format at {args.clang_format}: run scripts/setup.sh --tests")
    files = list(sources(os.path.abspath(args.root)))
    if not args.check:
        return subprocess.run([args.clang_format, "-i", *files]).returncode
    unformatted = []
    for path in files:
        with open(path, "rb") as f:
            text = f.read()
        formatted = subprocess.run([args.clang_format, path], capture_output=True, check=True)
        if formatted.stdout != text:
            unformatted.append(os.path.relpath(path, args.root))
    for name in unformatted:
        print(f"format: {name} is not formatted (python3 scripts/format.py formats it)")
    return 1 if unformatted else 0


if __name__ == "__main__":
    sys.exit(main())
