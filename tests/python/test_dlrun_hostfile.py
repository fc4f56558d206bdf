"""One command for the whole cluster (issue 14): `dlrun --hostfile` from one simulated host starts
an agent on each of three others over real OpenSSH servers (ssh_fixture.SshHosts), and mpirun
(Debian's openmpi-bin) starts one dlrun per host over the same servers.

- 3 nodes x 2 workers: ranks, WORLD_SIZE, TF_CONFIG and a torch gloo all-reduce across hosts are
  right, the workers run in the launcher's directory, an --export'ed variable arrives, and every
  line of output carries its node's name.
- SIGINT to the launcher: every worker on every host exits within --stop-timeout + 2 s and
  nothing of the job is left in any host; SIGKILL to one ssh client: nothing is left on its host.
- A worker failure: the launcher exits with its code and names host, rank and code; with
  --max-restarts the job recovers.
- mpirun -np 3 with one dlrun per host: the same world as the hostfile's.
- Bad hostfiles and an unreachable host: one line naming the line or host, exit 2, no worker
  started anywhere.
"""

import glob
import json
import os
import shutil
import signal
import sys
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    is_running,
    temp_dir,
    wait_until,
    worker,
    worker_starts,
)
from netns_fixture import main
from ssh_fixture import SSH_PORT, SSHD, SshHosts, read

WORKER = worker("elastic_worker.py")
RUN_TIMEOUT_S = 120  # a run of 6 torch workers on 3 hosts, on 2 busy cores
STOP_TIMEOUT_S = 3
HOSTS = ("node1", "node2", "node3")


def setUpModule():
    if os.geteuid() != 0:
        print("test_dlrun_hostfile: skipped, needs root", file=sys.stderr)
        raise unittest.SkipTest("network namespaces need root")
    if not os.access(SSHD, os.X_OK):
        raise AssertionError(
            f"{SSHD} is missing: the test needs Debian's openssh-server "
            "(scripts/setup.sh installs it)"
        )


