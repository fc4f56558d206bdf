"""A real Slurm cluster on simulated hosts, for tests: scripts/slurm_local_up.sh and
scripts/slurm_local_down.sh driven from Python.

    with SlurmCluster(3) as cluster:          # slurmctld on host 0, slurmd "nodeK" on host K
        job = cluster.submit(SCRIPT, env=job_env, cwd=out_dir)
        cluster.wait_for_job(job, lambda info: info["JobState"] == "RUNNING", 30, "its start")
        info = cluster.wait_for_end(job, 60)  # scontrol's fields: info["JobState"], ...
        cluster.kill_host(2)                  # node2 crashes: slurmd and its tasks die

SlurmCluster is a netns_fixture.Hosts of N+1 hosts, so it goes down on every way out a set of
hosts does (the with block, an exception, SIGTERM or SIGINT, interpreter exit): first
slurm_local_down.sh stops the daemons by the PIDs they recorded and removes the cluster's
directory, then every process left in the hosts is killed. The directory of a cluster whose
test process was SIGKILLed is removed by the next SlurmCluster (its set is reaped by Hosts).
Clients (sbatch, scontrol, scancel) run on host 0 with the cluster's SLURM_CONF.

And what a test of dlrun inside a Slurm job needs around it: the submission's environment (dlrun
first on PATH), the job's output and its workers' lines, a dlrun that records its exit code on
each node, a host's TCP sockets.
"""

import glob
import os
import re
import shutil
import subprocess
import time

from dlrun_fixture import binary_from_env, clean_env, is_running
from netns_fixture import PREFIX_RE, Hosts

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.normpath(os.path.join(HERE, "..", "..", "scripts"))
UP_TIMEOUT_S = 60  # slurm_local_up.sh waits up to 30 s for the nodes to be idle
DOWN_TIMEOUT_S = 60  # slurm_local_down.sh gives the daemons 10 s, then kills
CLIENT_TIMEOUT_S = 30  # one sbatch, scontrol or scancel (MessageTimeout is 10 s)
STATE_POLL_S = 0.2  # between two looks at a job (each look is three processes on host 0)
DIR_PREFIX = "/tmp/dlrun-slurm-"
# Job states after which nothing more happens to a job (squeue's long names).
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


def _script(name, *args, timeout):
    return subprocess.run(
        ["bash", os.path.join(SCRIPTS, name), *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def reap_stale_clusters():
    """Stops the clusters (and removes the directories) of test processes that are gone."""
    for directory in glob.glob(DIR_PREFIX + "t*"):
        prefix = directory[len(DIR_PREFIX) :]
        match = PREFIX_RE.match(prefix)
        if match and not is_running(int(match.group(1))):
            _script("slurm_local_down.sh", prefix, directory, timeout=DOWN_TIMEOUT_S)


class SlurmCluster(Hosts):
    """slurmctld on host 0 and `nodes` slurmd on hosts 1..nodes (Slurm nodes node1..nodeN)."""

    def __init__(self, nodes):
        self.stopping = False
        reap_stale_clusters()
        super().__init__(nodes + 1)
        self.nodes = nodes
        self.dir = DIR_PREFIX + self.prefix
        self.conf = os.path.join(self.dir, "slurm.conf")
        try:
            shutil.rmtree(self.dir, ignore_errors=True)  # left by an earlier process, our PID
            result = _script(
                "slurm_local_up.sh", self.prefix, nodes, self.dir, timeout=UP_TIMEOUT_S
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"slurm_local_up.sh failed with {result.returncode}:\n"
                    f"{result.stdout}{result.stderr}"
                )
        except BaseException:
            self.close()
            raise

    def client(self, argv, env=None, cwd=None):
        """Runs a Slurm client command on host 0; returns its CompletedProcess (text)."""
        return self.run(
            0, ["env", f"SLURM_CONF={self.conf}", *argv], CLIENT_TIMEOUT_S, env=env, cwd=cwd
        )

    def checked(self, argv, env=None, cwd=None):
        """client(), failing on a non-zero exit; returns its stdout."""
        result = self.client(argv, env=env, cwd=cwd)
        if result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} failed with {result.returncode}: {result.stderr.strip()}"
            )
        return result.stdout

    def submit(self, script, env, cwd, args=()):
        """sbatch [args] script from directory cwd with environment env; returns the job id."""
        return int(
            self.checked(["sbatch", "--parsable", *args, script], env=env, cwd=cwd).split(";")[0]
        )

    def job(self, job_id):
        """scontrol's view of a job: {"JobState": "RUNNING", "ExitCode": "0:0", ...}."""
        text = self.checked(["scontrol", "show", "job", "--oneliner", str(job_id)])
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def node_state(self, name):
        text = self.checked(["scontrol", "show", "node", "--oneliner", name])
        return dict(re.findall(r"(\w+)=(\S*)", text))["State"]

    def wait_for_job(self, job_id, condition, timeout, what, describe=None):
        """Polls the job until condition(fields) is true; returns its fields. Fails after
        timeout seconds, naming `what`, with describe()'s text."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if condition(info):
                return info
            if time.monotonic() >= deadline:
                detail = describe() if describe else ""
                raise AssertionError(
                    f"job {job_id} still {info.get('JobState')} after "
                    f"{timeout} s waiting for {what}\n{detail}"
                )
            time.sleep(STATE_POLL_S)

    def wait_for_end(self, job_id, timeout, describe=None):
        """Polls the job until it is in a final state; returns its fields. Fails after timeout
        seconds with describe()'s text."""
        return self.wait_for_job(
            job_id, lambda info: info.get("JobState") in FINAL_STATES, timeout, "its end", describe
        )

    def daemon_logs(self, lines=60):
        """The last `lines` lines of slurmctld's and each slurmd's log: why Slurm took a node
        or a job for failed, for a test's failure message."""
        text = ""
        for name in ["slurmctld"] + [f"slurmd-node{k}" for k in range(1, self.nodes + 1)]:
            try:
                with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError as e:
                tail = [f"({e})\n"]
            text += f"--- {name}.log\n{''.join(tail)}"
        return text

    def close(self):
        """Stops the daemons by PID and removes the directory, then takes the hosts down."""
        if not self.closed and hasattr(self, "dir") and not self.stopping:
            self.stopping = True  # a signal handler closing it again goes straight on
            try:
                _script("slurm_local_down.sh", self.prefix, self.dir, timeout=DOWN_TIMEOUT_S)
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)
        super().close()


