"""The control plane of a single-node job (--standalone): its agent serves it on its store's
port and says at the start how to reach it.

- `dlrun status --json` with the printed endpoint and id lists the node and its 2 workers (pids,
  ranks) running; `dlrun stop --exit-code 9` ends the job with 9.
- A job started with DLRUN_TOKEN refuses a status call without it (one line, exit 2) and answers
  one that carries it in DLRUN_TOKEN.
"""

import json
import re
import unittest

from dlrun_fixture import (
    PYTHON,
    Dlrun,
    clean_env,
    kill_recorded_workers,
    main,
    run_control,
    temp_dir,
    wait_until,
    worker,
    worker_starts,
)

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 30
REACH = re.compile(
    r"^dlrun: control plane: dlrun status --rdzv-endpoint=(\S+) --rdzv-id=(\S+)$", re.M
)


class StandaloneControlTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)

    def start(self, env):
        self.agent = Dlrun(
            self,
            ["--standalone", "--nproc-per-node=2", PYTHON, WORKER, self.out, "--wait"],
            env=env,
        )
        wait_until(
            lambda: REACH.search(self.agent.output()[1]),
            JOB_TIMEOUT_S,
            "the line that says how to reach the control plane",
            proc=self.agent.proc,
            on_timeout=self.agent.describe,
        )
        self.endpoint, self.job = REACH.search(self.agent.output()[1]).groups()
        wait_until(
            lambda: len(worker_starts(self.out, 0)) == 2,
            JOB_TIMEOUT_S,
            "2 workers to start",
            proc=self.agent.proc,
            on_timeout=self.agent.describe,
        )

    def control(self, *args, env=None):
        return run_control(
            *args, f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.job}", env=env
        )

    def status(self, env=None):
        code, out, err = self.control("status", "--json", env=env)
        self.assertEqual(code, 0, f"{err}\n{self.agent.describe()}")
        return json.loads(out)

    def test_status_lists_the_node_and_its_workers_and_stop_ends_the_job(self):
        self.start(clean_env())
        by_rank = {int(s["env"]["RANK"]): s["pid"] for s in worker_starts(self.out, 0)}

        def running(job):
            return {
                w["rank"]: w["pid"]
                for n in job["nodes"]
                for w in n["workers"]
                if w["state"] == "running"
            }

        wait_until(
            lambda: running(self.status()) == by_rank,
            JOB_TIMEOUT_S,
            "status to list the 2 running workers",
            on_timeout=self.agent.describe,
        )
        job = self.status()
        self.assertEqual(job["id"], self.job)
        self.assertEqual(job["state"], "RUNNING")
        self.assertEqual(job["backend"], "local")
        self.assertEqual(len(job["nodes"]), 1)

        code, out, err = self.control("stop", "--exit-code=9")
        self.assertEqual(code, 0, err)
        self.assertEqual(self.agent.wait(JOB_TIMEOUT_S).returncode, 9)

    def test_a_job_started_with_dlrun_token_needs_it(self):
        self.start(clean_env(DLRUN_TOKEN="s3cret"))
        code, out, err = self.control("status")
        self.assertEqual(code, 2, out)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("DLRUN_TOKEN", err)
        code, out, err = self.control("status", env=clean_env(DLRUN_TOKEN="wrong"))
        self.assertEqual(code, 2, out)
        self.assertEqual(self.status(env=clean_env(DLRUN_TOKEN="s3cret"))["id"], self.job)
        code, out, err = self.control("stop", env=clean_env(DLRUN_TOKEN="s3cret"))
        self.assertEqual(code, 0, err)
        self.assertEqual(self.agent.wait(JOB_TIMEOUT_S).returncode, 143)


if __name__ == "__main__":
    main()
