"""A DDP job over gloo that resumes from its checkpoint after a restart, for the recovery tests.

Usage: recovery_train.py OUT_DIR STEPS VICTIM_RANK [ATTEMPT:STEP ...]

Rendezvous is env:// (the launcher's MASTER_ADDR and MASTER_PORT, read anew in every attempt:
the port may differ from one attempt to the next) with a short timeout, so a restart that
cannot meet fails instead of hanging. Every rank starts from OUT_DIR/checkpoint.pt when it
exists (else from one seed), at the step after the checkpoint's, and trains to STEPS - 1. After
each step rank 0 writes the checkpoint (a temporary file renamed over the last one) holding the
model, the optimizer and `history`: one [step, attempt] pair per step completed, in order; a
barrier then tells every rank that the step is checkpointed. So the final checkpoint lists every
step taken, with the attempt that took it, and a step lost with a killed attempt (begun, not
checkpointed) is the only step that can be taken again. Rank 0 also appends `ATTEMPT STEP` to
OUT_DIR/begun.log as it begins each step (one write, O_APPEND).

Each ATTEMPT:STEP asks VICTIM_RANK, in that attempt (TORCHELASTIC_RESTART_COUNT), to write its
pid to OUT_DIR/victim_<ATTEMPT>.pid once STEP is checkpointed, then to wait for the test's
SIGKILL: the kill lands mid-training at a known step, with no sleep as synchronisation.

At the end every rank all-gathers the parameters and exits 1 unless all replicas are equal;
rank 0 replays the STEPS steps in one process (every rank's batch of each step, the gradients
averaged as DDP does) and records how far the job's parameters are from the replay's, and from a
replay one step short (which shows the check can tell a step missing or taken twice). Each rank
writes OUT_DIR/done_<RANK>.json.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import (
    exit_past_torch_teardown,
    wait_to_be_stopped,
    write_atomic,  # noqa: E402
    write_json,
)

TIMEOUT = timedelta(seconds=30)
BATCH = 16
SEED = 1234


def make_model():
    # float64: the replay must match the job's parameters to rounding, not to float32's noise.
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()


def make_optimizer(params):
    # Momentum: a restart that lost the optimizer's state would leave the replay's path.
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batch(step, rank):
    """The batch of `rank` at `step`: the same in every attempt and in the replay."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True)


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def fail(message):
    print(f"recovery_train rank {os.environ.get('RANK')}: {message}", file=sys.stderr, flush=True)
    exit_past_torch_teardown(1)


def load_checkpoint(path, model, optimizer):
    """The history of the checkpoint at `path` (loaded into model and optimizer), or []."""
    if not os.path.exists(path):
        return []
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return [list(pair) for pair in state["history"]]


def save_checkpoint(path, model, optimizer, history):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "history": history}, tmp
    )
    os.replace(tmp, path)


def replay(steps, world):
    """The parameters after `steps` steps in one process, and after steps - 1."""
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    one_short = None
    for step in range(steps):
        if step == steps - 1:
            one_short = flat(model).clone()
        optimizer.zero_grad()
        for rank in range(world):
            x, y = batch(step, rank)
            # DDP averages the ranks' gradients: the mean of their losses' gradients.
            (torch.nn.functional.mse_loss(model(x), y) / world).backward()
        optimizer.step()
    return flat(model), one_short


def kill_points(args):
    return {int(a): int(s) for a, s in (item.split(":") for item in args)}


def main():
    out_dir, steps, victim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kills = kill_points(sys.argv[4:])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoint = os.path.join(out_dir, "checkpoint.pt")

    model = make_model()
    optimizer = make_optimizer(model.parameters())
    history = load_checkpoint(checkpoint, model, optimizer)
    start = history[-1][0] + 1 if history else 0
    # DDP broadcasts rank 0's parameters: every rank loaded the same checkpoint anyway.
    ddp = DistributedDataParallel(model)
    begun = os.open(os.path.join(out_dir, "begun.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for step in range(start, steps):
        if rank == 0:
            os.write(begun, f"{attempt} {step}\n".encode())
        x, y = batch(step, rank)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        if not torch.isfinite(loss):
            fail(f"loss is {loss.item()} at step {step}")
        history.append([step, attempt])
        if rank == 0:
            save_checkpoint(checkpoint, model, optimizer, history)
        dist.barrier()  # every rank knows the step is checkpointed
        if rank == victim and kills.get(attempt) == step:
            write_atomic(os.path.join(out_dir, f"victim_{attempt}.pid"), str(os.getpid()))
            wait_to_be_stopped()
    os.close(begun)

    mine = flat(model)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for other, params in enumerate(gathered):
        if not torch.equal(params, mine):
            fail(
                f"parameters differ from rank {other}'s by up to "
                f"{(params - mine).abs().max().item()}"
            )
    record = {
        "rank": rank,
        "world": world,
        "attempt": attempt,
        "start": start,
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "torch": torch.__version__,
        "checksum": float(mine.sum()),
    }
    if rank == 0:
        expected, one_short = replay(steps, world)
        record["history"] = history
        record["replay_diff"] = (mine - expected).abs().max().item()
        record["one_short_diff"] = (mine - one_short).abs().max().item()
    dist.barrier()
    dist.destroy_process_group()
    write_json(os.path.join(out_dir, f"done_{rank}.json"), record)
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
