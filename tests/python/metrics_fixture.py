"""--metrics-port for the Python acceptance tests: finding the printed address, fetching pages,
checking expositions with promtool, and a real Prometheus (Debian's) on loopback.

Only loopback is used. Every process started here is stopped by PID in a cleanup.
"""

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

from dlrun_fixture import POLL_S, die_with_parent, free_port, read_shared, temp_dir

METRICS_LINE = re.compile(r"metrics on http://[^ ]*:(\d+)/metrics")
PROMETHEUS_START_S = 30


def wait_for(predicate, timeout, what, describe=None):
    """Polls `predicate` until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = describe() if describe else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")
        time.sleep(POLL_S * 10)


def metrics_port(launcher, timeout=20):
    """The port a dlrun agent printed for --metrics-port (stderr)."""

    def port():
        match = METRICS_LINE.search(launcher.output()[1])
        return int(match.group(1)) if match else None

    return wait_for(port, timeout, "the agent's metrics address", launcher.describe)


def http_get(port, path, timeout=5, host="127.0.0.1"):
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as reply:
        return reply.status, reply.headers.get("Content-Type"), reply.read().decode()


def promtool_check(test, text):
    """promtool check metrics accepts `text` (no problems, no lint warnings)."""
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    test.assertEqual(check.returncode, 0, f"{check.stdout}{check.stderr}\n--- text ---\n{text}")
    test.assertEqual(
        check.stdout.strip() + check.stderr.strip(), "", f"promtool complains\n--- text ---\n{text}"
    )


class Prometheus:
    """A real Prometheus scraping `targets` ({name: port on 127.0.0.1, or "HOST:PORT"}) every
    second, on loopback."""

    def __init__(self, test, targets):
        if not shutil.which("prometheus"):
            raise RuntimeError(
                "prometheus is not installed (Debian package prometheus; "
                "scripts/setup.sh installs it)"
            )
        directory = temp_dir(test)
        config = os.path.join(directory, "prometheus.yml")
        scrape = [
            {
                "targets": [at if isinstance(at, str) else f"127.0.0.1:{at}"],
                "labels": {"node": name},
            }
            for name, at in targets.items()
        ]
        with open(config, "w") as f:
            # JSON is YAML.
            json.dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [{"job_name": "dlrun", "static_configs": scrape}],
                },
                f,
            )
        self.port = free_port()
        self.log = open(os.path.join(directory, "prometheus.log"), "w+")
        test.addCleanup(self.log.close)
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={os.path.join(directory, 'data')}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        test.addCleanup(self.stop)
        wait_for(self.ready, PROMETHEUS_START_S, "Prometheus to be ready", self.describe)

    def ready(self):
        try:
            return http_get(self.port, "/-/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def describe(self):
        return "--- prometheus log ---\n" + read_shared(self.log)[-4000:]

    def query(self, expression):
        """The instant vector of `expression`: {label tuple: value}."""
        _, _, body = http_get(
            self.port, "/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        )
        data = json.loads(body)
        if data["status"] != "success":
            raise AssertionError(f"query {expression!r}: {data}")
        return {
            tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["data"]["result"]
        }

    def value(self, expression):
        """The single value of `expression`, or None while it has none."""
        result = self.query(expression)
        return next(iter(result.values())) if len(result) == 1 else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
