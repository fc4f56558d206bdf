"""What the test workers share: atomic file writes, bounded waits to be stopped or released,
and a rank's device for a backend."""

import functools
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


def faults(args, rank):
    """{STEP: KIND} of the arguments KIND:RANK:STEP that strike `rank`, in the job's first
    attempt only (the checkpoint tests' workers)."""
    if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
        return {}
    found = {}
    for arg in args:
        kind, who, step = arg.split(":")
        if int(who) == rank:
            found[int(step)] = kind
    return found


def rank():
    return int(os.environ["RANK"])


def wait_to_be_stopped():
    """Blocks until a signal ends the process; exits 4 if none comes within MAX_WAIT_S."""
    deadline = time.monotonic() + MAX_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(deadline - time.monotonic())
    os._exit(4)


def wait_for_release(out_dir, name="release"):
    """Waits for the file `name` in `out_dir` (the test's `release`, or another worker's): 0, or
    4 if it does not come within MAX_WAIT_S."""
    release = os.path.join(out_dir, name)
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


@functools.cache
def lacks_libuv():
    """Whether this torch was built without libuv (Debian 13's torch 2.6): it then refuses any
    TCPStore asked for libuv, which torch 2.4 and later ask for unless told otherwise. torch 1.x
    has no such choice."""
    import torch.distributed as dist

    try:
        dist.TCPStore("127.0.0.1", 0, None, True, use_libuv=True, wait_for_workers=False)
    except TypeError:
        return False
    except RuntimeError as e:
        return "libuv" in str(e)
    return False


def client_options():
    """What a TCPStore client of a dlrun store needs from this torch: use_libuv=False where
    torch lacks libuv (a client's work is the same either way), nothing elsewhere."""
    return {"use_libuv": False} if lacks_libuv() else {}


def serves_store():
    """Whether this worker's torch serves the job's store: rank 0 under
    TORCHELASTIC_USE_AGENT_STORE=False (dlrun on a torch without libuv). It stays until its
    peers are done with the store, as the agent's store would."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False" and rank() == 0


def launcher_store(timeout):
    """The store the launcher gives this worker, made as torch's env:// makes it: a client of
    the agent's store, or, under TORCHELASTIC_USE_AGENT_STORE=False (dlrun on a torch without
    libuv), one that rank 0 serves, with USE_LIBUV's choice where torch has one."""
    import torch.distributed as dist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    world = int(os.environ["WORLD_SIZE"])
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "False":  # rank 0 serves it
        options = {}
        if "USE_LIBUV" in os.environ:
            options["use_libuv"] = os.environ["USE_LIBUV"] == "1"
        return dist.TCPStore(host, port, world, rank() == 0, timeout, **options)
    # A client only; no wait_for_workers, whose count would be a key of its own.
    return dist.TCPStore(
        host, port, world, False, timeout, wait_for_workers=False, **client_options()
    )


def device_for(backend):
    """This rank's torch device: the CPU for gloo; for NCCL, a CUDA device a local rank. NCCL
    refuses two ranks of one host on one device: where ranks must share one, a host id of each
    rank's own makes them NCCL hosts of their own, which talk through sockets
    (NCCL_SOCKET_IFNAME)."""
    import torch

    if backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count < int(os.environ["LOCAL_WORLD_SIZE"]):
        os.environ["NCCL_HOSTID"] = f"dlrun-worker-rank-{os.environ['RANK']}"
    index = int(os.environ["LOCAL_RANK"]) % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
