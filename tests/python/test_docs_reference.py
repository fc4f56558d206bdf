"""The reference pages cannot drift from the programs (issue 59): the flag lists of
docs/reference/dlrun.md, dlrund.md and dlrun-train.md are what scripts/reference.py writes from
the build's `--help` (its --check, which names the page and the first line that differs), and
the table of `--rdzv-conf` keys in dlrun.md names every key the parser takes, and no other: the
keys launcher/launch_cli_values.cpp compares against, and those dlrun lists when refusing an
unknown one.
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

from dlrun_fixture import clean_env, dlrun_binary, main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "reference.py")
PARSER = os.path.join(ROOT, "launcher", "launch_cli_values.cpp")
PAGE = os.path.join(ROOT, "docs", "reference", "dlrun.md")
TABLE_HEADING = "## `--rdzv-conf` keys"


def table_keys():
    """The keys the page's `--rdzv-conf` table names in its first column."""
    keys, inside = set(), False
    with open(PAGE, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                inside = line.strip() == TABLE_HEADING
            elif inside and line.startswith("| `"):
                keys.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return keys


def parser_keys():
    """The keys parseRdzvSettings takes: each `key == "..."` (or `!=`, torchrun's ignored ones)
    and each of the etcd settings' table."""
    with open(PARSER, encoding="utf-8") as f:
        source = f.read()
    start = source.index("RdzvSettings parseRdzvSettings(")
    body = source[source.rindex("std::string RdzvSettings::*etcdText", 0, start) :]
    body = body[: body.index("\n}\n", body.index("RdzvSettings parseRdzvSettings(")) + 2]
    keys = set(re.findall(r'\bkey [!=]= "(\w+)"', body))
    keys.update(re.findall(r'\{"(\w+)", &RdzvSettings::', body))
    return keys


def listed_keys():
    """The keys dlrun names when it refuses an unknown one."""
    env = clean_env()
    with tempfile.TemporaryDirectory(prefix="dlrun-reference-") as cwd:
        command = [
            dlrun_binary(),
            "--standalone",
            "--no-slurm",
            "--rdzv-conf=no_such_key_59=1",
            "true",
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=30, env=env, cwd=cwd, check=False
        )
    found = re.search(r"unknown key 'no_such_key_59' \(known: ([\w, ]+)\)", done.stderr)
    if done.returncode != 2 or not found:
        raise AssertionError(
            f"dlrun did not refuse an unknown --rdzv-conf key as expected "
            f"(exit {done.returncode}): {done.stderr.strip()}"
        )
    return {key.strip() for key in found.group(1).split(",")}


class DocsReferenceTest(unittest.TestCase):
    def test_flag_lists_are_what_help_says(self):
        bindir = os.path.dirname(os.path.abspath(dlrun_binary()))
        for program in ("dlrund", "dlrun-train"):
            self.assertTrue(
                os.access(os.path.join(bindir, program), os.X_OK),
                f"{program} is not beside dlrun in {bindir}",
            )
        done = subprocess.run(
            [sys.executable, SCRIPT, "--check", "--bindir", bindir],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(done.returncode, 0, f"{done.stdout}{done.stderr}")

    def test_rdzv_conf_table_names_the_parsers_keys(self):
        documented, accepted, listed = table_keys(), parser_keys(), listed_keys()
        self.assertGreaterEqual(len(accepted), len(listed), f"read no keys from {PARSER}")
        self.assertEqual(
            sorted(listed - accepted), [], f"dlrun lists keys that {PARSER} was not read to take"
        )
        self.assertEqual(
            sorted(accepted - documented),
            [],
            f"docs/reference/dlrun.md's {TABLE_HEADING} does not name these keys",
        )
        self.assertEqual(
            sorted(documented - accepted),
            [],
            f"docs/reference/dlrun.md's {TABLE_HEADING} names keys dlrun refuses",
        )


if __name__ == "__main__":
    main()
