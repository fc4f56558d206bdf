"""Acceptance 2 of issue 15: the live page in a real browser.

Two dlrun agents (one trainer each, Fashion-MNIST) meet at a dlrund. Headless Chromium (Debian's
chromium and chromium-driver through python3-selenium, a fresh profile, no network beyond
loopback) opens the page of one agent's --metrics-port: it lists the job's nodes and ranks, the
loss curve gains points while the job trains, and when the other node's agent is SIGKILLed the
lost node shows up among the events within 2 s. A screenshot goes to the test's output
directory (test-output/ in ctest's working directory).
"""

import os
import signal
import time
import unittest

from dlrun_fixture import Dlrun, clean_env, main, temp_dir
from dlrund_fixture import start_dlrund
from metrics_fixture import metrics_port, wait_for
from trainer_fixture import require_data

PAGE_TIMEOUT_S = 60
EVENT_WITHIN_S = 2


def output_dir():
    path = os.path.join(os.getcwd(), "test-output")
    os.makedirs(path, exist_ok=True)
    return path


def browser(test):
    """Headless Chromium through chromedriver, quit (and its driver stopped by PID) at cleanup."""
    from chromium_fixture import start_chromium  # selenium: a failure in the test, not the file

    driver, service = start_chromium(temp_dir(test), 900)

    def quit():
        driver.quit()
        if service.process and service.process.poll() is None:
            service.process.kill()
            service.process.wait()

    test.addCleanup(quit)
    return driver


class PageTest(unittest.TestCase):
    def start_job(self):
        daemon = start_dlrund(self)
        return [
            Dlrun(
                self,
                [
                    "--nnodes=1:2",
                    "--nproc-per-node=1",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{daemon.port}",
                    f"--rdzv-id=page{daemon.port}",
                    "--max-restarts=3",
                    "--rdzv-conf=last_call_timeout=5",
                    f"--local-addr=127.0.0.{i + 1}",
                    "--metrics-port=0",
                    "train",
                    "--epochs=100",
                    "--progress-every=20",
                ],
                env=clean_env(),
            )
            for i in range(2)
        ]

    def rows(self, driver, table):
        # Read in one script: the page redraws its tables as it polls, so elements found in
        # one call may be gone by the next (stale).
        return driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), tr =>"
            " Array.from(tr.querySelectorAll('td'), td => td.innerText));",
            f"#{table} tbody tr",
        )

    def loss_points(self, driver):
        points = driver.execute_script(
            "const p = document.querySelector('#loss-step path.curve');"
            " return p ? p.getAttribute('data-points') : null;"
        )
        return int(points) if points else 0

    def test_the_page_shows_nodes_growing_curves_and_a_lost_node(self):
        require_data(self)
        agents = self.start_job()
        port = metrics_port(agents[0])
        driver = browser(self)
        driver.get(f"http://127.0.0.1:{port}/")

        def describe():
            return "".join(a.describe() for a in agents)

        nodes = wait_for(
            lambda: (lambda r: r if len(r) == 2 else None)(self.rows(driver, "nodes-table")),
            PAGE_TIMEOUT_S,
            "two nodes on the page",
            describe,
        )
        self.assertEqual([row[0].split()[0] for row in nodes], ["127.0.0.1", "127.0.0.2"])
        self.assertEqual([row[1] for row in nodes], ["0", "1"])
        workers = self.rows(driver, "workers-table")
        self.assertEqual(len(workers), 1)
        self.assertEqual(workers[0][3], "running")

        first = wait_for(
            lambda: self.loss_points(driver),
            PAGE_TIMEOUT_S,
            "the loss curve's first points",
            describe,
        )
        wait_for(
            lambda: self.loss_points(driver) > first + 2,
            PAGE_TIMEOUT_S,
            "the loss curve to gain points",
            describe,
        )
        driver.save_screenshot(os.path.join(output_dir(), "metrics_page.png"))

        agents[1].proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        agents[1].proc.wait()

        def lost_event():
            return any(
                row[2] == "round_ended" and "lost" in row[4]
                for row in self.rows(driver, "events-table")
            )

        wait_for(lost_event, EVENT_WITHIN_S + 5, "the lost node among the events", describe)
        self.assertLess(time.monotonic() - killed, EVENT_WITHIN_S)
        driver.save_screenshot(os.path.join(output_dir(), "metrics_page_node_lost.png"))
        # Nothing came from anywhere but the page's own origin.
        for entry in driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        ):
            self.assertTrue(entry.startswith(f"http://127.0.0.1:{port}/"), entry)


if __name__ == "__main__":
    main()
