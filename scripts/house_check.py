#!/usr/bin/env python3
"""The house rules that can be counted (ARCHITECTURE.md section 1): no source file over 600
lines (C++, Python, shell; tests/ and bench/ too), no C++ function outside them over 120, and no
ConfigError raised by the launch (every check runs in the parser; launcher/launch.cpp throws
none); a C++ file that calls an algorithm of <algorithm> includes it itself (GCC 14's
headers, Debian 13's, bring it with fewer others than GCC 12's: a file that builds on Debian 12
by a header's chance fails there). And the map stays whole: every source file outside tests/ is
named by its path (store/wire.cpp) in ARCHITECTURE.md or a page of docs/design/, so a new file
is placed where the next reader looks; and every path they name exists, so a file moved or gone
leaves no stale pointer. The docs do not drift either: every relative link of README.md,
ARCHITECTURE.md and docs/ reaches a file, and a heading where it names one; docs/benchmarks.md's
index lists every section, newest first, each with the date of its section's latest figure;
every folder of the map's table exists, and every folder of the tree is in it. Prints each
breach on a line and exits 1 when there is one.

    python3 scripts/house_check.py [SOURCE_DIR]

A function is counted from its signature at the start of a line (not indented) to the closing
brace at the start of a line: the shape of every function the tree defines outside a class."""

import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120
NOT_SOURCES = {".git", "__pycache__"}
SKIP_DIRS = {"tests", "bench", *NOT_SOURCES}  # the map and the function rule leave them out
SIGNATURE = re.compile(r"^[A-Za-z_].*\)\s*(const\s*)?(override\s*)?(noexcept\s*)?(->.*)?\{\s*$")
OPENING = re.compile(r"^[A-Za-z_][^;]*[(,]\s*$")
NOT_A_FUNCTION = (
    "namespace",
    "class",
    "struct",
    "enum",
    "union",
    "using",
    "template",
    "#",
    "extern",
)
# The files the map must name, and the paths it may name: a top-level folder of the tree, then a
# file name with an extension (not preceded by a path character, so share/dlrun/python/x.py in
# an install path is no tree path).
NAMED_EXTENSIONS = (".cpp", ".h", ".cu", ".py", ".sh", ".proto")
TOP_FOLDERS = (
    "agents",
    "bench",
    "cmake",
    "common",
    "control",
    "docs",
    "examples",
    "launcher",
    "metrics",
    "mpi",
    "packaging",
    "proto",
    "python",
    "remote",
    "rendezvous",
    "scripts",
    "slurm",
    "store",
    "tests",
    "trainer",
)
# Folders that hold no part of the program: the docs themselves, and examples for users.
UNMAPPED_FOLDERS = {"docs", "examples", "__pycache__"}
PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(TOP_FOLDERS)})/[\w./-]*\.[A-Za-z0-9]+\b")


CPP = (".cpp", ".h", ".cu")
# The <algorithm> functions the tree calls, or may: std::remove and std::copy are left out (the
# names of <cstdio>'s and of <iterator>'s too).
ALGORITHM = re.compile(
    r"\bstd::(?:ranges::)?(?:sort|stable_sort|partial_sort|nth_element|find|find_if|find_if_not|"
    r"any_of|all_of|none_of|count|count_if|remove_if|unique|reverse|rotate|lower_bound|upper_bound|"
    r"equal_range|binary_search|transform|fill|fill_n|copy_if|copy_n|equal|mismatch|search|"
    r"min_element|max_element|minmax_element|clamp|set_difference|set_intersection|includes|"
    r"partition|shuffle|max|min)\b"
)


def sources(root, skip=SKIP_DIRS):
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith(("build", ".")))
        for name in sorted(files):
            if name.endswith((*CPP, ".py", ".sh")):
                yield os.path.join(top, name)


def map_pages(root):
    yield os.path.join(root, "ARCHITECTURE.md")
    design = os.path.join(root, "docs", "design")
    for name in sorted(os.listdir(design)) if os.path.isdir(design) else []:
        if name.endswith(".md"):
            yield os.path.join(design, name)


def map_breaches(root):
    """Source files outside tests/ that the map and the design pages do not name, and the paths
    they name that do not exist."""
    named = set()
    for page in map_pages(root):
        with open(page, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for path in PATH.findall(line):
                    path = path.rstrip(".")
                    named.add(path)
                    if not os.path.exists(os.path.join(root, path)):
                        yield (
                            f"{os.path.relpath(page, root)}:{number}: names {path}, "
                            "which is not in the tree"
                        )
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(("build", ".", "__pycache__"))
            and not (top == root and d == "tests")
        )
        for name in sorted(files):
            path = os.path.relpath(os.path.join(top, name), root)
            if name.endswith(NAMED_EXTENSIONS) and path not in named:
                yield f"{path}: named in neither ARCHITECTURE.md nor docs/design/"


LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def doc_pages(root):
    yield os.path.join(root, "README.md")
    yield os.path.join(root, "ARCHITECTURE.md")
    for top, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(top, name)


def prose(path):
    """(number, line) of a Markdown page outside its code blocks."""
    with open(path, encoding="utf-8") as f:
        inside = False
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                inside = not inside
            elif not inside:
                yield number, line


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path):
    return {slug(line.lstrip("#")) for _, line in prose(path) if line.startswith("#")}


def link_breaches(root):
    """Relative links that reach no file, or no heading of the page they name."""
    known = {}
    for page in doc_pages(root):
        for number, line in prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                where = f"{os.path.relpath(page, root)}:{number}"
                if not os.path.exists(full):
                    yield f"{where}: links {target}, which is not in the tree"
                elif anchor and full.endswith(".md"):
                    if full not in known:
                        known[full] = anchors(full)
                    if anchor not in known[full]:
                        yield f"{where}: links {target}, a heading its page does not have"


def index_breaches(root):
    """docs/benchmarks.md's index against its sections."""
    page = os.path.join(root, "docs", "benchmarks.md")
    rows, sections, current = [], {}, None
    for number, line in prose(page):
        row = re.match(r"^\| \[.*\]\(#([^)]+)\) \| (\d{4}-\d{2}-\d{2}) \|", line)
        if row:
            rows.append((number, row.group(1), row.group(2)))
        elif line.startswith("## "):
            current = slug(line[3:])
            sections[current] = None
        elif current and sections[current] is None and line.startswith("Latest:"):
            found = DATE.search(line)
            sections[current] = found.group(0) if found else None
    listed = {anchor for _, anchor, _ in rows}
    for number, anchor, date in rows:
        if anchor in sections and sections[anchor] != date:
            yield (
                f"docs/benchmarks.md:{number}: the index dates #{anchor} {date}, its "
                f"section's latest figure {sections[anchor]}"
            )
    for (number, _, date), (_, _, before) in zip(rows[1:], rows):
        if date > before:
            yield f"docs/benchmarks.md:{number}: the index is not newest first"
    for anchor in sections:
        if anchor not in listed:
            yield f"docs/benchmarks.md: section #{anchor} is not in the index"


def folder_breaches(root):
    """The map's table of folders against the tree's folders."""
    named = set()
    for _, line in prose(os.path.join(root, "ARCHITECTURE.md")):
        if line.startswith("| `"):
            named.update(f.rstrip("/") for f in re.findall(r"`([\w/]+)/`", line.split("|")[1]))
    for folder in sorted(named):
        if not os.path.isdir(os.path.join(root, folder)):
            yield f"ARCHITECTURE.md: its table names {folder}/, which is not in the tree"
    for name in sorted(os.listdir(root)):
        if (
            os.path.isdir(os.path.join(root, name))
            and not name.startswith((".", "build"))
            and name not in named
            and name not in UNMAPPED_FOLDERS
        ):
            yield f"{name}/: a folder the table of ARCHITECTURE.md section 1 does not name"


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
    root = os.path.abspath(
        sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    )
    breaches = []
    for path in sources(root, NOT_SOURCES):
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        name = os.path.relpath(path, root)
        if len(lines) - 1 > MAX_FILE_LINES:
            breaches.append(f"{name}: {len(lines) - 1} lines (at most {MAX_FILE_LINES})")
        if path.endswith(CPP) and "#include <algorithm>" not in lines:
            calls = [n for n, line in enumerate(lines, 1) if ALGORITHM.search(line.split("//")[0])]
            if calls:
                breaches.append(f"{name}:{calls[0]}: calls <algorithm> without including it")
        counted = path.endswith(CPP) and name.split(os.sep)[0] not in SKIP_DIRS
        for first, length in long_functions(lines) if counted else ():
            breaches.append(
                f"{name}:{first}: a function of {length} lines (at most {MAX_FUNCTION_LINES})"
            )
    with open(os.path.join(root, "launcher", "launch.cpp"), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if "ConfigError(" in line:
                breaches.append(f"launcher/launch.cpp:{number}: a ConfigError after the parser")
    breaches.extend(map_breaches(root))
    breaches.extend(link_breaches(root))
    breaches.extend(index_breaches(root))
    breaches.extend(folder_breaches(root))
    for breach in breaches:
        print(f"house_check: {breach}")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
