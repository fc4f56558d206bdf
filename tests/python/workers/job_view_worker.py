"""A torch job whose ranks step at their own pace, reporting through dlrun.progress.

Usage: job_view_worker.py OUT_DIR STOP_FILE MAX_SECONDS
Joins the gloo process group from dlrun's environment and all-reduces once (every rank is up),
writes OUT_DIR/started_<RANK>.json ({"rank", "pid", "world"}), then steps until STOP_FILE
exists (or MAX_SECONDS have passed): each step is a small matmul of its own and a short wait,
as a data loader's, reported with progress.step(n, loss=..., samples=...). No collective inside
the loop: the ranks do not wait for each other, so a rank that is slowed steps slower than the
others (in lockstep, as under DDP, every rank would share the slowest pace). A barrier at the
end, then OUT_DIR/done_<RANK>.json ({"rank", "steps"}) and exit 0.
"""

import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.progress as progress  # noqa: E402
from worker_util import exit_past_torch_teardown, write_json  # noqa: E402

STEP_WAIT_S = 0.05  # about 20 steps a second a rank: 8 ranks leave 2 CPUs room for the rest
BATCH = 32


def main():
    out_dir, stop_file, max_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    ones = torch.ones(1)
    dist.all_reduce(ones)
    if int(ones.item()) != world:
        print(
            f"job_view_worker rank {rank}: all_reduce gave {ones.item()}, world {world}",
            file=sys.stderr,
            flush=True,
        )
        exit_past_torch_teardown(1)
    write_json(
        os.path.join(out_dir, f"started_{rank}.json"),
        {"rank": rank, "pid": os.getpid(), "world": world},
    )

    torch.manual_seed(rank)
    weights = torch.randn(64, 64) / 8
    deadline = time.monotonic() + max_seconds
    n = 0
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        x = torch.randn(BATCH, 64)
        for _ in range(4):
            x = torch.tanh(x @ weights)
        n += 1
        loss = 2.0 / math.sqrt(n) + 0.01 * float(x.abs().mean())
        progress.step(n, loss=loss, samples=n * BATCH)
        time.sleep(STEP_WAIT_S)

    dist.barrier()
    write_json(os.path.join(out_dir, f"done_{rank}.json"), {"rank": rank, "steps": n})
    exit_past_torch_teardown(0)


if __name__ == "__main__":
    main()
