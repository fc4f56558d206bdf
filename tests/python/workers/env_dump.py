"""Writes this worker's view of the launch to OUT_DIR/env_<RANK>.json.

Usage: env_dump.py OUT_DIR [--store]
Records the whole environment, the interpreter's argv, pid, process group and parent-death
signal, whether the port TF_CONFIG reserved for this rank can be bound, and with --store proves
the store at MASTER_ADDR:MASTER_PORT works: torch's TCPStore as env:// makes it (a client, or
rank 0's server under TORCHELASTIC_USE_AGENT_STORE=False) sets a key per rank and waits for every
rank's key, so all ranks demonstrably share one live store.
Exits 0 unless that fails.
"""

import ctypes
import json
import os
import socket
import sys

from worker_util import launcher_store, rank, write_json


def bind_own_endpoint(tf_config, my_rank):
    """Binds the host:port TF_CONFIG lists for this rank; returns None or the error."""
    try:
        endpoint = json.loads(tf_config)["cluster"]["worker"][my_rank]
        host, port = endpoint.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, int(port)))
            s.listen()
        return None
    except Exception as e:  # reported to the test, which fails on it
        return repr(e)


def parent_death_signal():
    """The signal this process gets when its parent dies (prctl PR_GET_PDEATHSIG)."""
    value = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(value))  # PR_GET_PDEATHSIG
    return value.value


def check_store(my_rank):
    from datetime import timedelta

    world = int(os.environ["WORLD_SIZE"])
    store = launcher_store(timedelta(seconds=20))
    store.set(f"env_dump/{my_rank}", f"rank {my_rank} was here")
    keys = [f"env_dump/{r}" for r in range(world)]
    store.wait(keys)
    values = [store.get(k).decode() for k in keys]
    # Rank 0 may serve the store (a torch without libuv): it stays until every rank has read.
    store.set(f"env_dump/read/{my_rank}", "1")
    if my_rank == 0:
        store.wait([f"env_dump/read/{r}" for r in range(world)])
    return values


def main():
    out_dir = sys.argv[1]
    my_rank = rank()
    record = {
        "env": dict(os.environ),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "pdeathsig": parent_death_signal(),
        "orig_argv": sys.orig_argv,
        "stdout_write_through": sys.stdout.write_through,
        "error_file_dir_writable": os.access(
            os.path.dirname(os.environ.get("TORCHELASTIC_ERROR_FILE", "/nonexistent/x")), os.W_OK
        ),
        "bind_error": bind_own_endpoint(os.environ.get("TF_CONFIG", "{}"), my_rank),
    }
    if "--store" in sys.argv[2:]:
        record["store_values"] = check_store(my_rank)
    write_json(os.path.join(out_dir, f"env_{my_rank}.json"), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
