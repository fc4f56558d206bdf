"""One rank of bench/preemption_bench.sh, under dlrun: torch DDP over gloo on CPU, the MLP of the
recovery bench (784-1024-384-10, SGD), a batch a step made from the step and rank.

Usage: preemption_worker.py OUT_DIR STEPS save|alternate

At its start every rank calls dlrun.checkpoint.load() and writes OUT_DIR/loaded_<RANK>.json (the
step loaded, null for none, and the SHA-256 of its weights). `save`: after each step the rank
saves the model and optimizer (dlrun.checkpoint.save) and asks should_stop(); told to stop, it
writes OUT_DIR/stopped_<RANK>.json (the step and its weights' SHA-256) and ends. Rank 0 writes
OUT_DIR/running once it took 5 steps. `alternate`: the same, in blocks of BLOCK steps that save
and ask should_stop() and blocks that do neither, in turn (the step-time comparison, within one
run: a machine's pace drifts between runs). At its end each rank writes
OUT_DIR/times_<RANK>.json: every step's [seconds, whether it saved], the save and should_stop()
included.
"""

import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dlrun.checkpoint as checkpoint  # dlrun puts its package on PYTHONPATH

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_worker import make_model  # noqa: E402  (the recovery bench's MLP)

WIDTHS = (784, 1024, 384, 10)
BATCH = 64
BLOCK = 10  # steps a block of `alternate`


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def write(path, record):
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f)
    os.replace(f"{path}.tmp", path)


def main():
    out, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = make_model(torch, WIDTHS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    found = checkpoint.load()
    start = 0
    if found:
        model.load_state_dict(found[1]["model"])
        optimizer.load_state_dict(found[1]["optimizer"])
        start = found[0] + 1
    write(
        os.path.join(out, f"loaded_{rank}.json"),
        {"step": found[0] if found else None, "sha256": digest(model)},
    )
    ddp = DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for step in range(start, steps):
        began = time.perf_counter()
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(BATCH, WIDTHS[0], generator=g)
        y = torch.randint(0, WIDTHS[-1], (BATCH,), generator=g)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        optimizer.step()
        stop = False
        saving = mode == "save" or (step // BLOCK) % 2 == 1
        if saving:
            checkpoint.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step
            )
            stop = checkpoint.should_stop(step)
        times.append((time.perf_counter() - began, saving))
        if rank == 0 and step == start + 5:
            open(os.path.join(out, "running"), "w").close()
        if stop:
            write(
                os.path.join(out, f"stopped_{rank}.json"), {"step": step, "sha256": digest(model)}
            )
            break
    write(os.path.join(out, f"times_{rank}.json"), times)
    checkpoint.wait()
    return 0


if __name__ == "__main__":
    code = main()
    # Out without the interpreter's teardown: torch 2.13 tears a gloo group down that was not
    # destroyed with a "terminate called without an active exception" now and then (SIGABRT:
    # a failed run), and destroy_process_group() can deadlock in DDP's reducer (the recovery
    # bench's worker notes it). Everything this program writes is closed by then.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
