"""One rank of test_torch_gloo: joins a gloo group through dlrund and checks an all_reduce.

Rendezvous settings come from the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
TORCHELASTIC_*). Exits 0 when the reduced tensor is right, non-zero otherwise.
"""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((16,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world_size * (world_size + 1) / 2
    dist.destroy_process_group()
    if not torch.all(tensor == expected):
        print(f"rank {rank}: expected every element {expected}, got {tensor.tolist()}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
