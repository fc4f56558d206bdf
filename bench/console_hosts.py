"""The figure of issue 58 (bench/console_bench.sh --hosts): 4 simulated hosts x 256 ranks (network
namespaces, scripts/netns.sh; needs root), each rank printing the same 3 lines at once and rank
700 a line of its own; how often each line reaches each node's console (--console-dedup on, by
default from 8 workers) and `dlrun logs --grouped`, the job-wide view.

Usage: console_hosts.py DLRUN NETNS_SH HOSTS RANKS_A_HOST OUT_DIR [WINDOW]
WINDOW: --console-dedup-window (default: dlrun's).
The ranks are shell workers that wait on a FIFO until all have started, so they print together,
as the ranks of a job do after a collective. Prints one line per node and one for the view.
Exit status 0: each shared line once in the view and rank 700's line once on its node's console
and once in the view, and (when WINDOW is given, to cover the time the ranks take to print) each
shared line at most once a node; 1 otherwise or a run failed.
"""

import glob
import os
import subprocess
import sys
import time

SHARED = ("loading data", "epoch 1 done", "saving checkpoint")
OWN = "rank 700 saw a NaN"
PORT = 29400
TIMEOUT_S = 300

WORKER = f"""
touch "$W/started-$RANK"
cat "$W/go" >/dev/null
echo "{SHARED[0]}"; echo "{SHARED[1]}"; echo "{SHARED[2]}"
if [ "$RANK" = 700 ]; then echo "{OWN}"; fi
hostname > "$W/printed-$RANK"
cat "$W/end" >/dev/null
"""


def wait_for(what, predicate, agents):
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if any(a.poll() is not None for a in agents):
            raise RuntimeError(f"console_hosts.py: an agent exited before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"console_hosts.py: timed out waiting for {what}")
        time.sleep(0.1)  # polling files the workers write, not synchronisation


def release(fifo, done):
    """Opens the FIFO for writing and closes it again, which lets every worker waiting to read it
    through (it reads an end of file), until `done` says all went by: a worker that reaches it
    after one release is let through by the next."""
    while not done():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody waits on it now
            pass
        time.sleep(0.05)


def main():
    dlrun, netns, hosts, per_host, out = sys.argv[1:6]
    window = [f"--console-dedup-window={sys.argv[6]}"] if len(sys.argv) > 6 else []
    hosts, per_host = int(hosts), int(per_host)
    prefix = f"cb{os.getpid() % 100000}"
    work = os.path.join(out, "w")
    os.makedirs(work)
    for name in ("go", "end"):
        os.mkfifo(os.path.join(work, name))
    subprocess.run(["bash", netns, "up", prefix, str(hosts)], check=True)
    agents, logs = [], []
    try:
        for i in range(hosts):
            log = open(os.path.join(out, f"agent{i}.log"), "w")
            logs.append(log)
            agents.append(
                subprocess.Popen(
                    [
                        "bash",
                        netns,
                        "exec",
                        prefix,
                        str(i),
                        dlrun,
                        f"--nnodes={hosts}",
                        f"--nproc-per-node={per_host}",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=10.77.0.10:{PORT}",
                        "--rdzv-id=console",
                        "--tee=1",
                        f"--log-dir={out}/logs{i}",
                        "--no-network-probe",
                        *window,
                        "/bin/sh",
                        "-c",
                        WORKER,
                    ],
                    env=dict(os.environ, W=work, TMPDIR=out),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        total = hosts * per_host

        def all_marked(kind):
            return lambda: len(glob.glob(os.path.join(work, f"{kind}-*"))) == total

        wait_for("every rank started", all_marked("started"), agents)
        release(os.path.join(work, "go"), all_marked("printed"))
        view = subprocess.run(
            [
                "bash",
                netns,
                "exec",
                prefix,
                "0",
                dlrun,
                "logs",
                "--grouped",
                f"--rdzv-endpoint=10.77.0.10:{PORT}",
                "--rdzv-id=console",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        release(os.path.join(work, "end"), lambda: all(a.poll() is not None for a in agents))
        for a in agents:
            a.wait(TIMEOUT_S)
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        for log in logs:
            log.close()
        subprocess.run(["bash", netns, "down", prefix], check=False)
    if view.returncode != 0:
        raise RuntimeError(f"console_hosts.py: dlrun logs --grouped: {view.stderr}")
    ok = True
    for i in range(hosts):
        with open(os.path.join(out, f"agent{i}.log"), errors="replace") as f:
            console = f.read().splitlines()
        counts = [
            sum(1 for line in console if line.endswith("]:" + text)) for text in (*SHARED, OWN)
        ]
        times, own_here = [], False
        for rank in range(hosts * per_host):
            path = os.path.join(work, f"printed-{rank}")
            with open(path) as f:
                if f.read().strip() != f"node{i}":
                    continue
            times.append(os.stat(path).st_mtime)
            own_here = own_here or rank == 700
        print(
            f"node{i}, {per_host} ranks printing over {max(times) - min(times):.2f} s:"
            f" each shared line on its console "
            f"{'/'.join(map(str, counts[:3]))} time(s)"
            + (f", rank 700's own line {counts[3]} time(s)" if own_here else ""),
            flush=True,
        )
        ok = ok and (not window or max(counts[:3]) == 1) and counts[3] == (1 if own_here else 0)
    lines = view.stdout.splitlines()
    counts = [sum(1 for line in lines if line.endswith(": " + text)) for text in (*SHARED, OWN)]
    everyone = f"[0-{hosts * per_host - 1}]"
    whole = [
        sum(1 for line in lines if line.startswith(everyone) and line.endswith(text))
        for text in SHARED
    ]
    print(
        f"dlrun logs --grouped: {len(lines)} lines for {hosts * per_host} ranks; each shared "
        f"line {'/'.join(map(str, counts[:3]))} time(s) (with every rank: "
        f"{'/'.join(map(str, whole))}), rank 700's {counts[3]}",
        flush=True,
    )
    ok = ok and counts == [1, 1, 1, 1] and whole == [1, 1, 1] and len(lines) == 4
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        print(e, file=sys.stderr)
        sys.exit(1)
