"""What cmake --install puts beside the programs (issue 17, acceptance 4): dlrund.service, which
`systemd-analyze verify` accepts and which is hardened (its offline security review rates it
OK) and reads its address from the installed settings file; the bash completion, which parses
(`bash -n`), completes --nproc to --nproc-per-node, and offers every flag --help lists (control
commands, the trainer's flags after `train`, set choices); and man pages in step with --help."""

import os
import re
import unittest

from dlrun_fixture import main
from package_fixture import class_temp_dir, install, long_flags, run

MAN_PAGES = {
    "dlrun": "man1/dlrun.1.gz",
    "dlrund": "man8/dlrund.8.gz",
    "dlrun-train": "man1/dlrun-train.1.gz",
}
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 (locked down) to 10; below 2 is "OK"


class InstallFilesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefix = install(os.path.join(class_temp_dir(cls), "prefix"))
        cls.unit = os.path.join(cls.prefix, "lib", "systemd", "system", "dlrund.service")
        cls.completion = os.path.join(
            cls.prefix, "share", "bash-completion", "completions", "dlrun"
        )

    def program(self, name):
        return os.path.join(self.prefix, "bin", name)

    def systemd_analyze(self, *args):
        # MANPATH: verify checks that the unit's Documentation= page exists.
        env = dict(os.environ, MANPATH=os.path.join(self.prefix, "share", "man"))
        return run(["systemd-analyze", *args, self.unit], env=env)

    def test_service_verifies_and_is_hardened(self):
        self.assertNotIn("dlrund", self.systemd_analyze("verify"))
        review = self.systemd_analyze("security", "--offline=yes", "--no-pager")
        exposure = re.search(r"Overall exposure level for dlrund.service: ([0-9.]+)", review)
        self.assertLess(float(exposure.group(1)), MAX_EXPOSURE, review)
        with open(self.unit) as f:
            unit = f.read().splitlines()
        settings = os.path.join(self.prefix, "etc", "default", "dlrund")
        for line in (
            f"EnvironmentFile=-{settings}",
            "Restart=on-failure",
            "DynamicUser=yes",
            f"ExecStart={self.program('dlrund')} --host ${{DLRUND_HOST}} "
            "--port ${DLRUND_PORT} $DLRUND_OPTIONS",
        ):
            self.assertIn(line, unit)
        with open(settings) as f:
            self.assertLessEqual(
                {"DLRUND_HOST=0.0.0.0", "DLRUND_PORT=29500"}, set(f.read().splitlines())
            )

    def complete(self, *words):
        """What the completion offers for the last of words, typed after words[0]."""
        script = (
            f'source {self.completion}; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
            '_dlrun 2>/dev/null; printf "%s\\n" "${COMPREPLY[@]}"'
        )
        return run(["bash", "-c", script, "bash", *words]).split()

    def test_completion(self):
        run(["bash", "-n", self.completion])
        self.assertEqual(self.complete("dlrun", "--nproc"), ["--nproc-per-node"])
        self.assertEqual(self.complete("dlrun", "--nproc_"), ["--nproc_per_node"])
        self.assertEqual(self.complete("dlrun", "st"), ["status", "stop"])
        self.assertEqual(self.complete("dlrun", "events", "--fol"), ["--follow"])
        # After the entry point `train`: the trainer's flags, also behind flags with values.
        self.assertEqual(
            self.complete("dlrun", "--nnodes", "=", "1", "--max-restarts", "2", "train", "--ep"),
            ["--epochs"],
        )
        self.assertEqual(self.complete("dlrun-train", "--device", "c"), ["cpu", "cuda"])
        self.assertEqual(
            self.complete("dlrund", "--max-k"), ["--max-key-bytes", "--max-keys-per-op"]
        )
        self.assertEqual(self.complete("dlrun", "script.py", "--ep"), [])  # the script's own
        help_text = run([self.program("dlrun"), "--help"])
        self.assertEqual(
            self.complete("dlrun", "--"),
            [flag for flag in long_flags(help_text) if "_" not in flag],
        )
        registered = run(["bash", "-c", f"source {self.completion}; complete -p"])
        for program in ("dlrun", "dlrund", "dlrun-train"):
            self.assertIn(f"complete -F _dlrun {program}\n", registered)

    def test_man_pages_follow_help(self):
        for program, page in MAN_PAGES.items():
            text = run(
                ["man", "-l", os.path.join(self.prefix, "share", "man", page)],
                env=dict(os.environ, LC_ALL="C", MANWIDTH="200"),
            )
            help_text = run([self.program(program), "--help"])
            for flag in long_flags(help_text):
                self.assertIn(flag, text, f"{page} misses {flag}")
        dlrun_help = run([self.program("dlrun"), "--help"])
        usage = [line for line in dlrun_help.splitlines() if line.startswith("Usage:")]
        self.assertEqual(usage, ["Usage: dlrun [OPTIONS] ENTRYPOINT [ARGS...]"])


if __name__ == "__main__":
    main()
