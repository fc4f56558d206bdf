"""The first failure first (issue 58; agents/failure_summary.h): a job that fails ends with one
summary from group rank 0: the first failure in time with its report, then the others in time
order, the ranks dlrun stopped counted.

- One node, 4 workers: rank 1 exits 3 at once (once rank 2 trapped SIGTERM); rank 2, told to
  stop, exits 4 a second later; the others die of dlrun's SIGTERM. The summary names rank 1
  first, rank 2 failed after it (+~1 s), 2 stopped; dlrun exits 3, as before.
- Two simulated hosts (network namespaces; needs root) through a dlrund on a third: the first
  failure on group rank 1's host, a second one a second later on group rank 0's. Group rank 0
  prints the summary naming the other host's rank first; the other host prints its own report
  as before; `dlrun events` shows the summary's first line in job_ended, and `dlrun status
  --json`'s root cause is the summary.

Runs under any Python 3 (ctest: python_first_failure); the workers are plain Python.
"""

import json
import os
import re
import subprocess
import unittest

from dlrun_fixture import (
    PYTHON,
    Dlrun,
    binary_from_env,
    clean_env,
    read_shared,
    temp_dir,
    wait_until,
)
from launcher_fixture import RDZV_PORT
from netns_fixture import Hosts, main

TIMEOUT_S = 60
# FIRST fails at once, once LATE trapped SIGTERM; LATE, told to stop, fails a second later.
# Each says who it is in OUT/<role> (written whole: a temporary name, then renamed).
WORKER = """
import os, signal, socket, sys, time
out, first, late = sys.argv[1], sys.argv[2], sys.argv[3]
me = "%s:%s" % (os.environ["GROUP_RANK"], os.environ["LOCAL_RANK"])

def mark(name):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write("%s %s" % (os.environ["RANK"], socket.gethostname()))
    os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))

if me == late:
    def stopped(signum, frame):
        time.sleep(1)  # what the summary measures: a failure a second after the first
        sys.exit(4)
    signal.signal(signal.SIGTERM, stopped)
    mark("late")
elif me == first:
    while not os.path.exists(os.path.join(out, "late")):
        time.sleep(0.01)
    mark("first")
    print("ValueError: the first failure", file=sys.stderr, flush=True)
    sys.exit(3)
while True:
    time.sleep(60)
"""


def write_worker(out):
    path = os.path.join(out, "worker.py")
    with open(path, "w") as f:
        f.write(WORKER)
    return path


def who(out, role):
    """(RANK, hostname) of the worker that marked `role`."""
    with open(os.path.join(out, role)) as f:
        rank, host = f.read().split()
    return int(rank), host


class FirstFailureTest(unittest.TestCase):
    def test_one_node_names_the_first_failure_and_counts_the_rest(self):
        out = temp_dir(self)
        done = Dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=4",
                "--stop-timeout=20",
                PYTHON,
                write_worker(out),
                out,
                "0:1",
                "0:2",
            ],
            env=clean_env(TMPDIR=out),
        ).wait(TIMEOUT_S)
        self.assertEqual(done.returncode, 3, done)
        lines = done.dlrun_lines()
        head = [i for i, line in enumerate(lines) if line.startswith("dlrun: the job failed:")]
        self.assertEqual(len(head), 1, done)
        self.assertRegex(
            lines[head[0]],
            r"^dlrun: the job failed: rank 1( on \S.*)? failed first \(attempt 0, "
            r"exit code 3\); 1 other rank failed after it, 2 were stopped by dlrun$",
        )
        after = lines[head[0] + 1 :]
        self.assertRegex(after[0], r"^dlrun: worker failed: rank 1 \(local rank 1\)")
        self.assertIn("dlrun:   ValueError: the first failure", after)
        then = [line for line in after if line.startswith("dlrun:   then ")]
        self.assertEqual(len(then), 1, done)
        late = re.fullmatch(
            r"dlrun:   then rank 2( on \S.*)? \(attempt 0\): exit code 4, "
            r"\+(\d+\.\d\d) s",
            then[0],
        )
        self.assertTrue(late, then[0])
        self.assertTrue(0.9 <= float(late.group(2)) < 10, then[0])
        # The round's own report is not printed besides the summary's.
        self.assertEqual(sum(line.startswith("dlrun: worker failed:") for line in lines), 1, done)


