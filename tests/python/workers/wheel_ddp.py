"""A torch DDP worker for test_wheel.py, run by the dlrun that the wheel put into a fresh venv: a
few steps of a small DDP model over gloo, each reported through dlrun.progress, and one
all_reduce; writes what it ran with (the interpreter, torch's version, where dlrun.progress came
from and whether it reports) to OUT/rank-R.json, then waits for the test's release, which comes
once the agent has seen the last step.

    wheel_ddp.py OUT
"""

import os
import sys

import torch
import torch.distributed as dist

import dlrun.progress
import worker_util

STEPS = 5


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, STEPS + 1):
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dlrun.progress.step(step, loss=loss.item())
    ranks = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(ranks)
    worker_util.write_json(
        os.path.join(out, f"rank-{dist.get_rank()}.json"),
        {
            "executable": sys.executable,
            "torch": torch.__version__,
            "world": dist.get_world_size(),
            "rank_sum": ranks.item(),
            "progress": dlrun.progress.__file__,
            "reports": dlrun.progress.active(),
        },
    )
    worker_util.exit_past_torch_teardown(worker_util.wait_for_release(out))


if __name__ == "__main__":
    main()
