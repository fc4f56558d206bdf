"""Reports steps through dlrun.progress, then holds until the test has looked.

Usage: progress_worker.py OUT_DIR FINAL_STEP
Imports dlrun.progress (from the PYTHONPATH the agent, or the test, gives), forks a child that
calls step() before this worker opened the board, makes two bad calls (one warning, nothing
reported), reports steps 1..FINAL_STEP (loss 1/n, samples 8n, epoch n // 10, the accuracy and
named metrics of its local rank below), then forks a child that calls step() again. Each child
reports whether it was active and the worker whether its slot's bytes (read through a file
descriptor of its own) and its metrics file stayed the same across the second child. Writes
OUT_DIR/ready_<LOCAL_RANK>.json and waits for OUT_DIR/release (up to worker_util.MAX_WAIT_S).
"""

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.progress as progress  # noqa: E402
from worker_util import wait_for_release, write_json  # noqa: E402

# Local rank 0's first report names 10 valid metrics: the first 8 are kept. Local rank 1's
# names valid and invalid ones: only the valid ones are kept. Later reports change lr, which
# the once-a-second limit holds back.
FIRST_METRICS = {
    0: dict(lr=0.1, tokens_per_s=1000.0, **{f"m{i}": float(i) for i in range(8)}),
    1: {
        "lr": 0.1,
        "nan_value": math.nan,
        "inf_value": math.inf,
        "text": "x",
        "flag": True,
        "n" * 33: 1.0,
        "tokens_per_s": 1000.0,
    },
}
CHILD_ACTIVE_EXIT = 3


def accuracy(local_rank):
    return 0.5 + 0.125 * local_rank


def child_reports():
    """In a forked child: step() with new values; exits CHILD_ACTIVE_EXIT if reports were
    active, else 0."""
    try:
        progress.step(999, loss=9.0, accuracy=0.0, samples=1, epoch=99, lr=5.0)
        os._exit(CHILD_ACTIVE_EXIT if progress.active() else 0)
    finally:
        os._exit(1)


def fork_reporting_child():
    pid = os.fork()
    if pid == 0:
        child_reports()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def read_bytes(path, offset=0, size=None):
    """The file's bytes (`size` of them from `offset`, else all); None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, size if size is not None else os.fstat(fd).st_size, offset)
    finally:
        os.close(fd)


def main():
    out_dir, final = sys.argv[1], int(sys.argv[2])
    local_rank = int(os.environ["LOCAL_RANK"])
    board = os.environ["DLRUN_PROGRESS_FILE"]
    metrics_file = f"{board}.metrics.{local_rank}"

    record = {
        "pid": os.getpid(),
        "board": board,
        "metrics_file": metrics_file,
        "package": os.path.dirname(progress.__file__),
    }
    record["child_before_open_exit"] = fork_reporting_child()
    if local_rank == 0:
        progress.step(1.5)  # not an int: one warning, no report
        progress.step("x", loss=1.0)  # a second bad call: no second warning
    started = time.monotonic()
    for n in range(1, final + 1):
        metrics = FIRST_METRICS[local_rank] if n == 1 else {"lr": 0.2}
        progress.step(
            n,
            loss=1.0 / n,
            samples=8 * n,
            epoch=n // 10,
            accuracy=accuracy(local_rank) if n == final else None,
            **metrics,
        )
    record["steps_seconds"] = time.monotonic() - started
    record["active"] = progress.active()

    slot = (64 * local_rank, 64)
    before = read_bytes(board, *slot), read_bytes(metrics_file)
    record["child_after_open_exit"] = fork_reporting_child()
    record["slot_unchanged"] = read_bytes(board, *slot) == before[0]
    record["metrics_file_unchanged"] = read_bytes(metrics_file) == before[1]
    write_json(os.path.join(out_dir, f"ready_{local_rank}.json"), record)

    return wait_for_release(out_dir)


if __name__ == "__main__":
    sys.exit(main())
