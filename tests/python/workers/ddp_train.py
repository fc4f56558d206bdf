"""Trains a tiny model with DistributedDataParallel over gloo and checks the replicas agree.

Usage: ddp_train.py OUT_DIR EXPECTED_WORLD_SIZE [--fail-first-attempt]
Rendezvous is env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher). Each rank
starts from different random weights and sees different data, so only DDP's initial broadcast
and its gradient all-reduce can make the replicas equal. After a few steps every rank
all-gathers the flattened parameters and compares them with its own; it exits 1 when they
differ, when the weights did not move, or when the world is not the expected size, and
otherwise writes OUT_DIR/ok_<RANK>.json. With --fail-first-attempt, in the launcher's first
attempt every rank meets the others (a barrier) and rank 1 then exits 3, after writing
OUT_DIR/failed_<MASTER_PORT>: the next attempt must start on a store of its own.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import exit_past_torch_teardown, write_json  # noqa: E402

STEPS = 5


def fail(message):
    print(f"ddp_train rank {os.environ.get('RANK')}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def main():
    out_dir, expected_world = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    if "--fail-first-attempt" in sys.argv and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        dist.barrier()
        if rank == 1:
            write_json(os.path.join(out_dir, f"failed_{os.environ['MASTER_PORT']}"), {})
            os._exit(3)
        dist.barrier()  # fails, or waits to be stopped, once rank 1 is gone
        return 5
    if world != expected_world or rank != int(os.environ["RANK"]):
        fail(
            f"world {world} rank {rank}, expected world {expected_world}, RANK {os.environ['RANK']}"
        )

    torch.manual_seed(1000 + rank)  # deliberately different initial weights per rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    initial = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for _ in range(STEPS):
        x = torch.randn(32, 8)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        if not torch.isfinite(loss):
            fail(f"loss is {loss.item()}")

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    for other, params in enumerate(gathered):
        if not torch.equal(params, flat):
            diff = (params - flat).abs().max().item()
            fail(f"parameters differ from rank {other}'s by up to {diff}")
    if torch.allclose(flat, initial):
        fail("training did not change the parameters")
    # Rank 0's initial weights were broadcast to all: a different start on rank 0 would differ.
    dist.barrier()
    dist.destroy_process_group()
    write_json(
        os.path.join(out_dir, f"ok_{rank}.json"),
        {
            "rank": rank,
            "world": world,
            "checksum": float(flat.double().sum()),
            "executable": sys.executable,
            "master_port": os.environ["MASTER_PORT"],
            "agent_store": os.environ["TORCHELASTIC_USE_AGENT_STORE"],
        },
    )
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
