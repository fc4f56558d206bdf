"""Someone watching a job that serves --metrics-port, for the benchmarks that measure what that
costs (rdzv_bench.py --metrics, hang_bench.py --feature metrics-port).

A Watcher thread does, for every target (a port on 127.0.0.1) as soon as it is known and then
once a second, what Prometheus with a 1 s scrape interval and an open page do: GET /metrics and
GET /api/state (the page polls it once a second), each on a keep-alive connection of its own.
Targets come from a callable asked every TICK_S; a request that fails (the target has exited)
is counted and tried again at the next second. It runs in the benchmark's process, so its CPU
is not the agents' or dlrund's; on the same cores it does weigh on the wall-clock figures, as a
Prometheus on the node would.
"""

import http.client
import re
import threading
import time

TICK_S = 0.02  # how often new targets are looked for and due requests made
INTERVAL_S = 1.0  # Prometheus's scrape interval here, and the page's poll
TIMEOUT_S = 1.0
PATHS = ("/metrics", "/api/state")
AGENT_LINE = re.compile(r"metrics on http://[^ ]*:(\d+)/metrics")  # on a dlrun agent's stderr
DLRUND_LINE = re.compile(r"dlrund serves metrics on http://[^ ]*:(\d+)/metrics")  # dlrund's stdout


class Watcher(threading.Thread):
    """Scrapes and polls the ports find_targets() returns (an iterable, asked every TICK_S)
    until stop(). Counts: `requests` answered 200, `failures`; `last`: per port, when its latest
    /metrics text came (monotonic) and that text."""

    def __init__(self, find_targets):
        super().__init__(daemon=True)
        self.find_targets = find_targets
        self.requests = 0
        self.failures = 0
        self.last = {}
        self._stopping = threading.Event()
        self._due = {}  # port -> when its next requests are due (monotonic)
        self._connections = {}  # (port, path) -> HTTPConnection

    def run(self):
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                for port in self.find_targets():
                    self._due.setdefault(port, now)
                for port, due in self._due.items():
                    if due <= now:
                        self._due[port] = now + INTERVAL_S
                        for path in PATHS:
                            self._get(port, path)
                self._stopping.wait(TICK_S)
        finally:
            for connection in self._connections.values():
                connection.close()

    def _get(self, port, path):
        connection = self._connections.setdefault(
            (port, path), http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        )
        try:
            connection.request("GET", path)
            reply = connection.getresponse()
            body = reply.read()
        except (OSError, http.client.HTTPException):
            connection.close()  # the next request connects again
            self.failures += 1
            return
        if reply.status != 200:
            self.failures += 1
            return
        self.requests += 1
        if path == "/metrics":
            self.last[port] = (time.monotonic(), body.decode(errors="replace"))

    def stop(self):
        self._stopping.set()
        self.join()


def metric_sum(text, name):
    """The sum of every sample of metric `name` (all its label sets) in an exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total
