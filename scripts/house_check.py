#!/usr/bin/env python3
"""The house rules that can be counted (ARCHITECTURE.md section 1): no source file outside
tests/ and bench/ over 600 lines, no function over 120, and no ConfigError raised by the launch
(every check runs in the parser; launcher/launch.cpp throws none). Prints each breach on a line
and exits 1 when there is one.

    python3 scripts/house_check.py [SOURCE_DIR]

A function is counted from its signature at the start of a line (not indented) to the closing
brace at the start of a line: the shape of every function the tree defines outside a class."""
import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120
SKIP_DIRS = {"tests", "bench", ".git", "__pycache__"}
SIGNATURE = re.compile(r"^[A-Za-z_].*\)\s*(const\s*)?(override\s*)?(noexcept\s*)?(->.*)?\{\s*$")
OPENING = re.compile(r"^[A-Za-z_][^;]*[(,]\s*$")
NOT_A_FUNCTION = ("namespace", "class", "struct", "enum", "union", "using", "template", "#",
                  "extern")


def sources(root):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs
                         if d not in SKIP_DIRS and not d.startswith(("build", ".")))
        for name in sorted(files):
            if name.endswith((".cpp", ".h", ".cu")):
                yield os.path.join(top, name)


def long_functions(lines):
    """(first line, length) of each function over MAX_FUNCTION_LINES."""
    i = 0
    while i < len(lines):
        line = lines[i]
        start = i
        if line.startswith(NOT_A_FUNCTION) or not (SIGNATURE.match(line) or OPENING.match(line)):
            i += 1
            continue
        while i < len(lines) and not lines[i].rstrip().endswith(("{", ";")):
            i += 1
        if i >= len(lines) or lines[i].rstrip().endswith(";"):
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        if end - start + 1 > MAX_FUNCTION_LINES:
            yield start + 1, end - start + 1
        i = end + 1


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    breaches = []
    for path in sources(root):
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        name = os.path.relpath(path, root)
        if path.endswith(".cpp") and len(lines) - 1 > MAX_FILE_LINES:
            breaches.append(f"{name}: {len(lines) - 1} lines (at most {MAX_FILE_LINES})")
        for first, length in long_functions(lines):
            breaches.append(f"{name}:{first}: a function of {length} lines "
                            f"(at most {MAX_FUNCTION_LINES})")
    with open(os.path.join(root, "launcher", "launch.cpp"), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if "ConfigError(" in line:
                breaches.append(f"launcher/launch.cpp:{number}: a ConfigError after the parser")
    for breach in breaches:
        print(f"house_check: {breach}")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
