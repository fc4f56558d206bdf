"""A training job that saves every step with dlrun.checkpoint.save(..., overlap=True)
(tests/python/test_checkpoint.py): DDP over gloo, a model with a BatchNorm (buffers that each
forward changes, which no optimizer owns) and SGD with momentum.

Usage: overlap_job.py OUT_DIR STEPS [FAULT ...]

At its start every rank calls load() and writes OUT_DIR/loaded_<RANK>_<ATTEMPT>.json: the step
loaded (null for none), whether the state loaded equals, bit for bit, the one the rank had as it
saved that step (OUT_DIR/digest_<RANK>_<STEP>, written before each save), and whether its torch
can overlap a save (torch 2's hook on every optimizer's step). Then it trains and saves the
steps left; after each, the rank waits until its copy is complete and meets the others.

Each FAULT is KIND:RANK:STEP and strikes the rank's process of the job's first attempt:
- kill: it SIGKILLs itself once STEP is complete everywhere;
- poke: it changes a parameter in place after save() returned and before the copy is made (the
  copy made to wait for it): a torn copy, never counted;
- late: the copy of STEP waits until the rank calls the next step's optimizer.step(), which
  must wait for it (the rank does not wait for its copy of STEP before that step): a hook of
  that optimizer's own, which runs after dlrun's, writes OUT_DIR/early_<RANK> where the copy
  was not made yet.
A rank that ends writes OUT_DIR/done_<RANK>.
"""

import hashlib
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.checkpoint as checkpoint  # noqa: E402  (dlrun puts its package on PYTHONPATH)
from worker_util import exit_past_torch_teardown, faults, write_json  # noqa: E402


def digest(state):
    h = hashlib.sha256()
    for part in ("model", "optimizer"):
        for key, value in sorted(state[part].items(), key=lambda kv: str(kv[0])):
            h.update(str(key).encode())
            if torch.is_tensor(value):
                h.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            elif isinstance(value, dict):
                h.update(digest({"model": value, "optimizer": {}}).encode())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()


def copy_after(event, made):
    """Makes the next copy wait for `event`, and set `made` once made."""
    real = checkpoint.copy_beside

    def waiting(*args):
        event.wait()
        checkpoint.copy_beside = real
        copied = real(*args)
        made.set()
        return copied

    checkpoint.copy_beside = waiting


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    import torch.optim.optimizer as optimizers

    can_overlap = hasattr(optimizers, "register_optimizer_step_pre_hook")
    found = checkpoint.load()
    start = 0
    equal = False
    if found:
        model.load_state_dict(found[1]["model"])
        optimizer.load_state_dict(found[1]["optimizer"])
        start = found[0] + 1
        with open(os.path.join(out, f"digest_{rank}_{found[0]}")) as f:
            equal = digest(found[1]) == f.read()
    write_json(
        os.path.join(out, f"loaded_{rank}_{attempt}.json"),
        {
            "step": found[0] if found else None,
            "equal": equal,
            "overlap": can_overlap,
        },
    )
    strikes = faults(sys.argv[3:], rank)
    ddp = DistributedDataParallel(model)
    late, made = threading.Event(), threading.Event()
    made.set()

    def early(optimizer, args, kwargs):
        if not (made.is_set() or checkpoint._overlap._current is None):  # dlrun's: checked
            open(os.path.join(out, f"early_{rank}"), "w").close()

    if can_overlap:
        optimizer.register_step_pre_hook(early)
    for step in range(start, steps):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        late.set()
        optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        with open(os.path.join(out, f"digest_{rank}_{step}"), "w") as f:
            f.write(digest(state))
        poked, late = threading.Event(), threading.Event()
        if strikes.get(step) in ("poke", "late") and can_overlap:  # else copied in save()
            made.clear()
            copy_after(poked if strikes[step] == "poke" else late, made)
        checkpoint.save(state, step, overlap=True)
        if strikes.get(step) == "poke":
            with torch.no_grad():
                next(model.parameters()).add_(1.0)
            poked.set()
        if strikes.get(step) != "late":
            checkpoint.wait()
        dist.barrier()
        if strikes.get(step) == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    open(os.path.join(out, f"done_{rank}"), "w").close()
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
