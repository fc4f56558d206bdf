"""The job in one view (issue 45): the whole job's page and `dlrun top` on 4 simulated hosts.

Four agents, one per simulated host (network namespaces; needs root), 2 torch 2.13 workers each
(workers/job_view_worker.py: gloo from dlrun's environment, an all-reduce, then steps reported
through dlrun.progress, a barrier at the end), meet through the c10d store that host 0's agent
serves. Headless Chromium (Debian's chromium and chromium-driver through python3-selenium, run
inside host 0 by job_view_browser.py) opens /job on host 1's agent's --metrics-port, and
`dlrun top` runs in a tmux pane (80 x 40) on host 3. Both list the 4 nodes and the 8 ranks.
Then the test slows rank 5 down with SIGSTOP/SIGCONT bursts (stopped 75% of each second): with
the product's defaults (--straggler-fraction 0.7, --straggler-window 30) the page marks rank 5
as a straggler (its row highlighted, a "slow" badge, its detail line, the Stragglers box) and
top shows SLOW on its line, each within 45 s of the first SIGSTOP; `dlrun events` then holds the
straggler event for rank 5. No other rank is named.

The workers run no collective inside their loop: each rank does its own small matmul and wait
and reports its own step. A straggler by step rate is only visible when ranks do not wait for
each other every step; in lockstep (DDP's all-reduce each step) every rank would share the slow
one's pace and none would be named (control/state/stragglers.h).

Kept in test-output/ (ctest's working directory): job_view.png (the page when it named the
rank), job_view_top.txt (top's pane when it did). Every process is stopped by PID or with its
simulated host; every wait has a deadline.
"""

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import unittest

import torch

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    log_tails,
    read_json,
    temp_dir,
    wait_until,
    worker,
)
from netns_fixture import Hosts, main

