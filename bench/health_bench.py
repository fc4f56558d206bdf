"""The measures of bench/health_bench.sh (issue 57): what the checks before a round cost, and
whether they find what they are for. Needs root (simulated hosts: scripts/netns.sh through
tests/python/netns_fixture.py).

Usage: health_bench.py DLRUN DLRUND PYTHON TRIALS AGENTS OUT_DIR
TRIALS: the trials of each finding (20); AGENTS: the agent counts on one machine (4,16,64).

1. 4 simulated hosts and a spare (host 0 runs a dlrund): a job of 4 nodes of one worker that
   exits at once, launched TRIALS/4 times bare (--no-network-probe) and as often with every
   check (--health-check=true, --health-min-free, the network probe): the medians, and the
   checks' cost as their difference.
2. The same job, the sending of one host (in turn) slowed to 100 Mbit/s: whether the probe
   names its link as the slowest, TRIALS times.
3. The same job, one host (in turn) failing its --health-check: whether the round forms without
   it and the job ends within the bare job's median plus 1 s, TRIALS times.
4. On one machine (loopback), AGENTS agents of one worker each: bare against every check.
5. A worker failing at the same step every attempt under --crash-loop-attempts=3: the exit
   status, the attempts, and the line that says why.
Prints a line per measure. Exit status 0; 1 a run failed.
"""

import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env, free_port  # noqa: E402
from netns_fixture import Hosts  # noqa: E402

PORT = 29400
NODES = 4
TIMEOUT_S = 300
CHECKS = ["--health-check=true", "--health-min-free=0.01"]
BARE = ["--no-network-probe"]


def wait_for_line(path, text, proc):
    deadline = time.monotonic() + 30
    while text not in Path(path).read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"health_bench.py: no '{text}' in {path}")
        time.sleep(0.05)


class Bench:
    def __init__(self, dlrun, dlrund, python, out):
        self.dlrun, self.dlrund, self.python, self.out = dlrun, dlrund, python, out
        self.env = clean_env(TMPDIR=out)
        self.runs = 0

    def job(self, flags, rdzv, nnodes, workdir):
        """The agent's argv: one worker that records its host and exits 0."""
        return [
            self.dlrun,
            f"--nnodes={nnodes}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv}",
            f"--rdzv-id=bench{self.runs}",
            "--rdzv-conf=last_call_timeout=1",
            *flags,
            "--no-python",
            "/bin/sh",
            "-c",
            f"hostname >> {workdir}/ran-$(hostname)",
        ]

    def run(self, start, agents, must_finish):
        """Starts an agent per entry of `agents` (start(entry, log) -> Popen); returns the
        seconds until those of `must_finish` ended 0 (the others are stopped by PID) and the
        agents' output together."""
        self.runs += 1
        logs = [os.path.join(self.out, f"run{self.runs}-{i}.log") for i in range(len(agents))]
        began = time.monotonic()
        procs = [start(entry, open(log, "w")) for entry, log in zip(agents, logs)]
        try:
            codes = [procs[i].wait(TIMEOUT_S) for i in must_finish]
            took = time.monotonic() - began
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        output = "".join(Path(log).read_text() for log in logs)
        if codes != [0] * len(codes):
            raise RuntimeError(f"health_bench.py: a job failed ({codes}):\n{output[-3000:]}")
        return took, output


