"""`dlrun logs` (issue 58): a rank's output through the control plane from wherever it ran.

- On two simulated hosts (network namespaces; needs root), asked from a third: rank 3's output
  from the other host, of the newest attempt and of the earlier one (where it failed); a node's
  ranks; the job-wide view (each shared line once with its ranks and both nodes); --follow shows
  a line printed after it started; --grep, --tail and --stream; unknown ranks and bad flags are
  one line and exit 2.
- On one node (loopback): a job without --tee or --redirects says which flag keeps the output;
  a line that is not UTF-8 comes back byte for byte.
"""

import json
import os
import subprocess
import sys
import unittest

from dlrun_fixture import binary_from_env, clean_env, log_tails, temp_dir, wait_until, worker
from netns_fixture import Hosts, main

WORKER = worker("log_worker.py")
PORT = 29400
TIMEOUT_S = 60
# Run inside a host: the keys of the job's log requests still in its store, one line of JSON.
KEYS_LEFT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from plain_store import PlainStore
store = PlainStore(sys.argv[2], int(sys.argv[3]))
ctl = "dlrun/logs/ctl/"
requests, agents = store.add(ctl + "logs", 0), store.add(ctl + "nodes", 0)
keys = [f"{ctl}log/{n}" for n in range(1, requests + 1)]
keys += [f"{ctl}log/{n}/{a}/{k}" for n in range(1, requests + 1)
         for a in range(1, agents + 1) for k in range(12)]
