"""Acceptance 1 of issue 15: a real Prometheus scrapes a running 2-node job.

Two dlrun agents (2 workers each) meet at a dlrund; each agent and dlrund serve --metrics-port.
Prometheus (Debian's, on loopback, 1 s scrapes) sees 4 workers up; after one node's agent is
SIGKILLed, the survivor's restart counter (cause node_lost) is 1. promtool accepts every
exposition.
"""

import os
import re
import signal
import unittest

from dlrun_fixture import PYTHON, Dlrun, clean_env, kill_recorded_workers, main, temp_dir, worker
from dlrund_fixture import read_line, start_dlrund
from metrics_fixture import Prometheus, http_get, metrics_port, promtool_check, wait_for

JOB_TIMEOUT_S = 60
DLRUND_METRICS = re.compile(rb"dlrund serves metrics on http://[^ ]*:(\d+)/metrics")


class PrometheusTest(unittest.TestCase):
    def start_job(self):
        daemon = start_dlrund(self, "--metrics-port", "0")
        lines = [read_line(daemon.proc.stdout, 10) for _ in range(2)]
        match = DLRUND_METRICS.match(lines[-1])
        self.assertTrue(match, lines)
        out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, out)
        stop = os.path.join(out, "stop")
        self.addCleanup(lambda: open(stop, "w").close())
        agents = [
            Dlrun(
                self,
                [
                    "--nnodes=1:2",
                    "--nproc-per-node=2",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{daemon.port}",
                    f"--rdzv-id=prom{daemon.port}",
                    "--max-restarts=3",
                    "--rdzv-conf=last_call_timeout=5",
                    f"--local-addr=127.0.0.{i + 1}",
                    "--metrics-port=0",
                    PYTHON,
                    worker("elastic_worker.py"),
                    out,
                    "--until-file",
                    stop,
                ],
                env=clean_env(),
            )
            for i in range(2)
        ]
        return int(match.group(1)), agents

    def test_prometheus_sees_the_workers_and_a_restart_after_a_node_is_killed(self):
        dlrund_port, agents = self.start_job()
        ports = [metrics_port(a) for a in agents]
        # Each agent's metrics listen on the address its node uses for the job (--local-addr).
        prometheus = Prometheus(
            self, {"node0": ports[0], "node1": f"127.0.0.2:{ports[1]}", "dlrund": dlrund_port}
        )
        if ports[1] != ports[0]:  # else 127.0.0.1 has node0's there
            with self.assertRaises(OSError):
                http_get(ports[1], "/metrics", timeout=2)  # not on 127.0.0.1

        def describe():
            return prometheus.describe() + "".join(a.describe() for a in agents)

        wait_for(
            lambda: prometheus.value("sum(dlrun_workers_up)") == 4,
            JOB_TIMEOUT_S,
            "Prometheus to see 4 workers up",
            describe,
        )
        wait_for(
            lambda: prometheus.value('sum(up{job="dlrun"})') == 3,
            JOB_TIMEOUT_S,
            "every target scraped",
            describe,
        )
        self.assertEqual(prometheus.value('sum(dlrun_rendezvous_restarts_total{node="node0"})'), 0)
        self.assertEqual(prometheus.value('dlrun_rendezvous_workers{node="node0"}'), 4)
        self.assertGreater(
            prometheus.value('dlrun_store_requests_total{node="dlrund",op="ADD"}'), 0
        )
        for host, port in [
            ("127.0.0.1", ports[0]),
            ("127.0.0.2", ports[1]),
            ("127.0.0.1", dlrund_port),
        ]:
            status, content_type, text = http_get(port, "/metrics", host=host)
            self.assertEqual(status, 200)
            self.assertTrue(content_type.startswith("text/plain; version=0.0.4"), content_type)
            promtool_check(self, text)

        agents[1].proc.send_signal(signal.SIGKILL)  # its workers die with it (PDEATHSIG)
        agents[1].proc.wait()
        restarted = 'dlrun_rendezvous_restarts_total{node="node0",cause="node_lost"}'
        wait_for(
            lambda: prometheus.value(restarted) == 1,
            JOB_TIMEOUT_S,
            "the survivor's restart counter at 1",
            describe,
        )
        wait_for(
            lambda: prometheus.value("sum(dlrun_workers_up)") == 2,
            JOB_TIMEOUT_S,
            "the survivor's 2 new workers up",
            describe,
        )
        self.assertEqual(prometheus.value('sum(dlrun_rendezvous_restarts_total{node="node0"})'), 1)
        self.assertEqual(
            prometheus.value('dlrun_rendezvous_node_loss_recovery_seconds_count{node="node0"}'), 1
        )
        promtool_check(self, http_get(ports[0], "/metrics")[2])


if __name__ == "__main__":
    main()
