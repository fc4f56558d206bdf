"""A job that saves a state every step through dlrun.checkpoint (tests/python/test_checkpoint.py).

Usage: checkpoint_job.py OUT_DIR STEPS [FAULT ...]

At its start every rank calls dlrun.checkpoint.load() and writes
OUT_DIR/loaded_<RANK>_<ATTEMPT>.json: the step loaded (null for none) and whether the state loaded
equals, bit for bit, the one saved at that step. Then it saves STEPS - (loaded + 1) more steps;
after each, the rank waits until its copy is complete and meets the others (a gloo barrier), so a
fault after it finds the step the job's. The state of a step (state()) depends on the step and rank
alone: tensors of several dtypes, nested, with other values beside them.

Each FAULT is KIND:RANK:STEP and strikes the rank's process of the job's first attempt:
- kill: it SIGKILLs itself once STEP is complete everywhere;
- corrupt: it changes a byte of its own copy of STEP, once complete everywhere, and exits 1,
  while the others wait for it in a barrier (no rank saves past STEP: they all still hold the
  step before it);
- midsave: it SIGKILLs itself as its copy of STEP is being checksummed (half saved);
- host: once STEP is complete everywhere it writes OUT_DIR/lose_host_<RANK> and SIGSTOPs itself,
  for the test to kill its whole host.
Each rank's first process writes OUT_DIR/pid_<RANK> (its PID) at its start.
With `alone:RANK:STEP` the other ranks end once STEP is complete everywhere (rank 0, where its
torch serves the store, once RANK is done), and RANK goes on
alone renumbered as rank 0 of 1 (RANK and WORLD_SIZE set anew, as dlrun.recovery renumbers the
survivors of a lost node): it saves the steps left, loads, and writes OUT_DIR/alone.json (the
step loaded, and whether it equals what RANK saved at that step).
With `reload:STEP` among the arguments every rank calls load() again once STEP is saved
everywhere (OUT_DIR/reloaded_<RANK>.json: the step) and goes on.
A rank that loaded a step writes at its end OUT_DIR/kept_<RANK>_<ATTEMPT>.json: whether what it
loaded still equals that step's state after its later saves. A rank that ends writes
OUT_DIR/done_<RANK>; with `hold` among the arguments it first writes
OUT_DIR/held_<RANK> and waits for OUT_DIR/release (a test that kills the agent meanwhile).

With `preempt:STEP` every rank asks dlrun.checkpoint.should_stop() after each step (its barrier
passed); at STEP rank 0 writes OUT_DIR/preempt_<STEP> and waits for its own SIGTERM (the test
stops dlrun then) while the others go on to the next step's barrier. A rank told to stop
writes OUT_DIR/stopped_<RANK>.json (the step) and ends. With `late:RANK:STEP` too, RANK asks
should_stop() at STEP only once rank 0 has its answer (where rank 0's torch serves the store,
the answer of rank 0 waits for RANK's: the store ends with rank 0).
"""

import glob
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.checkpoint as checkpoint  # noqa: E402  (dlrun puts its package on PYTHONPATH)
from worker_util import (  # noqa: E402
    MAX_WAIT_S,
    exit_past_torch_teardown,
    faults,
    serves_store,
    wait_for_release,
    write_json,
)


def state(step, rank):
    g = torch.Generator().manual_seed(step * 100 + rank)
    weights = torch.randn(64, 33, generator=g)
    return {
        "model": {
            "w": weights,
            "b": torch.randn(33, generator=g, dtype=torch.float64),
            "half": weights[:8].to(torch.bfloat16),
            "mask": weights[0] > 0,
        },
        "optimizer": {"step": torch.tensor(step), "momenta": [weights * 2, weights.t()], "lr": 0.1},
        "epoch": step // 10,
        "empty": torch.zeros(0),
        "name": f"rank {rank}",
    }


def equal(a, b):
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        return a.numel() == 0 or a.contiguous().view(-1).view(torch.uint8).equal(
            b.contiguous().view(-1).view(torch.uint8)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def corrupt(step, rank):
    """A byte of this rank's copy of `step` changed (the slot whose mark names it)."""
    [slot] = [
        path
        for path in glob.glob(
            os.path.join(os.environ["DLRUN_CHECKPOINT_SHM"], f"rank-{rank}", "slot-*")
        )
        if open(os.path.join(path, "step")).read().split()[0] == str(step)
    ]
    path = os.path.join(slot, "tensors")
    with open(path, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))