class FirstFailureOnHostsTest(unittest.TestCase):
    def test_group_rank_zero_names_the_other_hosts_failure_first(self):
        out = temp_dir(self)
        logs = temp_dir(self)
        worker = write_worker(out)
        env = clean_env(TMPDIR=logs, GLOO_SOCKET_IFNAME="eth0")
        dlrun, dlrund = binary_from_env("DLRUN", "dlrun"), binary_from_env("DLRUND", "dlrund")
        with Hosts(3) as hosts:
            endpoint = f"{hosts.address(0)}:{RDZV_PORT}"
            control = [f"--rdzv-endpoint={endpoint}", "--rdzv-id=first"]
            server_log = open(os.path.join(logs, "dlrund.log"), "w+")
            self.addCleanup(server_log.close)
            hosts.popen(
                0,
                [dlrund, "--host", "0.0.0.0", "--port", str(RDZV_PORT)],
                env=env,
                stdout=server_log,
                stderr=subprocess.STDOUT,
            )
            wait_until(
                lambda: "dlrund listening on" in read_shared(server_log),
                TIMEOUT_S,
                "dlrund to listen",
                on_timeout=lambda: read_shared(server_log),
            )
            agents = {}
            for host in (1, 2):
                log = open(os.path.join(logs, f"agent{host}.log"), "w+")
                self.addCleanup(log.close)
                agents[host] = (
                    hosts.popen(
                        host,
                        [
                            dlrun,
                            "--nnodes=2",
                            "--nproc-per-node=2",
                            "--rdzv-backend=c10d",
                            *control,
                            "--rdzv-conf=last_call_timeout=1",
                            "--stop-timeout=20",
                            PYTHON,
                            worker,
                            out,
                            "1:0",
                            "0:0",
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )

            def describe():
                return "".join(
                    f"--- agent on host {h} ---\n{read_shared(log)}"
                    for h, (_, log) in agents.items()
                )

            codes = {}
            for host, (proc, _) in agents.items():
                try:
                    codes[host] = proc.wait(TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.fail(f"the agent on host {host} still runs\n{describe()}")
            self.assertEqual(codes, {1: 3, 2: 3}, describe())
            (first_rank, first_host), (late_rank, late_host) = who(out, "first"), who(out, "late")
            self.assertNotEqual(first_host, late_host)
            said = {h: read_shared(log) for h, (_, log) in agents.items()}
            leader = [h for h, text in said.items() if "dlrun: the job failed:" in text]
            self.assertEqual(leader, [int(late_host.removeprefix("node"))], describe())
            summary = said[leader[0]]
            headline = re.search(r"^dlrun: (the job failed: .*)$", summary, re.M).group(1)
            self.assertRegex(
                headline,
                rf"^the job failed: rank {first_rank} on {first_host}\b.* failed "
                r"first \(attempt 0, exit code 3\); 1 other rank failed after it, "
                r"2 were stopped by dlrun$",
            )
            self.assertIn("dlrun:   ValueError: the first failure", summary)
            self.assertRegex(
                summary,
                rf"\ndlrun:   then rank {late_rank} on {late_host}\b.* "
                r"\(attempt 0\): exit code 4, \+\d+\.\d\d s\n",
            )
            # The other host prints the round's report, as before.
            other = said[3 - leader[0]]
            self.assertNotIn("the job failed:", other)
            self.assertIn(
                f"dlrun: worker failed: rank {first_rank} (local rank 0) on {first_host}", other
            )

            def ask(*args):
                done = hosts.run(0, [dlrun, *args, *control], timeout=TIMEOUT_S, env=env)
                self.assertEqual(done.returncode, 0, done.stderr)
                return done.stdout

            events = [json.loads(line) for line in ask("events", "--json").splitlines()]
            ended = [e for e in events if e["kind"] == "job_ended"]
            self.assertEqual(len(ended), 1, events)
            self.assertEqual(ended[0]["detail"], f"every agent exits with 3: {headline}")
            status = json.loads(ask("status", "--json"))
            self.assertEqual(status["state"], "FAILED", status)
            self.assertTrue(status["root_cause"].startswith(f"dlrun: {headline}\n"), status)
            self.assertIn(f"then rank {late_rank} on {late_host}", status["root_cause"])


if __name__ == "__main__":
    main()