print(json.dumps([requests, [key for key in keys if store.exists(key)]]))
"""


def dlrun():
    return binary_from_env("DLRUN", "dlrun")


class LogsOnHostsTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.hosts = Hosts(3)  # hosts 0 and 1 run the job, host 2 asks
        self.addCleanup(self.hosts.close)
        self.agents = []
        for node in range(2):
            log = open(os.path.join(self.out, f"agent{node}.log"), "w")
            self.addCleanup(log.close)
            args = [
                dlrun(),
                "--nnodes=2",
                "--nproc-per-node=2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}",
                "--rdzv-id=logs",
                "--max-restarts=1",
                "--tee=3",
                f"--log-dir={self.out}/logs{node}",
                "/usr/bin/python3",
                WORKER,
                self.out,
                "--fail",
            ]
            self.agents.append(
                self.hosts.popen(node, args, env=clean_env(TMPDIR=self.out), stdout=log, stderr=log)
            )
        self.addCleanup(self.finish)
        wait_until(
            lambda: all(
                os.path.exists(os.path.join(self.out, f"printed-1-{rank}")) for rank in range(4)
            ),
            TIMEOUT_S,
            "every rank of attempt 1 printing",
            on_timeout=self.logs,
        )

    def finish(self):
        open(os.path.join(self.out, "done"), "w").close()
        for agent in self.agents:
            try:
                agent.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()

    def logs(self):
        return log_tails(self.out, "agent*.log")

    def ask(self, *args):
        """`dlrun logs ARGS` from host 2: (exit code, stdout, stderr)."""
        argv = [
            dlrun(),
            "logs",
            *args,
            f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}",
            "--rdzv-id=logs",
        ]
        done = self.hosts.run(
            2, argv, timeout=TIMEOUT_S, capture_output=True, text=True, env=clean_env()
        )
        return done.returncode, done.stdout, done.stderr

    def ask_ok(self, *args):
        code, out, err = self.ask(*args)
        self.assertEqual(code, 0, f"{err}\n{self.logs()}")
        return out.splitlines()

    def test_a_rank_on_the_other_host_now_and_at_its_earlier_attempt(self):
        self.assertEqual(
            self.ask_ok("3"), ["same line on every rank", "attempt 1 rank 3", "stderr of rank 3"]
        )
        self.assertEqual(
            self.ask_ok("3", "--attempt", "0"),
            ["same line on every rank", "attempt 0 rank 3", "stderr of rank 3"],
        )
        self.assertEqual(self.ask_ok("3", "--stream", "err"), ["stderr of rank 3"])
        self.assertEqual(self.ask_ok("3", "--tail", "1", "--stream", "out"), ["attempt 1 rank 3"])
        # Nodes answer side by side: their lines come as they arrive.
        self.assertEqual(
            sorted(self.ask_ok("--grep", "attempt")),
            [f"[{rank}]: attempt 1 rank {rank}" for rank in range(4)],
        )

    def test_a_node_and_the_job_wide_view(self):
        node1 = self.hosts.hostname(1)
        lines = self.ask_ok("--node", node1, "--stream", "out")
        self.assertEqual(
            sorted(lines),
            sorted(
                [f"[{r}]: same line on every rank" for r in (2, 3)]
                + [f"[{r}]: attempt 1 rank {r}" for r in (2, 3)]
            ),
        )
        grouped = self.ask_ok("--grouped")
        nodes = ",".join(sorted([self.hosts.hostname(0), node1]))
        self.assertEqual(grouped.count(f"[0-3] {nodes}: same line on every rank"), 1, grouped)
        for rank in range(4):
            host = self.hosts.hostname(rank // 2)
            self.assertEqual(grouped.count(f"[{rank}] {host}: attempt 1 rank {rank}"), 1, grouped)
            self.assertEqual(grouped.count(f"[{rank}] {host}: stderr of rank {rank}"), 1, grouped)
        self.assertEqual(len(grouped), 9, grouped)

    def test_follow_shows_a_line_printed_after_it_started(self):
        argv = self.hosts.exec_argv(
            2,
            [
                dlrun(),
                "logs",
                "2",
                "--follow",
                "--stream",
                "out",
                f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}",
                "--rdzv-id=logs",
            ],
        )
        follow = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
        )
        self.addCleanup(follow.stderr.close)
        self.addCleanup(follow.stdout.close)
        self.addCleanup(follow.wait)
        self.addCleanup(follow.kill)
        self.assertEqual(follow.stdout.readline(), "same line on every rank\n")
        self.assertEqual(follow.stdout.readline(), "attempt 1 rank 2\n")
        open(os.path.join(self.out, "more-2"), "w").close()
        self.assertEqual(follow.stdout.readline(), "more 2\n")
        self.assertIsNone(follow.poll())

    def test_a_request_leaves_no_key_behind(self):
        """Whether answered whole or left by its caller (a killed --follow), a request's keys go."""
        self.assertIn("attempt 1 rank 3", self.ask_ok("3"))
        follow = self.hosts.popen(
            2,
            [dlrun(), "logs", "2", "--follow", f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}"]
            + ["--rdzv-id=logs"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=clean_env(),
        )
        self.addCleanup(follow.stdout.close)
        self.assertEqual(follow.stdout.readline(), "same line on every rank\n")
        follow.kill()
        follow.wait()
        here = os.path.dirname(os.path.abspath(__file__))
        argv = [sys.executable, "-c", KEYS_LEFT, here, self.hosts.address(0), str(PORT)]
        seen = []

        def none_left():
            done = self.hosts.run(2, argv, timeout=TIMEOUT_S, env=clean_env())
            self.assertEqual(done.returncode, 0, done.stderr)
            seen[:] = json.loads(done.stdout)
            return seen == [2, []]

        wait_until(none_left, TIMEOUT_S, "no key of 2 requests left", on_timeout=lambda: seen)

    def test_what_is_not_there_and_bad_flags_are_one_line(self):
        for args, says in [
            (["9"], "holds rank 9's output"),
            (["3", "--attempt", "5"], "holds rank 3's output of attempt 5"),
            (["--node", "nowhere"], "no agent of job 'logs' runs on node"),
            (["--grouped", "--follow"], "cannot --follow"),
            (["--stream", "both2"], "--stream"),
        ]:
            code, out, err = self.ask(*args)
            self.assertEqual(code, 2, f"{args}: {out}{err}")
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertIn(says, err)


class LogsOnOneNodeTest(unittest.TestCase):
    def start(self, *flags):
        self.out = temp_dir(self)
        script = os.path.join(self.out, "worker.py")
        with open(script, "w") as f:
            f.write(
                "import os, sys, time\n"
                "sys.stdout.buffer.write(b'bytes \\xff\\xfe end\\n'); sys.stdout.flush()\n"
                f"open(os.path.join({self.out!r}, 'printed'), 'w').close()\n"
                f"while not os.path.exists(os.path.join({self.out!r}, 'done')):\n"
                "    time.sleep(0.05)\n"
            )
        self.job = subprocess.Popen(
            [dlrun(), "--standalone", "--nproc-per-node=1", *flags, "/usr/bin/python3", script],
            env=clean_env(TMPDIR=self.out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.addCleanup(self.job.stderr.close)
        self.addCleanup(self.job.wait)
        self.addCleanup(self.job.kill)
        self.addCleanup(lambda: open(os.path.join(self.out, "done"), "w").close())
        # Its first line names the endpoint and id: dlrun status --rdzv-endpoint=E --rdzv-id=I
        said = self.job.stderr.readline().decode().split()
        self.where = [word for word in said if word.startswith("--rdzv-")]
        self.assertEqual(len(self.where), 2, said)
        wait_until(
            lambda: os.path.exists(os.path.join(self.out, "printed")),
            TIMEOUT_S,
            "the worker printing",
            proc=self.job,
        )

    def logs(self, *args):
        return subprocess.run(
            [dlrun(), "logs", *args, *self.where],
            capture_output=True,
            timeout=TIMEOUT_S,
            env=clean_env(),
        )

    def test_without_files_it_says_which_flag_keeps_them(self):
        self.start()
        done = self.logs("0")
        self.assertEqual(done.returncode, 2, done)
        self.assertIn(b"start the job with --tee=3 (or --redirects=3)", done.stderr)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)

    def test_a_line_that_is_not_utf8_comes_back_byte_for_byte(self):
        self.start("--redirects=3")
        done = self.logs("0")
        self.assertEqual(done.returncode, 0, done)
        self.assertEqual(done.stdout, b"bytes \xff\xfe end\n")


if __name__ == "__main__":
    main(TIMEOUT_S * 3)
