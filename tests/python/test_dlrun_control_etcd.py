"""The control plane of an etcd job: two agents on loopback (127.0.0.1 and 127.0.0.2, each in a
UTS namespace of its own so the node names differ; needs root) form one job through a real etcd
(tests/python/etcd_fixture.py).

- `dlrun status --json --rdzv-backend=etcd` lists both nodes and the 4 workers with their pids
  and ranks; `dlrun events` shows each node's workers start; an unknown job id is one line and
  exit 2.
- Each agent serves the Control service on its workers' store's port: Python's grpcio (stubs
  generated from proto/) gets the job and a SERVING health answer from group rank 0's port
  (MASTER_ADDR:MASTER_PORT, as the workers see it).
- `dlrun stop --exit-code 7` ends the job: both agents exit 7.
"""

import json
import os
import shutil
import sys
import unittest

import grpc

from control_stubs import STUB_DIR, health_grpc, health_pb, pb, pb_grpc
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
from etcd_fixture import start_etcd

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 60
CALL_TIMEOUT_S = 30


class EtcdControlTest(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)
        self.job = f"ctl{self.etcd.port}"
        self.agents = [self.start_agent(node) for node in (1, 2)]

    def start_agent(self, node):
        # The node's name is its host's: one UTS namespace each, so the two differ. The agent's
        # store whatever the machine's torch (Debian 13's, without libuv, would have rank 0
        # serve the workers' store): the worker opens no store, and the test dials the agent's.
        args = [
            "--nnodes=2",
            "--nproc-per-node=2",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.etcd.endpoint}",
            f"--rdzv-id={self.job}",
            f"--local-addr=127.0.0.{node}",
            "--worker-store=agent",
            PYTHON,
            WORKER,
            self.out,
            "--wait",
        ]
        return Dlrun(
            self,
            args,
            env=clean_env(),
            wrapper=["unshare", "--uts", "sh", "-c", f'hostname node{node} && exec "$@"', "sh"],
        )

    def describe(self):
        return "\n".join(agent.describe() for agent in self.agents)

    def control(self, *args):
        return run_control(
            *args,
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.etcd.endpoint}",
            f"--rdzv-id={self.job}",
        )

    def status(self):
        code, out, err = self.control("status", "--json")
        self.assertEqual(code, 0, f"{err}\n{self.describe()}")
        return json.loads(out)

    def test_status_events_grpc_and_stop_through_etcd(self):
        wait_until(
            lambda: len(worker_starts(self.out, 0)) == 4,
            JOB_TIMEOUT_S,
            "4 workers to start",
            on_timeout=self.describe,
        )
        starts = worker_starts(self.out, 0)
        by_rank = {int(s["env"]["RANK"]): s["pid"] for s in starts}

        def workers(job):
            return {
                w["rank"]: w["pid"]
                for n in job["nodes"]
                for w in n["workers"]
                if w["state"] == "running"
            }

        wait_until(
            lambda: workers(self.status()) == by_rank,
            JOB_TIMEOUT_S,
            "status to list the 4 running workers",
            on_timeout=self.describe,
        )
        job = self.status()
        self.assertEqual(job["backend"], "etcd")
        self.assertEqual(job["state"], "RUNNING")
        self.assertEqual(sorted(n["name"] for n in job["nodes"]), ["node1", "node2"])
        self.assertEqual(sorted(n["address"] for n in job["nodes"]), ["127.0.0.1", "127.0.0.2"])

        code, out, err = self.control("events", "--json")
        self.assertEqual(code, 0, err)
        events = [line for line in out.splitlines() if '"worker_started"' in line]
        self.assertEqual(len(events), 2, out)
        self.assertTrue(
            any('"node1"' in e for e in events) and any('"node2"' in e for e in events), out
        )

        # Group rank 0's workers' store, where its workers find it: the Control service is there.
        env = starts[0]["env"]
        channel = grpc.insecure_channel(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")
        self.addCleanup(channel.close)
        got = pb_grpc.ControlStub(channel).GetJob(pb.JobRef(id=self.job), timeout=CALL_TIMEOUT_S)
        self.assertEqual(got.state, pb.RUNNING)
        self.assertEqual(len(got.nodes), 2)
        reply = health_grpc.HealthStub(channel).Check(
            health_pb.HealthCheckRequest(service="dlrun.v1.Control"), timeout=CALL_TIMEOUT_S
        )
        self.assertEqual(reply.status, health_pb.HealthCheckResponse.SERVING)

        code, out, err = run_control(
            "status",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={self.etcd.endpoint}",
            "--rdzv-id=nojob",
        )
        self.assertEqual(code, 2)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("no job 'nojob'", err)

        code, out, err = self.control("stop", "--exit-code=7")
        self.assertEqual(code, 0, err)
        for agent in self.agents:
            self.assertEqual(agent.wait(JOB_TIMEOUT_S).returncode, 7, self.describe())
        self.assertEqual(self.status()["state"], "STOPPED")


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("test_dlrun_control_etcd: skipped, needs root (a UTS namespace per agent)")
        sys.exit(0)
    try:
        main()
    finally:
        shutil.rmtree(STUB_DIR, ignore_errors=True)
