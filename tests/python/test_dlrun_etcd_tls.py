"""dlrun's etcd backend against a secured etcd: TLS with a self-made CA and client-certificate
auth (certificates made by the test with openssl), and etcd's user/password authentication.
A job runs with the right settings; a wrong CA or bad credentials are one line and a non-zero
exit within a bounded time, never a wait until join_timeout.

dlrun itself has no TLS, so that no agent loads OpenSSL at its start; it runs dlrun-tls, the
same program built with TLS, in its stead (launcher/tls_build.h). Every TLS job here goes that
way, and so do `dlrun status` and `dlrun stop` of a TLS job.
"""

import glob
import json
import os
import shutil
import subprocess
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    Dlrun,
    clean_env,
    dlrun_binary,
    kill_recorded_workers,
    main,
    read_json,
    run_control,
    temp_dir,
    wait_until,
    worker,
)
from etcd_fixture import Tls, make_ca, start_etcd

WORKER = worker("elastic_worker.py")
JOB_TIMEOUT_S = 60
# A failed handshake is reported at once; at worst within etcd's connect timeout (5 s).
ERROR_WITHIN_S = 15


class EtcdSecurityTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        self.addCleanup(kill_recorded_workers, self.out)

    def run_job(self, etcd, conf, endpoint=None):
        """2 nodes x 1 worker (127.0.0.1 and .2) through `etcd`; both agents' results."""
        args = [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={endpoint or etcd.endpoint}",
            f"--rdzv-id=job{etcd.port}",
            f"--rdzv-conf={conf}",
        ]
        agents = [
            Dlrun(
                self,
                [*args, f"--local-addr={addr}", PYTHON, WORKER, self.out, "--allreduce"],
                env=clean_env(),
            )
            for addr in ("127.0.0.1", "127.0.0.2")
        ]
        return [agent.wait(JOB_TIMEOUT_S) for agent in agents]

    def assert_job_ran(self, results):
        for r in results:
            self.assertEqual(r.returncode, 0, r)
        starts = [read_json(p) for p in glob.glob(os.path.join(self.out, "start_*.json"))]
        self.assertEqual(sorted(s["env"]["RANK"] for s in starts), ["0", "1"])
        for s in starts:
            self.assertEqual(s["sum"], 1 + 2)

    def assert_one_line_error(self, etcd, conf, part, endpoint=None):
        out = temp_dir(self)  # of its own: a job may have run before
        started = time.monotonic()
        r = Dlrun(
            self,
            [
                "--nnodes=2",
                "--rdzv-backend=etcd",
                f"--rdzv-endpoint={endpoint or etcd.endpoint}",
                f"--rdzv-id=job{etcd.port}",
                f"--rdzv-conf={conf}",
                PYTHON,
                WORKER,
                out,
            ],
            env=clean_env(),
        ).wait(JOB_TIMEOUT_S)
        self.assertLess(time.monotonic() - started, ERROR_WITHIN_S, r)
        self.assertNotEqual(r.returncode, 0, r)
        lines = r.dlrun_lines()
        self.assertEqual(len(lines), 1, r)
        self.assertIn(part, lines[0])
        self.assertIn(etcd.endpoint, lines[0])  # names the endpoint
        self.assertEqual(os.listdir(out), [])  # no worker started
        if os.environ.get("DLRUN_TEST_SHOW"):
            print(f"\n{r.returncode} {time.monotonic() - started:.1f}s {lines[0]}")
        return lines[0]

    def test_tls_with_client_certificates_runs_the_job(self):
        tls = Tls(temp_dir(self))
        etcd = start_etcd(self, tls)
        self.assert_job_ran(self.run_job(etcd, tls.client_conf()))
        self.assertNotEqual(etcd.keys(f"/dlrun/job{etcd.port}/"), [])

    def test_https_endpoints_are_accepted(self):
        tls = Tls(temp_dir(self))
        etcd = start_etcd(self, tls)
        self.assert_job_ran(
            self.run_job(etcd, tls.client_conf(), endpoint=f"https://{etcd.endpoint}")
        )

    def test_a_wrong_ca_is_one_line_and_a_non_zero_exit_at_once(self):
        directory = temp_dir(self)
        tls = Tls(directory)
        etcd = start_etcd(self, tls)
        other_ca = make_ca(directory, "other")
        line = self.assert_one_line_error(
            etcd, tls.client_conf(ca=other_ca[0]), "TLS handshake failed"
        )
        self.assertIn("cannot reach etcd", line)

    def test_a_missing_client_certificate_is_one_line(self):
        tls = Tls(temp_dir(self))
        etcd = start_etcd(self, tls)
        self.assert_one_line_error(etcd, f"cacert={tls.ca[0]}", "cannot reach etcd")

    def test_plain_http_against_a_tls_etcd_is_one_line(self):
        tls = Tls(temp_dir(self))
        etcd = start_etcd(self, tls)
        self.assert_one_line_error(etcd, "join_timeout=600", "cannot reach etcd")

    def test_user_and_password_authenticate_and_bad_ones_are_one_line(self):
        etcd = start_etcd(self)
        etcd.ctl("user", "add", "root:rootpw")
        etcd.ctl("auth", "enable")
        password = os.path.join(temp_dir(self), "password")
        with open(password, "w") as f:
            f.write("rootpw\n")
        self.assert_job_ran(self.run_job(etcd, f"user=root,password_file={password}"))
        self.assertNotEqual(
            etcd.ctl("get", "--prefix", "--keys-only", "/dlrun/", user="root:rootpw").stdout, ""
        )
        line = self.assert_one_line_error(
            etcd, "user=root,password=wrong", "authentication as 'root' failed"
        )
        self.assertIn("authentication failed", line)  # etcd's own words
        # Without credentials etcd refuses the first call: one line too.
        self.assert_one_line_error(etcd, "join_timeout=600", "user name is empty")

    def test_status_and_stop_of_a_tls_job_dial_etcd_over_tls(self):
        tls = Tls(temp_dir(self))
        etcd = start_etcd(self, tls)
        job = f"job{etcd.port}"
        target = [
            "--rdzv-backend=etcd",
            f"--rdzv-endpoint={etcd.endpoint}",
            f"--rdzv-id={job}",
            f"--rdzv-conf={tls.client_conf()}",
        ]
        agents = [
            Dlrun(
                self,
                [
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    *target,
                    f"--local-addr={addr}",
                    PYTHON,
                    WORKER,
                    self.out,
                    "--wait",
                ],
                env=clean_env(),
            )
            for addr in ("127.0.0.1", "127.0.0.2")
        ]

        def state():
            code, out, err = run_control("status", "--json", *target)
            if code == 2 and "no job" in err:
                return None  # not registered yet
            self.assertEqual(code, 0, err)
            return json.loads(out)["state"]

        wait_until(
            lambda: state() == "RUNNING",
            JOB_TIMEOUT_S,
            "the job to run",
            on_timeout=lambda: "\n".join(a.describe() for a in agents),
        )
        code, out, err = run_control("stop", "--exit-code=7", *target)
        self.assertEqual(code, 0, err)
        for agent in agents:
            self.assertEqual(agent.wait(JOB_TIMEOUT_S).returncode, 7, agent.describe())

    def test_only_the_tls_build_loads_openssl(self):
        def loaded(path):  # every library the loader maps for it (ldd: the whole closure)
            listing = subprocess.run(
                ["ldd", path], capture_output=True, text=True, check=True
            ).stdout
            return [line.split()[0] for line in listing.splitlines() if "=>" in line]

        plain = loaded(dlrun_binary())
        self.assertIn("libc.so.6", plain)
        # Where gRPC is a shared library (Debian 13) dlrun's is the build without TLS too, and
        # dlrun-tls's libgrpc brings OpenSSL: the loader's closure tells either way.
        self.assertEqual([lib for lib in plain if lib.startswith(("libssl", "libcrypto"))], [])
        tls = loaded(os.path.join(os.path.dirname(dlrun_binary()), "dlrun-tls"))
        self.assertIn("libssl.so.3", tls)

    def test_without_its_tls_build_dlrun_says_so_in_one_line(self):
        directory = temp_dir(self)
        tls = Tls(directory)
        alone = os.path.join(directory, "dlrun")  # no dlrun-tls beside it, none installed
        shutil.copy(dlrun_binary(), alone)
        r = subprocess.run(
            [
                alone,
                "--nnodes=2",
                "--rdzv-backend=etcd",
                "--rdzv-endpoint=127.0.0.1:1",
                f"--rdzv-conf={tls.client_conf()}",
                "true",
            ],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
        self.assertEqual(r.returncode, 1, r)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r)
        self.assertIn("etcd over TLS needs dlrun-tls", lines[0])


if __name__ == "__main__":
    main()