HERE = os.path.dirname(os.path.abspath(__file__))
BROWSER = os.path.join(HERE, "job_view_browser.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-selenium
WORKER = worker("job_view_worker.py")
TORCH_ERA = "2.13."
NODES, NPROC = 4, 2
WORLD = NODES * NPROC
PORT = 29400
RDZV_ID = "jobview"
SLOW_RANK = 5
STOPPED_S, RUNNING_S = 0.75, 0.25  # each burst: 75% of the time stopped
NAMED_WITHIN_S = 45  # the bound, with the default flags
WATCH_LONGER_S = 20  # looked for past the bound, to report how late it was
START_TIMEOUT_S = 150  # 8 torch 2.13 workers starting on 2 loaded CPUs
WORKER_MAX_S = 90  # a worker's loop ends by itself after this long
SHOWN_TIMEOUT_S = 60  # the page and top to list every node and rank
EVENT_TIMEOUT_S = 15
EXIT_TIMEOUT_S = 60
BROWSER_TIMEOUT_S = 60  # Chromium's start on a loaded machine; one command
PAGE_HOST, PAGE_OF, TOP_HOST, ASK_HOST = 0, 1, 3, 3
JOB_PAGE_LINE = re.compile(r"the whole job's on (http://\S+/job)")
# A rank's line of `dlrun top`: NODE AG STATE RANK PID STEP STEPS/S IDLE LOSS [SLOW]
TOP_RANK_LINE = re.compile(
    r"^(\S+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)"
    r"\s+(\S+)(?:\s+(SLOW))?\s*$",
    re.M,
)


def output_dir():
    path = os.path.join(os.getcwd(), "test-output")
    os.makedirs(path, exist_ok=True)
    return path


class Browser:
    """job_view_browser.py inside a simulated host, one JSON line each way."""

    def __init__(self, test, hosts, host, work_dir, log):
        self.proc = hosts.popen(
            host,
            [SYSTEM_PYTHON, BROWSER, work_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=clean_env(GLOO_SOCKET_IFNAME=None),
        )
        self.replies = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        test.addCleanup(self.close)
        self._reply(BROWSER_TIMEOUT_S)

    def _read(self):
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def _reply(self, timeout):
        try:
            line = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the browser did not answer within {timeout}s") from None
        if line is None:
            raise AssertionError(f"the browser exited ({self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"the browser: {reply['error']}")
        return reply

    def call(self, cmd, timeout=BROWSER_TIMEOUT_S, **args):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=20)
                self.proc.wait(10)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)  # at the end of its output, now that the process is gone
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if not self.reader.is_alive():
            self.proc.stdout.close()


class Top:
    """`dlrun top` in a detached tmux session (its own server socket) inside a simulated host."""

    def __init__(self, test, hosts, host, socket_path, argv):
        self.hosts, self.host, self.socket = hosts, host, socket_path
        started = hosts.run(
            host,
            [
                "tmux",
                "-S",
                socket_path,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                "80",
                "-y",
                "40",
                " ".join(map(shlex.quote, argv)),
                ";",
                "set-option",
                "-t",
                "top",
                "remain-on-exit",
                "on",
            ],
            timeout=30,
            env=clean_env(TERM="xterm"),
        )
        test.assertEqual(started.returncode, 0, started.stderr)
        test.addCleanup(self.close)

    def capture(self):
        result = self.hosts.run(
            self.host, ["tmux", "-S", self.socket, "capture-pane", "-p", "-t", "top"], timeout=20
        )
        return result.stdout if result.returncode == 0 else f"(capture failed: {result.stderr})"

    def close(self):
        try:
            self.hosts.run(self.host, ["tmux", "-S", self.socket, "kill-server"], timeout=20)
        except subprocess.TimeoutExpired:
            pass  # its host's going down kills it


class Bursts(threading.Thread):
    """SIGSTOP and SIGCONT in turn to one process, stopped STOPPED_S of each second."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.done = threading.Event()
        self.started_at = None  # time.monotonic() and time.time() of the first SIGSTOP

    def run(self):
        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                if self.started_at is None:
                    self.started_at = (time.monotonic(), time.time())
                self.done.wait(STOPPED_S)
                os.kill(self.pid, signal.SIGCONT)
                self.done.wait(RUNNING_S)
        except ProcessLookupError:
            pass

    def stop(self):
        self.done.set()
        if self.is_alive():
            self.join(5)
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def setUpModule():
    if os.geteuid() != 0:
        print("test_job_view: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("network namespaces need root")


class JobViewTest(unittest.TestCase):
    def setUp(self):
        self.assertTrue(
            torch.__version__.startswith(TORCH_ERA),
            f"{PYTHON} has torch {torch.__version__}, not {TORCH_ERA}x",
        )
        self.out = temp_dir(self)
        self.hosts = Hosts(NODES)
        self.addCleanup(self.hosts.close)
        self.stop_file = os.path.join(self.out, "stop")
        self.agents = {}

    def endpoint_args(self):
        return [f"--rdzv-endpoint={self.hosts.address(0)}:{PORT}", f"--rdzv-id={RDZV_ID}"]

    def start_agent(self, node):
        log = open(os.path.join(self.out, f"agent{node}.log"), "w")
        self.addCleanup(log.close)
        args = [
            binary_from_env("DLRUN", "dlrun"),
            f"--nnodes={NODES}",
            f"--nproc-per-node={NPROC}",
            "--rdzv-backend=c10d",
            *self.endpoint_args(),
            "--metrics-port=0",
            PYTHON,
            WORKER,
            self.out,
            self.stop_file,
            str(WORKER_MAX_S),
        ]
        env = clean_env(GLOO_SOCKET_IFNAME="eth0", TMPDIR=self.out)
        self.agents[node] = self.hosts.popen(node, args, env=env, stdout=log, stderr=log)

    def logs(self):
        return log_tails(self.out, "*.log", tail=3000)

    def agent_log(self, node):
        with open(os.path.join(self.out, f"agent{node}.log"), errors="replace") as f:
            return f.read()

    def wait_for(self, predicate, timeout, what):
        def running_and(predicate):
            for node, agent in self.agents.items():
                if agent.poll() is not None:
                    raise AssertionError(
                        f"agent {node} exited with {agent.returncode} before {what}\n{self.logs()}"
                    )
            return predicate()

        wait_until(lambda: running_and(predicate), timeout, what, on_timeout=self.logs)

    def control(self, *args):
        """`dlrun COMMAND ...` from ASK_HOST: (exit code, stdout, stderr)."""
        result = self.hosts.run(
            ASK_HOST,
            [binary_from_env("DLRUN", "dlrun"), *args, *self.endpoint_args()],
            timeout=30,
            env=clean_env(),
        )
        return result.returncode, result.stdout, result.stderr

    def control_json(self, *args):
        code, out, err = self.control(*args, "--json")
        self.assertEqual(code, 0, f"dlrun {' '.join(args)}: {err}\n{self.logs()}")
        return out

    def started(self):
        return [n for n in os.listdir(self.out) if n.startswith("started_") and n.endswith(".json")]

    # --- what the page and top show -------------------------------------------------------

    @staticmethod
    def page_lists_the_job(look):
        """Every node and rank, each rank with a reported step."""
        return (
            look["message"] is None
            and len(look["nodes"]) == NODES
            and not any(n["replaced"] for n in look["nodes"])
            and sorted(r["rank"] for r in look["ranks"]) == list(range(WORLD))
            and all(r["cells"][4] != "-" for r in look["ranks"])
        )

    @staticmethod
    def top_ranks(screen):
        """{rank: (node, slow)} of top's rank lines."""
        return {
            int(m.group(4)): (m.group(1), bool(m.group(10))) for m in TOP_RANK_LINE.finditer(screen)
        }

    @staticmethod
    def top_lists_the_job(screen):
        return f"nodes {NODES} ({NODES}:{NODES}), ranks {WORLD}" in screen and sorted(
            JobViewTest.top_ranks(screen)
        ) == list(range(WORLD))

    @staticmethod
    def page_names(look, rank):
        row = next((r for r in look["ranks"] if r["rank"] == rank), None)
        return (
            row is not None
            and row["straggler"]
            and row["badge"]
            and rank in look["straggler_rows"]
            and any(s["rank"] == rank for s in look["stragglers_box"])
        )

    def test_page_and_top_show_every_rank_and_name_the_slow_one(self):
        for node in range(NODES):
            self.start_agent(node)
        self.wait_for(
            lambda: len(self.started()) == WORLD,
            START_TIMEOUT_S,
            f"{WORLD} workers past their all-reduce",
        )
        self.wait_for(
            lambda: JOB_PAGE_LINE.search(self.agent_log(PAGE_OF)),
            EVENT_TIMEOUT_S,
            f"agent {PAGE_OF}'s page address",
        )
        url = JOB_PAGE_LINE.search(self.agent_log(PAGE_OF)).group(1)
        self.assertIn(self.hosts.address(PAGE_OF), url)

        browser_dir = os.path.join(self.out, "browser")
        os.makedirs(browser_dir)
        browser_log = open(os.path.join(self.out, "browser.log"), "w")
        self.addCleanup(browser_log.close)
        browser = Browser(self, self.hosts, PAGE_HOST, browser_dir, browser_log)
        browser.call("open", url=url)
        top = Top(
            self,
            self.hosts,
            TOP_HOST,
            os.path.join(self.out, "tmux.sock"),
            [binary_from_env("DLRUN", "dlrun"), "top", *self.endpoint_args()],
        )

        def describe():
            return (
                f"--- page ---\n{json.dumps(browser.call('look'), indent=1)}\n"
                f"--- top ---\n{top.capture()}\n{self.logs()}"
            )

        # Both list the whole job before any rank is slowed.
        self.wait_for(
            lambda: self.page_lists_the_job(browser.call("look")),
            SHOWN_TIMEOUT_S,
            "the page to list 4 nodes and 8 ranks, each with a step",
        )
        self.wait_for(
            lambda: self.top_lists_the_job(top.capture()),
            SHOWN_TIMEOUT_S,
            "top to list 4 nodes and 8 ranks",
        )
        look = browser.call("look")
        self.assertEqual(look["straggler_rows"], [], describe())
        self.assertEqual(look["header"]["nodes"], f"{NODES} ({NODES}:{NODES})")
        self.assertEqual(look["header"]["ranks"], str(WORLD))
        self.assertEqual(look["header"]["state"], "running")
        self.assertEqual(
            sorted(n["cells"][0] for n in look["nodes"]),
            [self.hosts.hostname(i) for i in range(NODES)],
        )

        # Rank 5's pid from the control plane, checked against the worker's own word.
        job = json.loads(self.control_json("status"))
        pids = {w["rank"]: w["pid"] for n in job["nodes"] for w in n["workers"]}
        self.assertEqual(sorted(pids), list(range(WORLD)))
        slow_pid = pids[SLOW_RANK]
        self.assertEqual(
            read_json(os.path.join(self.out, f"started_{SLOW_RANK}.json"))["pid"], slow_pid
        )

        bursts = Bursts(slow_pid)
        self.addCleanup(bursts.stop)
        bursts.start()
        wait_until(lambda: bursts.started_at, 5, "the first SIGSTOP")
        start, start_wall = bursts.started_at

        # Look at both until each names the rank (past the bound, to tell how late).
        page_after = top_after = None
        page_look = top_screen = None
        deadline = start + NAMED_WITHIN_S + WATCH_LONGER_S
        while (page_after is None or top_after is None) and time.monotonic() < deadline:
            if page_after is None:
                look = browser.call("look")
                if self.page_names(look, SLOW_RANK):
                    page_after = time.monotonic() - start
                    page_look = look
                    browser.call("screenshot", path=os.path.join(output_dir(), "job_view.png"))
            if top_after is None:
                screen = top.capture()
                if self.top_ranks(screen).get(SLOW_RANK, (None, False))[1]:
                    top_after = time.monotonic() - start
                    top_screen = screen
                    with open(os.path.join(output_dir(), "job_view_top.txt"), "w") as f:
                        f.write(screen)
            time.sleep(0.2)
        print(
            f"test_job_view: rank {SLOW_RANK} named after the first SIGSTOP by the page in "
            f"{page_after if page_after is None else round(page_after, 1)} s, by top in "
            f"{top_after if top_after is None else round(top_after, 1)} s",
            file=sys.stderr,
        )
        self.assertIsNotNone(page_after, f"the page never named rank {SLOW_RANK}\n{describe()}")
        self.assertIsNotNone(top_after, f"top never named rank {SLOW_RANK}\n{describe()}")
        self.assertLessEqual(page_after, NAMED_WITHIN_S, describe())
        self.assertLessEqual(top_after, NAMED_WITHIN_S, describe())

        # Only the slowed rank, on the whole job's list, in both views.
        self.assertEqual(page_look["straggler_rows"], [SLOW_RANK], describe())
        self.assertEqual(sorted(r["rank"] for r in page_look["ranks"]), list(range(WORLD)))
        self.assertEqual(len(page_look["nodes"]), NODES)
        self.assertEqual(page_look["header"]["straggler-count"], "1")
        self.assertIn(
            f"rank {SLOW_RANK} on ",
            [s["text"] for s in page_look["stragglers_box"] if s["rank"] == SLOW_RANK][0],
        )
        ranks = self.top_ranks(top_screen)
        self.assertEqual(sorted(ranks), list(range(WORLD)), top_screen)
        self.assertEqual([r for r, (_, slow) in ranks.items() if slow], [SLOW_RANK], top_screen)
        self.assertIn(f"nodes {NODES} ({NODES}:{NODES}), ranks {WORLD}", top_screen)
        self.assertIn("stragglers 1", top_screen)
        # Top lists the stragglers first.
        first = TOP_RANK_LINE.search(top_screen)
        self.assertEqual(int(first.group(4)), SLOW_RANK, top_screen)
        slow_node = ranks[SLOW_RANK][0]
        self.assertEqual(
            slow_node,
            next(
                n["name"] for n in job["nodes"] if any(w["rank"] == SLOW_RANK for w in n["workers"])
            ),
        )

        # The control plane's events hold it, and so does the page's list and timeline.
        def straggler_events():
            out = self.control_json("events")
            return [
                e
                for e in map(json.loads, out.splitlines())
                if e["kind"] == "straggler" and e.get("rank") == SLOW_RANK
            ]

        self.wait_for(
            straggler_events,
            EVENT_TIMEOUT_S,
            f"dlrun events to hold the straggler event of rank {SLOW_RANK}",
        )
        event = straggler_events()[0]
        self.assertIn(f"rank {SLOW_RANK} on {slow_node}", event["detail"])
        print(
            f"test_job_view: the straggler event came {event['time'] - start_wall:.1f} s after "
            f"the first SIGSTOP: {event['detail']}",
            file=sys.stderr,
        )
        self.wait_for(
            lambda: {"kind": "straggler", "rank": SLOW_RANK} in browser.call("look")["events"],
            EVENT_TIMEOUT_S,
            "the page's events to list the straggler",
        )
        self.assertIn("straggler", browser.call("look")["timeline_marks"])
        # Nothing came from anywhere but the page's own origin.
        origin = url[: url.index("/", len("http://"))]
        for entry in browser.call("resources")["resources"]:
            self.assertTrue(entry.startswith(origin + "/"), entry)

        # The job ends cleanly once rank 5 runs freely again.
        bursts.stop()
        with open(self.stop_file, "w"):
            pass
        for node, agent in self.agents.items():
            try:
                code = agent.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.fail(f"agent {node} still runs\n{self.logs()}")
            self.assertEqual(code, 0, self.logs())
        self.assertEqual(
            sorted(
                n for n in os.listdir(self.out) if n.startswith("done_") and n.endswith(".json")
            ),
            sorted(f"done_{r}.json" for r in range(WORLD)),
        )


if __name__ == "__main__":
    main(hang_limit_s=280)
