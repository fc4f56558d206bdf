"""The host part of bench/checkpoint_bench.sh: dlrun.checkpoint's copy on a peer node, and a
lost host's ranks restored from it. Needs root (simulated hosts: scripts/netns.sh through
tests/python/netns_fixture.py).

Usage: checkpoint_hosts.py DLRUN DLRUND PYTHON MEGABYTES STEPS OUT_DIR

Host 0 runs a dlrund (the c10d rendezvous), hosts 1 and 2 an agent each with 2 workers
(bench/checkpoint_worker.py ... lose:2), host 3 a spare agent. Every rank saves STEPS steps of
MEGABYTES; after each, it waits until the other node's agent holds its copy. After the last,
the host of rank 2 is killed whole: the spare takes its place, and every rank of the restarted
job times load() (from its node's memory, or fetched from the agent that holds its copy)
against torch.load of its own file. Prints one line: the save, the peer copy's completion after
the save returned, the restores, and the steps lost. Exit status 0; 1 the run failed.
"""

import glob
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env  # noqa: E402
from netns_fixture import Hosts  # noqa: E402

WORLD = 4
LOST_RANK = 2
PORT = 29400
TIMEOUT_S = 600  # the run, start to the restored job's end (1 GB states on 2 cores)


def wait_for(condition, what, procs):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"checkpoint_hosts.py: gave up waiting for {what}")
        time.sleep(0.05)


def run(dlrun, dlrund, python, megabytes, steps, out):
    env = clean_env(TMPDIR=out, GLOO_SOCKET_IFNAME="eth0")
    env.pop("PYTHONPATH", None)
    with Hosts(4) as hosts:
        log = open(os.path.join(out, "dlrund.log"), "w")
        daemon = hosts.popen(
            0, [dlrund, "--host", "0.0.0.0", "--port", str(PORT)], env=env, stdout=log, stderr=log
        )
        wait_for(
            lambda: "listening on" in open(os.path.join(out, "dlrund.log")).read(),
            "dlrund",
            [daemon],
        )
        agents = []
        for host in (1, 2, 3):
            log = open(os.path.join(out, f"dlrun{host}.log"), "w")
            agents.append(
                hosts.popen(
                    host,
                    [
                        dlrun,
                        "--nnodes=2",
                        "--nproc-per-node=2",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={hosts.address(0)}:{PORT}",
                        "--rdzv-id=bench",
                        "--max-restarts=1",
                        python,
                        os.path.join(HERE, "checkpoint_worker.py"),
                        out,
                        str(megabytes),
                        str(steps),
                        f"lose:{LOST_RANK}",
                    ],
                    env=env,
                    stdout=log,
                    stderr=log,
                )
            )
        wait_for(lambda: os.path.exists(os.path.join(out, "lose_host")), "the last step", agents)
        pid = json.load(open(os.path.join(out, f"pid_{LOST_RANK}")))
        lost = next(h for h in (1, 2, 3) if pid in hosts.pids(h))
        hosts.kill_host(lost)
        wait_for(
            lambda: len(glob.glob(os.path.join(out, "restored_*.json"))) == WORLD,
            "the restored job",
            [a for h, a in zip((1, 2, 3), agents) if h != lost],
        )
        codes = [a.wait(TIMEOUT_S) for h, a in zip((1, 2, 3), agents) if h != lost]
        if codes != [0, 0]:
            raise RuntimeError(f"checkpoint_hosts.py: the agents left exited {codes}")


def report(out, megabytes, steps):
    runs = [json.load(open(os.path.join(out, f"rank_{r}.json"))) for r in range(WORLD)]
    restored = [json.load(open(os.path.join(out, f"restored_{r}.json"))) for r in range(WORLD)]

    def median(name, first=2):
        return statistics.median(x for run in runs for x in run[name][first:])

    def restore(local):
        mine = [r for r in restored if r["local"] == local]
        if not mine:
            return "none"
        took = statistics.median(r["restore"] for r in mine)
        anchor = statistics.median(r["torch_load"] for r in mine)
        return f"{took:.3f} s, torch.load {anchor:.3f} s: {took / anchor:.2f}x ({len(mine)} ranks)"

    lost = max(steps - 1 - (r["step"] if r["step"] is not None else -1) for r in restored)
    print(
        f"{megabytes} MB a rank, 2 hosts: save blocks {median('save'):.3f} s; peer copy complete "
        f"{median('peer'):.3f} s after; host lost: restore from the peer {restore(False)}; "
        f"from the node's memory {restore(True)}; steps lost {lost}"
    )
    return 0 if lost == 0 else 1


def main():
    dlrun, dlrund, python, megabytes, steps, out = sys.argv[1:7]
    run(dlrun, dlrund, python, megabytes, int(steps), out)
    return report(out, megabytes, int(steps))


if __name__ == "__main__":
    sys.exit(main())
