"""Simulated hosts that run real OpenSSH servers, for dlrun --hostfile and mpirun.

    with SshHosts(4, ssh_hosts=(1, 2, 3)) as hosts:     # sshd on node1..node3, port SSH_PORT
        hosts.ssh_command()                             # the client line with the test's key

Each server is Debian's /usr/sbin/sshd started by the test inside its host's network namespace
with a host key and an authorized client key the test made (ssh-keygen) in its own directory,
and stopped by PID with the set (netns_fixture.Hosts). A host is ready once its sshd wrote
"Server listening" to its log.
"""

import os
import subprocess

from dlrun_fixture import EVENT_TIMEOUT_S, wait_until
from netns_fixture import Hosts

SSHD = "/usr/sbin/sshd"
SSH_PORT = 2222


def read(path):
    with open(path) as f:
        return f.read()


class SshHosts(Hosts):
    def __init__(self, n, ssh_hosts, directory):
        super().__init__(n)
        try:
            self.dir = directory
            self.key = os.path.join(directory, "client_key")
            host_key = os.path.join(directory, "host_key")
            for path in (self.key, host_key):
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path],
                    check=True,
                    stdin=subprocess.DEVNULL,
                    timeout=30,
                )
            authorized = os.path.join(directory, "authorized_keys")
            with open(self.key + ".pub") as src, open(authorized, "w") as dst:
                dst.write(src.read())
            os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
            self.sshd = {}
            for i in ssh_hosts:
                log_path = os.path.join(directory, f"sshd{i}.log")
                with open(log_path, "w") as log:
                    self.sshd[i] = self.popen(
                        i,
                        [
                            SSHD,
                            "-D",
                            "-e",
                            "-f",
                            "/dev/null",
                            "-p",
                            str(SSH_PORT),
                            "-h",
                            host_key,
                            "-o",
                            f"AuthorizedKeysFile={authorized}",
                            "-o",
                            "StrictModes=no",
                            "-o",
                            "UsePAM=no",
                            "-o",
                            "PidFile=none",
                        ],
                        stdout=log,
                        stderr=log,
                    )
                wait_until(
                    lambda: "Server listening" in read(log_path),
                    EVENT_TIMEOUT_S,
                    f"sshd on {self.hostname(i)}",
                    proc=self.sshd[i],
                )
        except BaseException:
            self.close()
            raise

    def ssh_words(self):
        """The ssh client with the test's key, trusting the servers' new host key."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            self.key,
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
        ]

    def ssh_command(self):
        return " ".join(self.ssh_words())

    def job_processes(self, i):
        """The PIDs inside host i other than its sshd listener: what a job left there."""
        return [pid for pid in self.pids(i) if pid != self.sshd[i].pid]