class HostfileTest(unittest.TestCase):
    def setUp(self):
        self.out = temp_dir(self)
        # Host 0 launches; hosts 1..3 run sshd and the agents.
        self.hosts = SshHosts(4, (1, 2, 3), self.out)
        self.addCleanup(self.hosts.close)
        self.hostfile = os.path.join(self.out, "hostfile")
        with open(self.hostfile, "w") as f:
            f.write("# three hosts\n" + "".join(f"{h} slots=2\n" for h in HOSTS))

    def dlrun(self, *args):
        return [
            binary_from_env("DLRUN", "dlrun"),
            f"--ssh-command={self.hosts.ssh_command()}",
            f"--ssh-port={SSH_PORT}",
            f"--stop-timeout={STOP_TIMEOUT_S}",
            *args,
        ]

    def env(self, **extra):
        # The workers' Python is the one with torch, on every host (PYTHON_EXEC goes along).
        return clean_env(GLOO_SOCKET_IFNAME=None, TMPDIR=self.out, PYTHON_EXEC=PYTHON, **extra)

    def run_launcher(self, *args, **extra_env):
        return self.hosts.run(
            0, self.dlrun(*args), timeout=RUN_TIMEOUT_S, env=self.env(**extra_env), cwd=self.out
        )

    def start_launcher(self, *args):
        self.log = os.path.join(self.out, "launcher.log")
        with open(self.log, "w") as log:
            return self.hosts.popen(
                0, self.dlrun(*args), env=self.env(), cwd=self.out, stdout=log, stderr=log
            )

    def launcher_log(self):
        return read(self.log)

    def start_waiting_job(self):
        """The hostfile's job of 6 workers that wait to be stopped, once they all started."""
        launcher = self.start_launcher("--hostfile", self.hostfile, WORKER, ".", "--wait")
        wait_until(
            lambda: len(worker_starts(self.out)) == 6,
            60,
            "6 workers to start",
            proc=launcher,
            on_timeout=self.launcher_log,
        )
        return launcher

    def assert_nothing_left(self, hosts=(1, 2, 3)):
        for i in hosts:
            wait_until(
                lambda: not self.hosts.job_processes(i),
                5,
                f"the job's processes on node{i} to be gone (left: {self.hosts.job_processes(i)})",
            )

    def assert_host_world(self, records):
        self.assertEqual([int(r["env"]["RANK"]) for r in records], list(range(6)))
        tf_workers = None
        for r in records:
            rank = int(r["env"]["RANK"])
            self.assertEqual(r["host"], HOSTS[rank // 2], r)
            self.assertEqual(r["env"]["WORLD_SIZE"], "6")
            self.assertEqual(r["env"]["GROUP_RANK"], str(rank // 2))
            self.assertEqual(r["env"]["GROUP_WORLD_SIZE"], "3")
            self.assertEqual(r["sum"], 21.0)  # 1 + 2 + ... + 6 over every host
            tf = json.loads(r["env"]["TF_CONFIG"])
            self.assertEqual(tf["task"], {"type": "worker", "index": rank})
            tf_workers = tf_workers or tf["cluster"]["worker"]
            self.assertEqual(tf["cluster"]["worker"], tf_workers)
        self.assertEqual(len(tf_workers), 6)
        for rank, address in enumerate(tf_workers):
            self.assertTrue(address.startswith(self.hosts.address(1 + rank // 2) + ":"), tf_workers)

    def test_three_hosts_one_command(self):
        result = self.run_launcher(
            "--hostfile",
            self.hostfile,
            "--export=JOB_NOTE",
            WORKER,
            ".",
            "--allreduce",
            JOB_NOTE="from the launcher",
        )
        self.assertEqual(result.returncode, 0, result)
        # "." is the launcher's directory: every agent ran there.
        self.assert_host_world(worker_starts(self.out))
        lines = (result.stdout + result.stderr).splitlines()
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^(node[123]: |dlrun: )", result)
        for host in HOSTS:
            self.assertIn(f"{host}: ", result.stderr)
        self.assert_nothing_left()

    def test_export_and_hosts_list(self):
        # --hosts, slots from the list; a variable given with --export reaches the workers.
        script = os.path.join(self.out, "note.sh")
        with open(script, "w") as f:
            f.write('#!/bin/sh\necho "note=$JOB_NOTE path=$PWD"\n')
        os.chmod(script, 0o755)
        result = self.run_launcher(
            "--hosts=node1:1,node3:2",
            "--export=JOB_NOTE",
            "--no-python",
            script,
            JOB_NOTE="hello there",
        )
        self.assertEqual(result.returncode, 0, result)
        notes = sorted(line for line in result.stdout.splitlines() if "note=" in line)
        self.assertEqual(
            notes,
            [
                f"node1: [0]:note=hello there path={self.out}",
                f"node3: [1]:note=hello there path={self.out}",
                f"node3: [2]:note=hello there path={self.out}",
            ],
        )

    def test_sigint_stops_every_node(self):
        launcher = self.start_waiting_job()
        pids = [r["pid"] for r in worker_starts(self.out)]
        launcher.send_signal(signal.SIGINT)
        sent = time.monotonic()
        wait_until(
            lambda: not any(is_running(p) for p in pids),
            STOP_TIMEOUT_S + 2,
            "every worker to exit",
            on_timeout=self.launcher_log,
        )
        self.assertLessEqual(time.monotonic() - sent, STOP_TIMEOUT_S + 2)
        self.assertEqual(launcher.wait(timeout=30), 128 + signal.SIGINT, self.launcher_log())
        self.assertIn("job stopped: SIGINT", self.launcher_log())
        self.assert_nothing_left()

    def test_user_signals_reach_every_worker_and_the_job_goes_on(self):
        out = temp_dir(self)
        launcher = self.start_launcher(
            "--hosts=node1:1,node2:1", worker("signal_worker.py"), out, "trap"
        )
        wait_until(
            lambda: all(os.path.exists(os.path.join(out, f"pid_{r}")) for r in (0, 1)),
            60,
            "2 workers to be ready",
            proc=launcher,
            on_timeout=self.launcher_log,
        )
        launcher.send_signal(signal.SIGUSR1)
        # Each worker exits 0 on it: the job ends well, and the launcher was not stopped.
        self.assertEqual(launcher.wait(timeout=30), 0, self.launcher_log())
        for rank in (0, 1):
            self.assertTrue(
                os.path.exists(os.path.join(out, f"got_SIGUSR1_{rank}")), self.launcher_log()
            )
        self.assertNotIn("stopping every node", self.launcher_log())

    def test_killed_ssh_client_leaves_no_orphan(self):
        launcher = self.start_waiting_job()
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
            clients = [int(p) for p in f.read().split()]
        node2 = [p for p in clients if "node2" in read(f"/proc/{p}/cmdline")]
        self.assertEqual(len(node2), 1, clients)
        os.kill(node2[0], signal.SIGKILL)
        node2_workers = [r["pid"] for r in worker_starts(self.out) if r["host"] == "node2"]
        wait_until(
            lambda: not any(is_running(p) for p in node2_workers),
            STOP_TIMEOUT_S + 2,
            "node2's workers to exit",
            on_timeout=self.launcher_log,
        )
        self.assert_nothing_left(hosts=(2,))
        # The launcher says which node it lost, and the others stop too.
        self.assertNotEqual(launcher.wait(timeout=30), 0)
        self.assertIn("lost node2", self.launcher_log())
        self.assert_nothing_left()

    def test_worker_failure_names_host_rank_and_code(self):
        result = self.run_launcher(
            "--hostfile", self.hostfile, WORKER, ".", "--fail-rank", "3", "--fail-rounds", "-1"
        )
        self.assertEqual(result.returncode, 3, result)
        last = result.stderr.strip().splitlines()[-1]
        self.assertRegex(last, r"^dlrun: .*rank 3 on node2 .*exit code 3", result)
        self.assert_nothing_left()

    def test_max_restarts_recover(self):
        result = self.run_launcher(
            "--hostfile",
            self.hostfile,
            "--max-restarts=1",
            WORKER,
            ".",
            "--fail-rank",
            "3",
            "--fail-rounds",
            "1",
            "--allreduce",
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(len(worker_starts(self.out, attempt=0)), 6)  # rank 3 failed
        self.assert_host_world(worker_starts(self.out, attempt=1))

    def mpirun_argv(self, hosts, worker_args=("--allreduce",), master="node1"):
        """mpirun (over the test's ssh) of one dlrun per host, `hosts` its placement flags,
        `master` the store's host (MASTER_ADDR)."""
        self.assertTrue(
            shutil.which("mpirun"),
            "mpirun is missing: the test needs Debian's openmpi-bin (scripts/setup.sh)",
        )
        agent = os.path.join(self.out, "rsh_agent.sh")
        with open(agent, "w") as f:
            f.write("#!/bin/sh\nexec " + self.hosts.ssh_command() + f' -p {SSH_PORT} "$@"\n')
        os.chmod(agent, 0o755)
        argv = [
            "mpirun",
            "--allow-run-as-root",
            "-np",
            "3",
            *hosts,
            "--mca",
            "plm_rsh_agent",
            agent,
            "-x",
            f"MASTER_ADDR={master}",
            "-x",
            "PATH",
            "-x",
            "PYTHON_EXEC",
            "--wdir",
            self.out,
            binary_from_env("DLRUN", "dlrun"),
            "--nproc-per-node=2",
            WORKER,
            ".",
            *worker_args,
        ]
        return argv

    def run_mpirun(self, hosts, **env):
        """mpirun_argv(hosts) to its end, `env` more of mpirun's environment."""
        return self.hosts.run(
            0,
            self.mpirun_argv(hosts),
            timeout=RUN_TIMEOUT_S,
            env={**self.env(), **env},
            cwd=self.out,
        )

    def test_mpirun_world_matches_the_hostfiles(self):
        result = self.run_mpirun(["-H", "node1:1,node2:1,node3:1"])
        self.assertEqual(result.returncode, 0, result)
        self.assert_host_world(worker_starts(self.out))
        self.assertTrue(
            all(r["env"]["TORCHELASTIC_RUN_ID"].startswith("mpi-") for r in worker_starts(self.out))
        )
        self.assert_nothing_left()

    def test_mpirun_with_an_mpi_operator_hostfile_maps_one_dlrun_a_host(self):
        # The MPI operator's launcher: /etc/mpi/hostfile of `HOST slots=N` lines, named by the
        # variables it sets (docs/guides/kubernetes.md), and one dlrun a host.
        hostfile = os.path.join(self.out, "mpi_hostfile")
        with open(hostfile, "w") as f:
            f.write("".join(f"{host} slots=2\n" for host in HOSTS))
        # Open MPI 4 (Debian 12) reads ORTE's names; Open MPI 5 (Debian 13) PRRTE's, which an
        # operator's launcher image of Open MPI 5 sets (docs/guides/kubernetes.md).
        operator = {
            "OMPI_MCA_orte_default_hostfile": hostfile,
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "PRTE_MCA_prte_default_hostfile": hostfile,
            "PRTE_MCA_prte_keep_fqdn_hostnames": "1",
        }
        # The first worker's service name, which resolves only once the test publishes it.
        master = "job-worker-0.job.default.svc"
        log_path = os.path.join(self.out, "mpirun.log")

        def start(worker_args):
            with open(log_path, "w") as log:
                return self.hosts.popen(
                    0,
                    self.mpirun_argv(["--map-by", "ppr:1:node"], worker_args, master),
                    env={**self.env(), **operator},
                    cwd=self.out,
                    stdout=log,
                    stderr=log,
                )

        mpirun = start(["--allreduce"])
        waiting = f"waiting for --rdzv-endpoint host '{master}' to resolve"
        wait_until(
            lambda: read(log_path).count(waiting) == 3,
            RUN_TIMEOUT_S,
            "every dlrun to wait for the master's name",
            on_timeout=lambda: read(log_path),
        )
        for i in range(4):
            with open(f"/etc/netns/{self.hosts.namespace(i)}/hosts", "a") as f:
                f.write(f"{self.hosts.address(1)} {master}\n")
        self.assertEqual(mpirun.wait(RUN_TIMEOUT_S), 0, read(log_path))
        self.assert_host_world(worker_starts(self.out))
        self.assert_nothing_left()
        # A worker pod deleted: its dlrun gets SIGTERM; the job stops on every host, mpirun
        # fails, and nothing is left behind.
        for path in glob.glob(os.path.join(self.out, "start_*")):
            os.remove(path)
        mpirun = start(["--until-file", os.path.join(self.out, "never")])
        wait_until(
            lambda: len(worker_starts(self.out)) == 6,
            RUN_TIMEOUT_S,
            "6 workers",
            on_timeout=lambda: read(log_path),
        )
        node2 = next(r for r in worker_starts(self.out) if r["host"] == "node2")
        os.kill(node2["ppid"], signal.SIGTERM)  # that worker's parent: node2's dlrun
        self.assertNotEqual(mpirun.wait(RUN_TIMEOUT_S), 0, read(log_path))
        self.assertIn("job stopped: SIGTERM on node node2", read(log_path))
        self.assert_nothing_left()

    def check_refused(self, text, expected):
        with open(self.hostfile, "w") as f:
            f.write(text)
        result = self.run_launcher("--hostfile", self.hostfile, WORKER, ".")
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(
            result.stderr.strip().splitlines()[-1], f"dlrun: error: {expected}", result
        )
        self.assertEqual(glob.glob(os.path.join(self.out, "start_*")), [], "a worker started")
        return result

    def test_bad_hostfiles(self):
        f = self.hostfile
        result = self.check_refused("node1\nnode9 slots=2\n", f"{f} line 2: unknown host 'node9'")
        self.assertEqual(result.stderr.count("\n"), 1, result)
        self.check_refused(
            "node1\nnode1 slots=2\n",
            f"{f} line 2: host 'node1' is listed twice (give it once, with slots=N)",
        )
        self.check_refused(
            "node1 slots=0\n", f"{f} line 1: slots '0' is not a whole number from 1 to 1000000"
        )
        self.check_refused("node1 cpus four\n", f"{f} line 1: 'cpus' is not slots=N")
        # head (host 0) runs no sshd: the others' agents are up and waiting when it fails.
        result = self.check_refused(
            "node1\nnode2\nhead\n",
            f"cannot reach head ({f} line 3): ssh exited with 255 before any worker started "
            "(see its line above)",
        )
        self.assertIn("head: ssh: connect to host head", result.stderr)
        self.assert_nothing_left()


if __name__ == "__main__":
    main()
