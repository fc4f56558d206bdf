"""exit_recorder.py OUT COMMAND...: runs COMMAND as a child, writes how it ended to
OUT/exit_<RANK>.json ({"rank", "pid", "returncode"}, negative for a signal, as subprocess gives
it) and exits as it did.

For tests that must see the exit status of a worker that dlrun stops (a service at the job's
end), which only its parent learns. dlrun signals the worker's whole process group, so this
wrapper ignores the stop signals (once the child runs, which sets its own) and waits for it.
"""

import ctypes
import os
import signal
import subprocess
import sys

from worker_util import rank, write_json

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def die_with_wrapper():
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main():
    out, command = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen(command, preexec_fn=die_with_wrapper)
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    returncode = child.wait()
    write_json(
        os.path.join(out, f"exit_{rank()}.json"),
        {"rank": rank(), "pid": child.pid, "returncode": returncode},
    )
    sys.exit(returncode if returncode >= 0 else 128 - returncode)


if __name__ == "__main__":
    main()
