"""One rank of test_torch_gloo: joins a gloo group through dlrund and checks an all_reduce.

Rendezvous settings come from the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
TORCHELASTIC_*). Exits 0 when the reduced tensor is right, non-zero otherwise. On a torch built
without libuv, whose env:// asks for libuv at an agent's store and refuses, the rank makes its
client of dlrund itself (use_libuv=False) and hands it to init_process_group.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
from worker_util import client_options  # noqa: E402

TIMEOUT = timedelta(seconds=30)


def main():
    options = client_options()
    if options:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            int(os.environ["WORLD_SIZE"]),
            False,
            TIMEOUT,
            **options,
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=TIMEOUT,
        )
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((16,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world_size * (world_size + 1) / 2
    dist.destroy_process_group()
    if not torch.all(tensor == expected):
        print(
            f"rank {rank}: expected every element {expected}, got {tensor.tolist()}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
