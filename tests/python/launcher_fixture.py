"""A launcher process for the integration tests (torchrun, dlrun, dlrund), on loopback or inside a
simulated host, its output in a log file; and dlrund inside simulated host 0 at RDZV_PORT. Used
by the torch 2.13 tests across hosts (test_torch2_elastic.py, the recovery, checkpoint and
health tests on simulated hosts)."""

import os
import subprocess

from dlrun_fixture import (
    binary_from_env,
    die_with_parent,
    kill_recorded_workers,
    read_shared,
    wait_until,
)

RDZV_PORT = 29400
RUN_TIMEOUT_S = 150  # one launch of torch 2.13 workers on a loaded 2-core machine
START_TIMEOUT_S = 30  # dlrund's listening line; a worker's first file


class Launcher:
    """One launcher process (torchrun, dlrun, dlrund), on loopback or inside a simulated host,
    its output in a log file. Stopped by PID in the test's cleanup; on loopback the workers
    that recorded a pid in OUT_DIR are killed too (torchrun's workers lead sessions of their own
    and would outlive a killed torchrun), inside a host every process dies with the host."""

    def __init__(self, test, name, argv, env, log_dir, hosts=None, host=None, out_dir=None):
        self.name = name
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w+b")
        test.addCleanup(self.log.close)
        if out_dir is not None:
            test.addCleanup(kill_recorded_workers, out_dir)
        if hosts is None:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        else:
            self.proc = hosts.popen(host, argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        test.addCleanup(self.kill)

    def output(self):
        return read_shared(self.log)

    def describe(self):
        return f"--- {self.name} ---\n{self.output()}"

    def wait(self, timeout=RUN_TIMEOUT_S):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} still running after {timeout}s\n{self.describe()}"
            ) from None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def dlrund_in(test, hosts, env, log_dir, *flags):
    """dlrund inside host 0 at RDZV_PORT; its Launcher, once it listens."""
    dlrund = Launcher(
        test,
        "dlrund",
        [
            binary_from_env("DLRUND", "dlrund"),
            "--host",
            "0.0.0.0",
            "--port",
            str(RDZV_PORT),
            *flags,
        ],
        env,
        log_dir,
        hosts=hosts,
        host=0,
    )
    wait_until(
        lambda: "dlrund listening on" in dlrund.output(),
        START_TIMEOUT_S,
        "dlrund to listen",
        proc=dlrund.proc,
        on_timeout=dlrund.describe,
    )
    return dlrund
