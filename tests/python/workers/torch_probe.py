"""Records what a worker sees of its launcher and what torch's own readers make of it.

Usage: torch_probe.py OUT_DIR
First writes OUT_DIR/started_<RANK>.json (its pid, for the test's cleanup), then
OUT_DIR/probe_<RANK>.json: the whole environment, pid, argv, the IPv4 addresses that MASTER_ADDR
and the worker's host name resolve to (in the worker's own host: a simulated host has its own
hosts file), and what torch's readers make of the launcher's variables: is_torchelastic_launched()
(TORCHELASTIC_RUN_ID), the env:// rendezvous's choice of a store client
(TORCHELASTIC_USE_AGENT_STORE), the error file @record writes (TORCHELASTIC_ERROR_FILE), and
init_process_group("gloo") from the environment with an all_reduce over every rank. Exits 1
(without the probe file) when the process group fails.
"""

import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
from torch.distributed.rendezvous import _torchelastic_use_agent_store

from worker_util import exit_past_torch_teardown, rank, write_json


def resolve(host):
    """The IPv4 addresses `host` resolves to, [] when it does not."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)})
    except socket.gaierror:
        return []


def main():
    out_dir = sys.argv[1]
    my_rank = rank()
    write_json(os.path.join(out_dir, f"started_{my_rank}.json"), {"pid": os.getpid()})
    record = {
        "env": dict(os.environ),
        "pid": os.getpid(),
        "orig_argv": sys.orig_argv,
        "torch": torch.__version__,
        "master_addresses": resolve(os.environ["MASTER_ADDR"]),
        "host_addresses": resolve(socket.gethostname()),
        "is_torchelastic_launched": dist.is_torchelastic_launched(),
        "use_agent_store": _torchelastic_use_agent_store(),
        "error_file": ErrorHandler()._get_error_file_path(),
    }
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    total = torch.tensor([my_rank + 1])
    dist.all_reduce(total)
    record["process_group"] = {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "rank_sum": int(total.item()),
    }
    dist.barrier()
    dist.destroy_process_group()
    write_json(os.path.join(out_dir, f"probe_{my_rank}.json"), record)
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
