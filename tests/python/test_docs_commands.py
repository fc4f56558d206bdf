"""The documentation's commands work (issue 43): every shell block of README.md and docs/**/*.md
marked runnable (its fence opens with "```sh runnable") is extracted from the files and run, so
the commands shown cannot drift from the programs. Each block runs under `bash -euo pipefail` in
a fresh temporary directory, with the build's programs first on PATH, a clean environment and a
deadline, in a session of its own: it must exit 0 and leave no process of its session behind.
A failure names the block's file and line.

Also: the README has runnable blocks, every fence that says "runnable" is spelt as the test reads
it, and every long flag that `dlrun --help` (and its status, events and stop), `dlrund --help`
and `dlrun-train --help` print is named in that program's reference page, so the reference
cannot drift either.
"""

import glob
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from dlrun_fixture import clean_env, dlrun_binary, main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FENCE = "```sh runnable"
BLOCK_TIMEOUT_S = 120  # the slowest block trains a few seconds; a hung one fails here
REFERENCE = {  # a program's --help -> its reference page
    ("dlrun", "--help"): "docs/reference/dlrun.md",
    ("dlrun", "status", "--help"): "docs/reference/dlrun.md",
    ("dlrun", "events", "--help"): "docs/reference/dlrun.md",
    ("dlrun", "stop", "--help"): "docs/reference/dlrun.md",
    ("dlrun", "top", "--help"): "docs/reference/dlrun.md",
    ("dlrun", "logs", "--help"): "docs/reference/dlrun.md",
    ("dlrund", "--help"): "docs/reference/dlrund.md",
    ("dlrun-train", "--help"): "docs/reference/dlrun-train.md",
}


def markdown_files():
    """README.md and every page under docs/, as paths relative to the source root."""
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return ["README.md"] + [os.path.relpath(page, ROOT) for page in pages]


def runnable_blocks(relpath):
    """[(line of the opening fence, the block's text)] of one file's runnable blocks."""
    blocks, body, start = [], None, 0
    with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if body is None:
                if line.strip() == FENCE:
                    body, start = [], number
            elif line.strip() == "```":
                blocks.append((start, "\n".join(body) + "\n"))
                body = None
            else:
                body.append(line)
    if body is not None:
        raise AssertionError(f"{relpath}:{start}: a runnable block is never closed")
    return blocks


def session_processes(sid):
    """PIDs of the processes still in session `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:  # state ppid pgrp session
            pids.append(int(entry))
    return pids


def kill_session(sid):
    """SIGKILLs what is left of a session this test started, by PID; returns those PIDs."""
    left = session_processes(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def program_env():
    """The blocks' environment: a clean one with the build's programs first on PATH."""
    bindir = os.path.dirname(os.path.abspath(dlrun_binary()))
    env = clean_env()
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    return env, bindir


def run_block(relpath, line, text):
    env, _ = program_env()
    with tempfile.TemporaryDirectory(prefix="dlrun-docs-") as workdir:
        script = os.path.join(workdir, ".block.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(text)
        env["HOME"] = workdir
        # output to a file, not a pipe: a process left behind holding it must not stall the test
        with open(os.path.join(workdir, ".output"), "w+b") as out:
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", script],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=BLOCK_TIMEOUT_S)
                timed_out = False
            except subprocess.TimeoutExpired:
                kill_session(proc.pid)
                proc.wait()
                timed_out = True
            # what the block started must be gone once it ended (a moment for SIGTERMed ones)
            deadline = time.monotonic() + 5
            while session_processes(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            out.seek(0)
            output = out.read()
            left = kill_session(proc.pid)
    tail = output.decode(errors="replace")[-4000:]
    where = f"{relpath}:{line}"
    if timed_out:
        raise AssertionError(
            f"{where}: the block ran past {BLOCK_TIMEOUT_S} s\n{text}\n--- output ---\n{tail}"
        )
    if proc.returncode != 0:
        raise AssertionError(
            f"{where}: the block exited {proc.returncode}\n{text}\n--- output ---\n{tail}"
        )
    if left:
        raise AssertionError(f"{where}: the block left processes behind ({left})\n{text}")


class DocsCommandsTest(unittest.TestCase):
    def test_readme_has_runnable_blocks(self):
        self.assertGreaterEqual(
            len(runnable_blocks("README.md")), 1, f"README.md has no {FENCE} block"
        )

    def test_every_runnable_fence_is_spelt_as_read(self):
        for relpath in markdown_files():
            with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.lstrip().startswith("```") and "runnable" in line:
                        self.assertEqual(
                            line.strip(), FENCE, f"{relpath}:{number}: write the fence as {FENCE}"
                        )

    def test_reference_names_every_flag(self):
        _, bindir = program_env()
        for command, page in REFERENCE.items():
            help_text = subprocess.run(
                [os.path.join(bindir, command[0]), *command[1:]],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            flags = set()
            for line in help_text.splitlines():
                if re.match(r"^ {1,4}-", line):  # an option's line, not a description's (deeper)
                    head = re.split(r"\s{2,}", line.strip())[0]
                    flags.update(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", head))
            flags.discard("--help")
            self.assertTrue(flags, f"{' '.join(command)} printed no flags")
            with open(os.path.join(ROOT, page), encoding="utf-8") as f:
                text = f.read()
            missing = sorted(flag for flag in flags if f"`{flag}`" not in text)
            self.assertEqual(
                missing, [], f"{page} does not name these flags of `{' '.join(command)}`: {missing}"
            )


def _add_block_tests():
    """One test per runnable block, named after its file and line."""
    for relpath in markdown_files():
        for line, text in runnable_blocks(relpath):
            name = "test_block_" + re.sub(r"\W", "_", relpath) + f"_{line}"

            def test(self, relpath=relpath, line=line, text=text):
                run_block(relpath, line, text)

            test.__doc__ = f"{relpath}:{line}"
            setattr(DocsCommandsTest, name, test)


_add_block_tests()

if __name__ == "__main__":
    main()
