"""The worker of rdzv_bench.py: records its start, then exits 0 or runs until told to stop.

Usage: rdzv_worker.py OUT_DIR [STOP_FILE]

First thing, it takes time.time(), then writes OUT_DIR/<rank>-<restart>-<pid>.json (a temporary
name, then renamed, so a file that exists is complete) holding that time, RANK, WORLD_SIZE,
GROUP_RANK, TORCHELASTIC_RESTART_COUNT, its PID, an id unique to this process, and BENCH_AGENT
(which agent of the benchmark started it, from the agent's environment). Without STOP_FILE it
then exits 0; with it, it waits until STOP_FILE exists (checking every 20 ms), then exits 0.
Imports nothing heavy, so its start-up costs the same under every launcher.
"""
import time

START = time.time()

import json  # noqa: E402  (after the clock is read)
import os  # noqa: E402
import sys  # noqa: E402

POLL_S = 0.02


def number(name):
    """An integer environment variable; None when the launcher did not set it (the benchmark
    then reports the wrong value)."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def main():
    out = sys.argv[1]
    record = {
        "time": START,
        "rank": number("RANK"),
        "world_size": number("WORLD_SIZE"),
        "group_rank": number("GROUP_RANK"),
        "restart_count": number("TORCHELASTIC_RESTART_COUNT"),
        "pid": os.getpid(),
        "uid": f"{os.getpid()}-{time.time_ns()}",
        "agent": os.environ.get("BENCH_AGENT"),
    }
    name = os.path.join(out, f"{record['rank']}-{record['restart_count']}-{record['pid']}.json")
    with open(name + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(name + ".tmp", name)
    if len(sys.argv) > 2:
        while not os.path.exists(sys.argv[2]):
            time.sleep(POLL_S)


if __name__ == "__main__":
    main()
