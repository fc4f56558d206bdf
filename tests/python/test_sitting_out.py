"""A node that fails its health checks sits out, and is named where users look (issue 57): on
loopback, two agents of a --nnodes=1:2 job meet through a dlrund; one's --health-check fails
while a file the test makes exists, so the round forms with the other alone. Then:

- `dlrun status --json` (GetJob, what `dlrun top` and the job's page read) lists it with state
  sitting_out, the reason its check gave, the cause health_check, no group rank and no workers;
- `dlrun top --once` says `sits out: HOST (agent N): REASON` (cut at its 80 columns);
- the job's page's data (/api/job on the sitting-out agent's --metrics-port) holds the same;
- its /metrics has dlrun_node_sitting_out{cause="health_check"} 1 (quarantine's series 0).

The file removed, the node passes its next check and joins: status shows it running in the next
round with its worker, no node sits out, the metric is 0, and the events hold
health_check_failed, then health_check_passed. Every process is stopped by PID; every wait has
a deadline.
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
    die_with_parent,
    kill_recorded_workers,
    main,
    read_shared,
    run_control,
    temp_dir,
    worker,
    worker_starts,
)
from metrics_fixture import http_get, metrics_port, wait_for

WORKER = worker("elastic_worker.py")
RDZV_ID = "sitout"
TIMEOUT_S = 60
LISTENING = re.compile(r"dlrund listening on (\S+)")
# Fails while the file named by $UNFIT_MARK exists; an agent without the variable passes.
CHECK = 'test -z "$UNFIT_MARK" || test ! -e "$UNFIT_MARK" || { echo marked unfit; exit 1; }'
REASON = f"--health-check '{CHECK}' failed (exit code 1): marked unfit"


class SittingOutTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)
        self.mark = os.path.join(self.out, "unfit")
        self.release = os.path.join(self.out, "release")
        log = open(os.path.join(self.out, "dlrund.log"), "w+")
        self.addCleanup(log.close)
        self.dlrund = subprocess.Popen(
            [binary_from_env("DLRUND", "dlrund"), "--host", "127.0.0.1", "--port", "0"],
            stdout=log,
            stderr=log,
            env=clean_env(),
            preexec_fn=die_with_parent,
        )
        self.addCleanup(self.stop_dlrund)
        self.endpoint = wait_for(
            lambda: (m := LISTENING.search(read_shared(log))) and m.group(1),
            TIMEOUT_S,
            "dlrund to listen",
            lambda: read_shared(log),
        )

    def stop_dlrund(self):
        if self.dlrund.poll() is None:
            self.dlrund.kill()
            self.dlrund.wait()

    def agent(self, unfit):
        env = clean_env(UNFIT_MARK=self.mark if unfit else None)
        return Dlrun(
            self,
            [
                "--nnodes=1:2",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.endpoint}",
                f"--rdzv-id={RDZV_ID}",
                "--rdzv-conf=last_call_timeout=1",
                f"--health-check={CHECK}",
                "--metrics-port=0",
                PYTHON,
                WORKER,
                self.out,
                "--until-file",
                self.release,
            ],
            env=env,
        )

    def control(self, *args):
        code, out, err = run_control(
            *args, f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={RDZV_ID}"
        )
        self.assertEqual(code, 0, f"{err}\n{self.describe()}")
        return out

    def status(self):
        return json.loads(self.control("status", "--json"))

    def describe(self):
        return "".join(a.describe() for a in self.agents)

    def test_a_node_sitting_out_is_named_in_status_top_the_page_and_a_metric(self):
        open(self.mark, "w").close()
        unfit, fit = self.agent(unfit=True), self.agent(unfit=False)
        self.agents = [unfit, fit]
        wait_for(
            lambda: len(worker_starts(self.out, 0)) == 1,
            TIMEOUT_S,
            "the round without the unfit node",
            self.describe,
        )

        def sitting_out():
            return [n for n in self.status()["nodes"] if n["state"] == "sitting_out"]

        out = wait_for(sitting_out, TIMEOUT_S, "status to list the node sitting out", self.describe)
        self.assertEqual(len(out), 1, out)
        node = out[0]
        self.assertEqual(node["sitting_out"], REASON)
        self.assertEqual(node["sitting_out_cause"], "health_check")
        self.assertEqual(node["group_rank"], -1)
        self.assertEqual(node["workers"], [])
        self.assertEqual(node["replaced_by"], 0)

        # One line, cut at top's 80 columns.
        top = self.control("top", "--once")
        said = [line for line in top.splitlines() if line.startswith("sits out: ")]
        self.assertEqual(len(said), 1, top)
        self.assertTrue(
            f"sits out: {node['name']} (agent {node['agent']}): {REASON}".startswith(said[0]), top
        )
        self.assertIn("--health-check", said[0])

        port = metrics_port(unfit)

        def page_nodes():
            status, _, body = http_get(port, "/api/job")
            return status == 200 and json.loads(body)["job"]["nodes"]

        listed = wait_for(page_nodes, TIMEOUT_S, "the job's page to read the job", self.describe)
        self.assertIn(REASON, [n["sitting_out"] for n in listed])
        metrics = http_get(port, "/metrics")[2]
        self.assertIn('dlrun_node_sitting_out{cause="health_check"} 1\n', metrics)
        self.assertIn('dlrun_node_sitting_out{cause="quarantine"} 0\n', metrics)

        os.unlink(self.mark)  # its next check passes: it joins the next round

        def both_running():
            nodes = self.status()["nodes"]
            return len(worker_starts(self.out, 1)) == 2 and all(
                n["state"] == "running"
                and n["sitting_out"] == ""
                and len(n["workers"]) == 1
                and n["round"] == 1
                for n in nodes
            )

        wait_for(both_running, TIMEOUT_S, "both nodes running in round 1", self.describe)
        metrics = http_get(port, "/metrics")[2]
        self.assertIn('dlrun_node_sitting_out{cause="health_check"} 0\n', metrics)
        kinds = [e["kind"] for e in map(json.loads, self.control("events", "--json").splitlines())]
        self.assertLess(
            kinds.index("health_check_failed"), kinds.index("health_check_passed"), kinds
        )

        open(self.release, "w").close()
        for agent in self.agents:
            result = agent.wait(TIMEOUT_S)
            self.assertEqual(result.returncode, 0, result)


if __name__ == "__main__":
    main()
