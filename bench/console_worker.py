"""One rank of bench/console_bench.py: prints RATE lines a second for SECONDS, paced in batches
every 10 ms, each line either the same on every rank ("same") or its own ("distinct"); then
writes OUT/done_<rank> with the lines it printed.

Usage: console_worker.py OUT RATE SECONDS same|distinct
"""

import os
import sys
import time


def main():
    out, rate, seconds, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    rank = os.environ["RANK"]
    batch = max(rate // 100, 1)
    start = time.monotonic()
    printed = 0
    write = sys.stdout.write
    while time.monotonic() - start < seconds:
        for _ in range(batch):
            printed += 1
            tag = "" if kind == "same" else f" from rank {rank}"
            write(f"step {printed // 50} loss 0.{printed % 50:02d}{tag}\n")
        sys.stdout.flush()
        next_batch = start + printed / rate
        pause = next_batch - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the load, not synchronisation
    with open(os.path.join(out, f"done_{rank}"), "w") as f:
        f.write(str(printed))


if __name__ == "__main__":
    main()