def die_in_checksum():
    real = checkpoint.checksum

    def dying(*args):
        os.kill(os.getpid(), signal.SIGKILL)
        return real(*args)

    checkpoint.checksum = dying


def wait_for_stop_request():
    """Until this process got SIGTERM (which should_stop() made a request to stop), or for
    MAX_WAIT_S at most."""
    deadline = time.monotonic() + MAX_WAIT_S
    while not checkpoint._preemption.asked and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs as the sleep ends


def wait_for_rank_zero_stopping():
    """Until rank 0 has counted itself as stopping in the job's store (dlrun.checkpoint's
    should_stop() at the stop step), or for MAX_WAIT_S at most: this rank asks after rank 0
    had its answer."""
    from dlrun._job import store_client

    store = store_client(int(os.environ["WORLD_SIZE"]), timedelta(seconds=MAX_WAIT_S))
    deadline = time.monotonic() + MAX_WAIT_S
    while store.add(f"{checkpoint.KEYS}/stopping", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.005)


def go_on_alone(out, steps, step, rank):
    """The steps after `step` as rank 0 of 1, then a load (see the module's docstring)."""
    os.environ.update(RANK="0", WORLD_SIZE="1")
    for later in range(step + 1, steps):
        checkpoint.save(state(later, rank), later)
    found = checkpoint.load()
    write_json(
        os.path.join(out, "alone.json"),
        {"step": found[0], "equal": equal(found[1], state(found[0], rank))},
    )
    return 0


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    args = [
        a
        for a in sys.argv[3:]
        if a != "hold" and not a.startswith(("reload:", "preempt:", "alone:", "late:"))
    ]
    late = next(
        (tuple(map(int, a.split(":")[1:])) for a in sys.argv[3:] if a.startswith("late:")), None
    )
    alone = next(
        (tuple(map(int, a.split(":")[1:])) for a in sys.argv[3:] if a.startswith("alone:")), None
    )
    reload_at, preempt_at = (
        next((int(a.split(":")[1]) for a in sys.argv[3:] if a.startswith(f"{kind}:")), None)
        for kind in ("reload", "preempt")
    )
    rank, attempt = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
    if attempt == "0":
        write_json(os.path.join(out, f"pid_{rank}"), os.getpid())
    dist.init_process_group("gloo")
    strikes = faults(args, rank)
    corrupted = {
        int(a.split(":")[2])
        for a in args
        if a.startswith("corrupt:") and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    }
    found = checkpoint.load()
    loaded = None if found is None else found[0]
    write_json(
        os.path.join(out, f"loaded_{rank}_{attempt}.json"),
        {"step": loaded, "equal": found is not None and equal(found[1], state(loaded, rank))},
    )
    for step in range(0 if loaded is None else loaded + 1, steps):
        if strikes.get(step) == "midsave":
            die_in_checksum()
        checkpoint.save(state(step, rank), step)
        checkpoint.wait()
        dist.barrier()
        if reload_at == step:  # every rank loads again, and keeps what it loaded
            found = checkpoint.load()
            loaded = found[0]
            write_json(os.path.join(out, f"reloaded_{rank}.json"), {"step": loaded})
        if preempt_at is not None:
            if preempt_at == step and rank == 0 and attempt == "0":
                open(os.path.join(out, f"preempt_{step}"), "w").close()
                wait_for_stop_request()
            if late == (rank, step):
                wait_for_rank_zero_stopping()
            if checkpoint.should_stop(step):
                write_json(os.path.join(out, f"stopped_{rank}.json"), {"step": step})
                return 0
        if strikes.get(step) == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if alone and alone[1] == step:
            if alone[0] == rank:
                return go_on_alone(out, steps, step, rank)
            if serves_store():  # until the renumbered rank is done with it
                return wait_for_release(out, "alone.json")
            return 0
        if strikes.get(step) == "host":
            open(os.path.join(out, f"lose_host_{rank}"), "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        if strikes.get(step) == "corrupt":
            corrupt(step, rank)
            os._exit(1)
        if step in corrupted:
            dist.barrier()  # ends as the corrupting rank exits
    if found is not None:  # the loaded tensors are the program's own: later saves leave them
        write_json(
            os.path.join(out, f"kept_{rank}_{attempt}.json"),
            {"equal": equal(found[1], state(loaded, rank))},
        )
    if "hold" in sys.argv[3:]:
        open(os.path.join(out, f"held_{rank}"), "w").close()
        wait_for_release(out)
    open(os.path.join(out, f"done_{rank}"), "w").close()
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
