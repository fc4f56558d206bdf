"""A worker that fails in a chosen way on a chosen rank; the other ranks wait to be stopped.

Usage: fail_worker.py OUT_DIR MODE FAILING_RANK [ARG]
Every rank first writes OUT_DIR/attempt_<TORCHELASTIC_RESTART_COUNT>_rank_<RANK>.json with its
pid and launch variables. Then FAILING_RANK, on the attempts MODE picks, ends badly once every rank
has written its file (or after 15 s); on the other attempts it exits 0. The other ranks wait to
be stopped on a failing attempt, and exit 0 on the others.
  fail-first CODE    fails with exit CODE on attempt 0 only
  exit CODE          fails with exit CODE on every attempt
  signal NAME        kills itself with signal NAME (core dumps off) on every attempt
  error-file TEXT    writes TEXT to TORCHELASTIC_ERROR_FILE in torch's @record format, exits 1
  error-dir CODE     leaves a directory where its error file goes, exits CODE
  record TEXT        raises RuntimeError(TEXT) inside torch's own @record, which writes the file
  grandchild         starts a child process (its pid in OUT_DIR/grandchild_<own pid>), then
                     exits 1
Before failing it writes "last words of rank R" and "failing now" to stderr.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import time

from worker_util import rank, wait_to_be_stopped, write_atomic, write_json

VARS = (
    "RANK",
    "LOCAL_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "MASTER_PORT",
)


def last_words(my_rank):
    print(f"last words of rank {my_rank}", file=sys.stderr)
    print("failing now", file=sys.stderr, flush=True)


def fail(mode, arg, my_rank, out_dir):
    last_words(my_rank)
    if mode in ("fail-first", "exit"):
        sys.exit(int(arg))
    if mode == "signal":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), getattr(signal, arg))
        time.sleep(10)  # a blocked or ignored signal: the test sees the wrong exit code
        sys.exit(5)
    if mode == "error-file":
        data = {
            "message": {
                "message": arg,
                "extraInfo": {
                    "py_callstack": "Traceback (most recent call last):\n"
                    '  File "fail_worker.py", line 1',
                    "timestamp": str(int(time.time())),
                },
            }
        }
        write_atomic(os.environ["TORCHELASTIC_ERROR_FILE"], json.dumps(data))
        sys.exit(1)
    if mode == "error-dir":
        os.mkdir(os.environ["TORCHELASTIC_ERROR_FILE"])
        sys.exit(int(arg))
    if mode == "record":
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            raise RuntimeError(arg)

        main()
    if mode == "grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        write_atomic(os.path.join(out_dir, f"grandchild_{os.getpid()}"), str(child.pid))
        sys.exit(1)
    raise SystemExit(f"unknown mode {mode}")


def main():
    out_dir, mode, failing_rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    arg = sys.argv[4] if len(sys.argv) > 4 else ""
    my_rank = rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    write_json(
        os.path.join(out_dir, f"attempt_{attempt}_rank_{my_rank}.json"),
        {"pid": os.getpid(), **{k: os.environ.get(k) for k in VARS}},
    )
    failing_attempt = attempt == 0 if mode == "fail-first" else True
    if not failing_attempt:
        return 0
    if my_rank == failing_rank:
        # Fail only once every rank runs: the others are then certainly there to be stopped.
        world = int(os.environ["WORLD_SIZE"])
        others = [os.path.join(out_dir, f"attempt_{attempt}_rank_{r}.json") for r in range(world)]
        deadline = time.monotonic() + 15
        while not all(os.path.exists(p) for p in others) and time.monotonic() < deadline:
            time.sleep(0.01)
        fail(mode, arg, my_rank, out_dir)
    wait_to_be_stopped()


if __name__ == "__main__":
    sys.exit(main())
