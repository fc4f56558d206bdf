"""One rank of bench/preemption_bench.sh, under dlrun: torch DDP over gloo on CPU, the MLP of the
recovery bench (784-1024-384-10, SGD), a batch a step made from the step and rank.

Usage: preemption_worker.py OUT_DIR STEPS save|alternate

At its start every rank calls dlrun.checkpoint.load() and writes OUT_DIR/loaded_<RANK>.json (the
step loaded, null for none, and the SHA-256 of its weights). `save`: after each step the rank
saves the model and optimizer (dlrun.checkpoint.save) and asks should_stop(); told to stop, it
writes OUT_DIR/stopped_<RANK>.json (the step and its weights' SHA-256) and ends. Rank 0 writes
OUT_DIR/running once it took 5 steps. `alternate`: in blocks of BLOCK steps, in turn, steps that
do no more than train ("plain"), steps that also save and ask should_stop() ("save"), the same
with save(..., overlap=True) ("overlap": the copy beside the next step's forward and backward),
and steps that also copy the same tensors into memory of the rank's own with dlrun's copy and
nothing else ("copy": the floor of any save that copies the state at once); the step-time
comparison, within one run (a machine's pace drifts between runs). At its end each rank
writes OUT_DIR/times_<RANK>.json: every step's [seconds, its kind], the save and should_stop()
included.
"""

import hashlib
import json
import mmap
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import dlrun.checkpoint as checkpoint  # dlrun puts its package on PYTHONPATH
from dlrun import _copies
from dlrun._tree import hollow

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_worker import make_model  # noqa: E402  (the recovery bench's MLP)

WIDTHS = (784, 1024, 384, 10)
BATCH = 64
BLOCK = 10  # steps a block of `alternate`
KINDS = ("plain", "save", "overlap", "copy")  # the blocks of `alternate`, in turn


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def write(path, record):
    with open(f"{path}.tmp", "w") as f:
        json.dump(record, f)
    os.replace(f"{path}.tmp", path)


_scratch = {}  # copy_alone's memory, by size


def copy_alone(state):
    """The state's tensors copied as save() copies them, into shared memory of this rank's own
    (allocated once), and nothing else: no structure, marks, checksum or store."""
    tensors = []
    hollow(state, tensors)
    layout, size = _copies.lay_out(tensors)
    if size not in _scratch:
        _scratch[size] = mmap.mmap(-1, size)
    _copies.copy_in(_scratch[size], tensors, layout)


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
        kind = "save" if mode == "save" else KINDS[(step // BLOCK) % len(KINDS)]
        if kind in ("save", "overlap"):
            checkpoint.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                step,
                overlap=kind == "overlap",
            )
            stop = checkpoint.should_stop(step)
        elif kind == "copy":
            copy_alone({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
        times.append((time.perf_counter() - began, kind))
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
