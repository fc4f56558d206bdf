"""A worker that reports the signals it gets, for the signal-forwarding tests.

Usage: signal_worker.py OUT_DIR MODE [RANK]
It installs its handlers, then writes its pid to OUT_DIR/pid_<RANK> (so a test that sees the
file knows the handlers are in place) and waits to be signalled (exit 4 if nothing comes).
  trap          on SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2 writes
                OUT_DIR/got_<SIGNAME>_<RANK> and exits 0
  ignore-term R like trap, except that rank R ignores SIGTERM
  plain         no handlers at all
"""

import os
import signal
import sys

from worker_util import rank, wait_to_be_stopped, write_atomic

TRAPPED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    my_rank = rank()

    def on_signal(sig, _frame):
        write_atomic(os.path.join(out_dir, f"got_{signal.Signals(sig).name}_{my_rank}"), "")
        os._exit(0)

    if mode in ("trap", "ignore-term"):
        for sig in TRAPPED:
            signal.signal(sig, on_signal)
    if mode == "ignore-term" and my_rank == int(sys.argv[3]):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_atomic(os.path.join(out_dir, f"pid_{my_rank}"), str(os.getpid()))
    wait_to_be_stopped()


if __name__ == "__main__":
    sys.exit(main())
