"""One rank of bench/checkpoint_bench.sh, under dlrun: what a checkpoint costs, dlrun.checkpoint
in the node's memory against torch.save and torch.load to local disk, in the same process.

Usage: checkpoint_worker.py OUT_DIR MEGABYTES STEPS

The state: MEGABYTES of float32 in 16 tensors, half "model", half "optimizer". Per step, each of
STEPS: torch.save of the state to OUT_DIR (local disk, page cache as a user's save), then
dlrun.checkpoint.save; the time each blocks the caller, and for dlrun.checkpoint the time from
its return to the copy complete (checksummed and counted; wait()). Then torch.load of the file
and dlrun.checkpoint.load() (every rank: the job's newest step from memory, checksums checked).
Writes OUT_DIR/rank_<RANK>.json with each measurement's seconds.
"""
import json
import os
import sys
import time

import torch

import dlrun.checkpoint as checkpoint  # dlrun puts its package on PYTHONPATH

TENSORS = 16


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main():
    out, megabytes, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    each = int(megabytes * 2**20 / 4 / TENSORS)
    g = torch.Generator().manual_seed(rank)
    tensors = [torch.randn(each, generator=g) for _ in range(TENSORS)]
    state = {"model": {f"w{i}": t for i, t in enumerate(tensors[:TENSORS // 2])},
             "optimizer": {"state": {i: {"momentum": t} for i, t in enumerate(tensors[TENSORS // 2:])},
                           "lr": 0.1}}
    path = os.path.join(out, f"rank{rank}.pt")
    found = checkpoint.load()
    assert found is None, "a fresh job finds no checkpoint"
    runs = {"torch_save": [], "save": [], "complete": [], "torch_load": [], "load": []}
    for step in range(steps):
        for t in tensors:
            t.add_(1.0)  # a training step's change
        runs["torch_save"].append(timed(lambda: torch.save(state, path))[0])
        runs["save"].append(timed(lambda: checkpoint.save(state, step))[0])
        runs["complete"].append(timed(checkpoint.wait)[0])
    for _ in range(3):
        runs["torch_load"].append(timed(lambda: torch.load(path))[0])
        took, found = timed(checkpoint.load)
        runs["load"].append(took)
        assert found[0] == steps - 1 and torch.equal(found[1]["model"]["w0"], tensors[0])
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(runs, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
