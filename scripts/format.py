#!/usr/bin/env python3
"""Formats the tree: its C++ (every .cpp, .h and .cu file outside build folders) with
.clang-format, its Python with ruff (ruff.toml: the format, then the lint's own fixes). With
--check it changes nothing, lists what formatting would change and what the lint finds, and exits
1 when there is one.

    python3 scripts/format.py [--check] [--clang-format PATH] [--ruff PATH] [SOURCE_DIR]

The tools default to those of the tests' venv, which scripts/setup.sh --tests pins: one version
each, so that Debian 12 and 13 (clang-format 14 and 19, which disagree) format alike."""

import argparse
import os
import subprocess
import sys

VENV_BIN = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dlrun", "venv", "bin"
)


def sources(root):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("build", ".")) and d != "__pycache__")
        yield from (
            os.path.join(top, name)
            for name in sorted(files)
            if name.endswith((".cpp", ".h", ".cu"))
        )


def check_cpp(clang_format, root):
    unformatted = []
    for path in sources(root):
        with open(path, "rb") as f:
            text = f.read()
        formatted = subprocess.run([clang_format, path], capture_output=True, check=True)
        if formatted.stdout != text:
            unformatted.append(os.path.relpath(path, root))
    for name in unformatted:
        print(f"format: {name} is not formatted (python3 scripts/format.py formats it)")
    return bool(unformatted)


def ruff(ruff_path, root, *args):
    # Build folders and the ignored rest are left out by ruff itself (.gitignore, ruff.toml).
    return subprocess.run([ruff_path, *args, "."], cwd=root).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; list what would")
    parser.add_argument("--clang-format", default=os.path.join(VENV_BIN, "clang-format"))
    parser.add_argument("--ruff", default=os.path.join(VENV_BIN, "ruff"))
    parser.add_argument(
        "root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    )
    args = parser.parse_args()
    for tool in (args.clang_format, args.ruff):
        if not os.access(tool, os.X_OK):
            sys.exit(f"format: no {os.path.basename(tool)} at {tool}: run scripts/setup.sh --tests")
    root = os.path.abspath(args.root)
    if not args.check:
        cpp = subprocess.run([args.clang_format, "-i", *sources(root)]).returncode
        return (
            cpp or ruff(args.ruff, root, "format", "-q") or ruff(args.ruff, root, "check", "--fix")
        )
    failed = check_cpp(args.clang_format, root)
    failed |= ruff(args.ruff, root, "format", "--check") != 0
    failed |= ruff(args.ruff, root, "check", "--no-fix") != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
