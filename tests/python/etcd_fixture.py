"""Starts one etcd member on loopback for the Python acceptance tests of the etcd backend (and
for bench/rdzv_bench.py).

Debian's /usr/bin/etcd (3.4) on two free ports with a data directory of the test's own; a test
that cannot find it fails rather than skips. launch_etcd() returns once etcd answers a v3 read
(polled with a deadline, never a fixed sleep); start_etcd() also registers, in the test's
cleanups, a SIGKILL by PID and the wait for it, so etcd goes also when the test fails.
"""

import os
import signal
import subprocess
import time

from dlrun_fixture import POLL_S, die_with_parent, free_ports, temp_dir

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
START_TIMEOUT_S = 20


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(directory, name):
    """A self-signed CA in `directory`: (name.pem, name.key) paths."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=dlrun test {name}",
        cwd=directory,
    )
    return os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")


def make_cert(directory, ca, name, common_name, server):
    """A certificate signed by `ca` (make_ca's pair): (name.pem, name.key) paths. A server's
    carries SAN IP:127.0.0.1, which gRPC checks against the endpoint it dials."""
    ext = os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as f:
        if server:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        else:
            f.write("extendedKeyUsage=clientAuth\n")
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={common_name}",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        ca[0],
        "-CAkey",
        ca[1],
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        ext,
        cwd=directory,
    )
    return os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")


class Tls:
    """A CA, etcd's server certificate and a client certificate (CN `root`), made with openssl
    in `directory`; etcd then demands client certificates signed by the CA."""

    def __init__(self, directory):
        self.ca = make_ca(directory, "ca")
        self.server = make_cert(directory, self.ca, "server", "127.0.0.1", server=True)
        self.client = make_cert(directory, self.ca, "client", "root", server=False)

    def client_conf(self, ca=None):
        """--rdzv-conf's TLS keys for dlrun: this CA (or `ca`), the client certificate."""
        return f"cacert={ca or self.ca[0]},cert={self.client[0]},key={self.client[1]}"

    def etcdctl_args(self):
        return [f"--cacert={self.ca[0]}", f"--cert={self.client[0]}", f"--key={self.client[1]}"]


class Etcd:
    def __init__(self, proc, client_port, log_path, tls=None, argv=()):
        self.proc = proc
        self.argv = list(argv)  # its command line, for restart()
        self.port = client_port
        self.endpoint = f"127.0.0.1:{client_port}"
        self.log_path = log_path
        self.tls = tls
        self.etcdctl = [
            ETCDCTL,
            f"--endpoints={'https' if tls else 'http'}://{self.endpoint}",
            *(tls.etcdctl_args() if tls else []),
        ]

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self):
        """Starts the stopped etcd again with the same command line and data (a member that
        comes back); returns once it answers, else raises EtcdStartError."""
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,
            )
        self.await_answer()

    def await_answer(self):
        """Returns once etcd answers; stops it and raises EtcdStartError if it exits first or
        does not answer within START_TIMEOUT_S."""
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self.answers():
                if self.proc.poll() is not None:
                    raise EtcdStartError(
                        f"etcd exited with {self.proc.returncode} before it answered\n{self.log()}"
                    )
                if time.monotonic() >= deadline:
                    raise EtcdStartError(
                        f"etcd did not answer within {START_TIMEOUT_S}s\n{self.log()}"
                    )
                time.sleep(POLL_S)
        except BaseException:
            self.stop()
            raise

    def keys(self, prefix):
        """The keys under `prefix`, read with etcdctl."""
        result = subprocess.run(
            [
                *self.etcdctl,
                "--dial-timeout=2s",
                "--command-timeout=5s",
                "get",
                "--prefix",
                "--keys-only",
                prefix,
            ],
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )
        return [line for line in result.stdout.splitlines() if line]

    def ctl(self, *args, user=None):
        """One etcdctl command (as `user`, "name:password", when given); its CompletedProcess."""
        return subprocess.run(
            [
                *self.etcdctl,
                "--dial-timeout=2s",
                "--command-timeout=5s",
                *([f"--user={user}"] if user else []),
                *args,
            ],
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )

    def answers(self):
        """One v3 read through etcdctl, bounded by its own timeouts."""
        try:
            result = subprocess.run(
                [*self.etcdctl, "--dial-timeout=1s", "--command-timeout=1s", "endpoint", "health"],
                env={**os.environ, "ETCDCTL_API": "3"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=5,
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


def member_args(m, addresses, data_dir, token):
    """etcd's command line for member m ("m<m>") of a new cluster whose members listen on
    `addresses` ({member: address}; clients on port 2379, peers on 2380)."""
    initial = ",".join(f"m{i}=http://{address}:2380" for i, address in addresses.items())
    address = addresses[m]
    return [
        ETCD,
        f"--name=m{m}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://{address}:2379",
        f"--advertise-client-urls=http://{address}:2379",
        f"--listen-peer-urls=http://{address}:2380",
        f"--initial-advertise-peer-urls=http://{address}:2380",
        f"--initial-cluster={initial}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={token}",
    ]


class EtcdStartError(Exception):
    """etcd is missing, exited, or did not answer in time; the message says which."""


def launch_etcd(directory, tls=None, extra_args=()):
    """Starts etcd with its data and log in `directory`; returns an Etcd that answers (the
    caller stops it). Raises EtcdStartError, with etcd already stopped, if it cannot. With
    `tls` (a Tls), etcd serves https with its server certificate and demands client
    certificates signed by its CA; `extra_args` go on etcd's command line (the benchmark's
    `--enable-v2`, say)."""
    for path in (ETCD, ETCDCTL):
        if not os.access(path, os.X_OK):
            raise EtcdStartError(
                f"{path} is missing: the etcd tests need Debian's etcd-server "
                "and etcd-client packages"
            )
    client, peer = free_ports(2)
    scheme = "https" if tls else "http"
    tls_args = (
        [
            f"--cert-file={tls.server[0]}",
            f"--key-file={tls.server[1]}",
            "--client-cert-auth",
            f"--trusted-ca-file={tls.ca[0]}",
        ]
        if tls
        else []
    )
    log_path = os.path.join(directory, "etcd.log")
    argv = [
        ETCD,
        "--name=default",
        f"--data-dir={directory}/data",
        f"--listen-client-urls={scheme}://127.0.0.1:{client}",
        f"--advertise-client-urls={scheme}://127.0.0.1:{client}",
        *tls_args,
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=default=http://127.0.0.1:{peer}",
        f"--initial-cluster-token=dlrun-py-{os.getpid()}-{client}",
        *extra_args,
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=die_with_parent
        )
    etcd = Etcd(proc, client, log_path, tls, argv)
    etcd.await_answer()
    return etcd


def start_etcd(test, tls=None):
    """Starts etcd for `test` (launch_etcd in a directory of the test's own); returns an Etcd
    that answers, stopped in the test's cleanups. Fails the test if it cannot."""
    directory = temp_dir(test)
    try:
        etcd = launch_etcd(directory, tls)
    except EtcdStartError as why:
        test.fail(str(why))
    test.addCleanup(etcd.stop)  # runs before temp_dir's cleanup: etcd stops, then its files go
    return etcd
