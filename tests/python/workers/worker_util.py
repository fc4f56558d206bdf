"""What the test workers share: atomic file writes and bounded waits to be stopped or
released."""
import json
import os
import sys
import time

# A worker that waits to be stopped gives up after this long, so a launcher that fails to stop
# it cannot leave it behind for ever (the tests fail long before).
MAX_WAIT_S = 60


def write_atomic(path, text):
    """Writes `text` to a temporary name and renames it: a file that exists is complete."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def write_json(path, data):
    write_atomic(path, json.dumps(data))


def rank():
    return int(os.environ["RANK"])


def wait_to_be_stopped():
    """Blocks until a signal ends the process; exits 4 if none comes within MAX_WAIT_S."""
    deadline = time.monotonic() + MAX_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(deadline - time.monotonic())
    os._exit(4)


def wait_for_release(out_dir):
    """Waits for the test's file `release` in `out_dir`: 0, or 4 if it does not come within
    MAX_WAIT_S."""
    release = os.path.join(out_dir, "release")
    deadline = time.monotonic() + MAX_WAIT_S
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            return 4
        time.sleep(0.01)
    return 0


def exit_past_torch_teardown(code):
    """Ends a worker that used a torch process group with `code`, skipping the interpreter's
    teardown: torch 2.13 aborts there now and then (`terminate called without an active
    exception`, no Python frame left; about one run in ten of a DDP worker, under torchrun as
    under dlrun), even after destroy_process_group(). What the worker has to say is written by
    then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
