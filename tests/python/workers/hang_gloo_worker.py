"""One rank of an unmodified torch gloo job, for test_dlrun_hang: all_reduce steps, each one
announced by writing its number to DLRUN_HEARTBEAT_FILE (the only thing it knows of dlrun).

Usage: hang_gloo_worker.py SLEEPER STEP
Rank SLEEPER sleeps before its all_reduce of step STEP (the sleep stands for a stuck data
loader), so every other rank waits in that all_reduce. It gives up after MAX_WAIT_S, so a
launcher that fails to stop it cannot leave it behind for ever.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from worker_util import MAX_WAIT_S

STEPS = 1000


def stuck_before_all_reduce():
    time.sleep(MAX_WAIT_S)


def main():
    sleeper, stuck_step = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(minutes=5))
    rank = dist.get_rank()
    tensor = torch.ones(8)
    for step in range(1, STEPS + 1):
        with open(os.environ["DLRUN_HEARTBEAT_FILE"], "w") as beat:
            beat.write(str(step))
        if step == stuck_step and rank == sleeper:
            stuck_before_all_reduce()
        dist.all_reduce(tensor)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
