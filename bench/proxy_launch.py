"""Real agents, real workers, the proxy on (issue 32, acceptance 4), for proxy_launch.sh.

K agents on loopback (default 4) of N workers each (default 4,000) meet through one dlrund:
    dlrun --nnodes=K --nproc-per-node=N --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=ID
          --store-proxy=on --no-control-plane dlrun-barrier-probe
Every worker is dlrun-barrier-probe (bench/barrier_probe.cpp): one store barrier through
MASTER_ADDR, as torch's init_process_group does, then exit 0. Printed: the wall time from the
agents' start to the last agent's exit, every agent's exit code, and dlrund's own counts at exit
(--stats): how many connections it accepted (the agents' and their proxies', against one per
worker without the proxy) and the requests it served. --proxy=off runs the same without the
proxy, for the comparison (at a size this machine's descriptor limit allows the store: about
19,000 connections). Every process is stopped by PID and dies with this script.
"""

import argparse
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
import uuid

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4000)
    parser.add_argument("--proxy", choices=("on", "off"), default="on")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()

    def binary(name):
        return os.path.join(args.build, "bin", name)

    dlrund = subprocess.Popen(
        [binary("dlrund"), "--host", "127.0.0.1", "--port", "0", "--stats", "--no-control"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        port = int(dlrund.stdout.readline().rsplit(":", 1)[1])
        command = [
            binary("dlrun"),
            f"--nnodes={args.agents}",
            f"--nproc-per-node={args.workers}",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={uuid.uuid4().hex}",
            f"--store-proxy={args.proxy}",
            "--no-control-plane",
            binary("dlrun-barrier-probe"),
        ]
        start = time.monotonic()
        agents = [
            subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent,
            )
            for _ in range(args.agents)
        ]
        deadline = start + args.timeout
        codes, errors = [], []
        for agent in agents:
            try:
                _, err = agent.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.kill()
                _, err = agent.communicate()
            codes.append(agent.returncode)
            errors.append(err)
        wall = time.monotonic() - start
    finally:
        dlrund.send_signal(signal.SIGTERM)
        out, _ = dlrund.communicate(timeout=60)
    stats = next((line for line in out.splitlines() if line.startswith("dlrund stats:")), "")
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stats)}
    ranks = args.agents * args.workers
    print(
        f"{args.agents} agents x {args.workers} workers = {ranks} ranks, proxy {args.proxy}: "
        f"{wall:.2f} s to the last agent's exit; exit codes {codes}"
    )
    print(
        f"dlrund accepted {counts.get('connections')} connections "
        f"({counts.get('connections', 0) / args.agents:.1f} per agent), served "
        f"{counts.get('requests')} requests: ADD={counts.get('ADD', 0)} "
        f"WAIT={counts.get('WAIT', 0)} GROUP_WAIT={counts.get('GROUP_WAIT', 0)}"
    )
    if any(codes):
        for code, err in zip(codes, errors):
            if code:
                print(f"--- an agent exited {code}:\n{err[-3000:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