def hosts_part(bench, trials):
    """Measures 1 to 3 on 4 simulated hosts, a spare and the rendezvous's host; whether each
    met its goal."""
    with Hosts(NODES + 2) as hosts:
        log = os.path.join(bench.out, "dlrund.log")
        daemon = hosts.popen(
            0,
            [bench.dlrund, "--host", "0.0.0.0", "--port", str(PORT)],
            env=bench.env,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )
        wait_for_line(log, "listening on", daemon)
        rdzv = f"{hosts.address(0)}:{PORT}"

        def launch(flags, workdir):
            def start(host, log):
                return hosts.popen(
                    host,
                    bench.job(flags, rdzv, NODES, workdir),
                    env=bench.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

            return start

        cost = {}
        for name, flags in (("bare", BARE), ("checks", CHECKS)):
            times = []
            for _ in range(max(trials // 4, 3)):
                work = tempfile.mkdtemp(dir=bench.out)
                # the spare ends with the job, as the members do
                took, _ = bench.run(launch(flags, work), [1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
                times.append(took)
            cost[name] = statistics.median(times)
        print(
            f"4 simulated hosts and a spare, a job of 4 nodes start to end: bare "
            f"{cost['bare']:.2f} s, with every check and the network probe "
            f"{cost['checks']:.2f} s: the checks add {cost['checks'] - cost['bare']:.2f} s "
            f"(goal: under 1 s)",
            flush=True,
        )

        named = 0
        for trial in range(trials):
            slowed = 1 + trial % NODES
            hosts.slow(slowed, "100mbit")
            try:
                work = tempfile.mkdtemp(dir=bench.out)
                _, output = bench.run(launch([], work), [1, 2, 3, 4], [0, 1, 2, 3])
            finally:
                hosts.slow(slowed, "off")
            found = re.findall(r"network probe: slowest link (\S+) ", output)
            named += found == [hosts.hostname(slowed)]
        print(
            f"a host's sending slowed to 100 Mbit/s: named as the slowest link's in {named} "
            f"of {trials} trials",
            flush=True,
        )

        formed, slowest = 0, 0.0
        for trial in range(trials):
            unfit = 1 + trial % NODES
            work = tempfile.mkdtemp(dir=bench.out)
            check = [f"--health-check=test $(hostname) != {hosts.hostname(unfit)}"]
            members = [h for h in range(1, NODES + 2) if h != unfit]
            took, _ = bench.run(
                launch(check, work),
                list(range(1, NODES + 2)),
                [i for i, h in enumerate(range(1, NODES + 2)) if h != unfit],
            )
            ran = {os.path.basename(p)[4:] for p in glob.glob(os.path.join(work, "ran-*"))}
            ok = ran == {hosts.hostname(h) for h in members} and took <= cost["bare"] + 1
            formed += ok
            slowest = max(slowest, took)
        print(
            f"a host failing its check: the round formed without it, the job done within "
            f"the bare job's time plus 1 s, in {formed} of {trials} trials (the slowest "
            f"{slowest:.2f} s against {cost['bare']:.2f} s)",
            flush=True,
        )
    return cost["checks"] - cost["bare"] < 1 and named == trials and formed == trials


def loopback_part(bench, counts):
    """Measure 4: N agents on this machine, one worker each."""
    for n in counts:
        line = []
        for name, flags in (("bare", BARE), ("checks", CHECKS)):
            times = []
            for _ in range(3):
                daemon_log = os.path.join(bench.out, f"dlrund-{n}-{name}.log")
                port = free_port()
                daemon = subprocess.Popen(
                    [bench.dlrund, "--host", "127.0.0.1", "--port", str(port)],
                    env=bench.env,
                    stdout=open(daemon_log, "w"),
                    stderr=subprocess.STDOUT,
                )
                try:
                    wait_for_line(daemon_log, "listening on", daemon)
                    work = tempfile.mkdtemp(dir=bench.out)

                    def start(_, log):
                        return subprocess.Popen(
                            bench.job(flags, f"127.0.0.1:{port}", n, work),
                            env=bench.env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )

                    took, _ = bench.run(start, list(range(n)), list(range(n)))
                    times.append(took)
                finally:
                    daemon.kill()
                    daemon.wait()
            line.append(statistics.median(times))
        print(
            f"{n} agents on one machine: bare {line[0]:.2f} s, with every check "
            f"{line[1]:.2f} s: {line[1] - line[0]:+.2f} s",
            flush=True,
        )


def crash_loop_part(bench):
    """Measure 5."""
    work = tempfile.mkdtemp(dir=bench.out)
    worker = os.path.join(HERE, "..", "tests", "python", "workers", "crash_worker.py")
    began = time.monotonic()
    done = subprocess.run(
        [
            bench.dlrun,
            "--standalone",
            "--max-restarts=10",
            "--crash-loop-attempts=3",
            bench.python,
            worker,
            work,
            "5",
        ],
        env=bench.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    took = time.monotonic() - began
    attempts = len(glob.glob(os.path.join(work, "attempt_*")))
    why = [line for line in done.stderr.splitlines() if "--crash-loop-attempts" in line]
    print(
        f"a worker failing at step 5 every attempt, --crash-loop-attempts=3 "
        f"--max-restarts=10: exit status {done.returncode} after {attempts} attempts in "
        f"{took:.1f} s; {why[-1] if why else 'no line names the crash loop'}",
        flush=True,
    )
    return done.returncode == 93 and len(why) == 1


def main():
    dlrun, dlrund, python, trials, counts, out = sys.argv[1:7]
    bench = Bench(dlrun, dlrund, python, out)
    met = hosts_part(bench, int(trials))
    loopback_part(bench, [int(n) for n in counts.split(",")])
    met = crash_loop_part(bench) and met
    return 0 if met else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
