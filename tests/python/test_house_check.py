"""scripts/house_check.py catches the docs' drift (issue 59): a link to a file or a heading that
is not there, benchmarks.md's index with a wrong date, out of order or missing a section, and a
folder of the tree the map's table does not name, or one it names that is gone; and a Python
file over 600 lines (the rule C++ files had alone before), a test's too. Each on a small tree of
its own, so the check is seen to fail, not only to pass on ours. And a C++ file that calls an
algorithm of <algorithm> without including it (it builds on Debian 12 by chance, not on 13)."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "house_check.py")

FILES = {
    "README.md": "# T\n\nsee [a](docs/x.md#nope), [b](docs/missing.md), [c](docs/x.md#real-one)\n",
    "docs/x.md": "# X\n\n```\n## not a heading\n```\n\n## Real one\n",
    "ARCHITECTURE.md": (
        "| `docs/` | x |\n| `gone/` | y |\n"
        "| `launcher/` | `launcher/launch.cpp`, `launcher/long.py` |\n| `tests/` | z |\n"
    ),
    "docs/benchmarks.md": (
        "# B\n\n| [S](#s-one) | 2026-01-02 |\n| [T](#t) | 2026-01-03 |\n\n"
        "## S one\n\nLatest: 2026-01-01.\n\n## U\n\nLatest: 2026-01-01.\n"
    ),
    "launcher/launch.cpp": "",
    "launcher/long.py": "pass\n" * 601,
    "tests/long_test.py": "pass\n" * 601,
    "tests/sorts_test.cpp": (
        "#include <vector>\n// std::sort in a comment\nvoid f(std::vector<int>& v) {\n"
        "  std::sort(v.begin(), v.end());\n}\n"
    ),
    "tests/sorted_test.cpp": "#include <algorithm>\nvoid f(int* v) { std::sort(v, v + 2); }\n",
    "extra/keep": "",
}


class HouseCheckTest(unittest.TestCase):
    def test_each_kind_of_drift_is_named(self):
        with tempfile.TemporaryDirectory() as root:
            for name, text in FILES.items():
                os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
                with open(os.path.join(root, name), "w") as f:
                    f.write(text)
            done = subprocess.run(
                [sys.executable, SCRIPT, root], capture_output=True, text=True, timeout=60
            )
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        said = done.stdout.splitlines()
        expected = [
            "README.md:3: links docs/x.md#nope, a heading its page does not have",
            "README.md:3: links docs/missing.md, which is not in the tree",
            "docs/benchmarks.md:4: links #t, a heading its page does not have",
            "docs/benchmarks.md:3: the index dates #s-one 2026-01-02, its section's latest "
            "figure 2026-01-01",
            "docs/benchmarks.md:4: the index is not newest first",
            "docs/benchmarks.md: section #u is not in the index",
            "ARCHITECTURE.md: its table names gone/, which is not in the tree",
            "extra/: a folder the table of ARCHITECTURE.md section 1 does not name",
            "launcher/long.py: 601 lines (at most 600)",
            "tests/long_test.py: 601 lines (at most 600)",
            "tests/sorts_test.cpp:4: calls <algorithm> without including it",
        ]
        for line in expected:
            self.assertIn("house_check: " + line, said)
        self.assertEqual(len(said), len(expected), said)


if __name__ == "__main__":
    unittest.main()