def job_env(out, worker_command=None, **more):
    """The submission environment (sbatch exports it to the job): dlrun first on PATH."""
    dlrun = binary_from_env("DLRUN", "dlrun")
    return clean_env(
        PATH=f"{os.path.dirname(dlrun)}:{os.environ['PATH']}",
        TMPDIR=out,
        DLRUN_WORKER=worker_command,
        GLOO_SOCKET_IFNAME=None,
        **more,
    )


def output_of(out, name, job_id):
    """The job's output file (the examples write %x-%j.out in the submit directory)."""
    path = os.path.join(out, f"{name}-{job_id}.out")
    if not os.path.exists(path):
        return f"(no output file {path})"
    with open(path, errors="replace") as f:
        return f.read()


def worker_lines(output):
    """{rank: [lines]} from dlrun's "[rank]:" prefixed worker output."""
    lines = {}
    for match in re.finditer(r"^\[(\d+)\]:(.*)$", output, re.MULTILINE):
        lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


def write_executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def exit_recording_dlrun(bin_dir, out):
    """A `dlrun` in bin_dir, for the front of a job's PATH: it runs the real one and writes its
    exit code to out/exit_<node> (the file's time: when it exited). Signals go to the whole
    step, the real dlrun included; the wrapper passes on those that reach it."""
    return write_executable(
        os.path.join(bin_dir, "dlrun"),
        f"""#!/bin/bash
{os.path.abspath(binary_from_env("DLRUN", "dlrun"))} "$@" &
child=$!
trap 'kill -TERM $child' TERM
trap 'kill -INT $child' INT
while wait $child; code=$?; kill -0 $child 2>/dev/null; do :; done
echo $code > {out}/exit_$SLURMD_NODENAME
exit $code
""",
    )


def exit_codes(out):
    """{node: (dlrun's exit code there, when it exited)} from exit_recording_dlrun's files."""
    codes = {}
    for path in glob.glob(os.path.join(out, "exit_node*")):
        with open(path) as f:
            codes[os.path.basename(path)[len("exit_") :]] = (
                f.read().strip(),
                os.path.getmtime(path),
            )
    return codes


def sockets(cluster, host):
    """The TCP sockets on a host, as (state, local address, peer address, process) tuples."""
    result = cluster.run(host, ["ss", "-Htanp"], CLIENT_TIMEOUT_S)
    if result.returncode != 0:
        raise AssertionError(f"ss failed with {result.returncode}: {result.stderr}")
    return [
        (fields[0], fields[3], fields[4], " ".join(fields[5:]))
        for fields in map(str.split, result.stdout.splitlines())
    ]
