"""A worker that uses torch's file-based timer as a script would under torchrun.

Usage: timer_worker.py OUT_DIR MODE [SLOW_RANK]
Each rank writes OUT_DIR/rank_<RANK>.json: its pid, TORCHELASTIC_TIMER_FILE (or null) and
whether that path is a FIFO; then:
  env       nothing more (torch is not imported)
  overrun   rank SLOW_RANK writes OUT_DIR/entering_<RANK>, then overruns
            `with expires(after=1, scope="slow_block")` by far (writes OUT_DIR/survived_<RANK>
            and exits 5 if nobody stops it); the other ranks run a short block and exit 0
  in-time   every rank releases a timer in time and outlives its deadline, then exits 0
"""

import os
import stat
import sys
import time

from worker_util import rank, write_atomic, write_json

OVERRUN_S = 60  # far beyond the timer's 1 s
RELEASED_AFTER_S = 0.3
OUTLIVE_S = 0.6  # past the released timer's deadline by several of the agent's checks


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    my_rank = rank()
    timer_file = os.environ.get("TORCHELASTIC_TIMER_FILE")
    is_fifo = timer_file is not None and stat.S_ISFIFO(os.stat(timer_file).st_mode)
    write_json(
        os.path.join(out_dir, f"rank_{my_rank}.json"),
        {"pid": os.getpid(), "timer_file": timer_file, "is_fifo": is_fifo},
    )
    if mode == "env":
        return 0

    from torch.distributed.elastic.timer import FileTimerClient, configure, expires

    configure(FileTimerClient(timer_file))
    if mode == "overrun" and my_rank == int(sys.argv[3]):
        write_atomic(os.path.join(out_dir, f"entering_{my_rank}"), "")
        with expires(after=1, scope="slow_block"):
            time.sleep(OVERRUN_S)
        write_atomic(os.path.join(out_dir, f"survived_{my_rank}"), "")
        return 5
    if mode == "overrun":
        with expires(after=30, scope="quick_block"):
            pass
        return 0
    with expires(after=RELEASED_AFTER_S, scope="released_block"):
        pass
    time.sleep(OUTLIVE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
