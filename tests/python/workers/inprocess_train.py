"""A deterministic DDP job over gloo on dlrun.recovery.Loop, for the in-process recovery tests.

Usage: inprocess_train.py OUT_DIR STEPS [KILL ...]

Each KILL is RANK:STEP[:stop|:host]: that rank's first process (the job's first attempt, not a
replacement) SIGKILLs itself (with `:stop`, SIGSTOPs itself: a hang) as it begins STEP, before the
step's collective, so the others fail, or wait, in the all-reduce of that step. With `:host` it
writes OUT_DIR/lose_host_<RANK> and SIGSTOPs itself, for the test to kill its whole host then. Two
at one step (`1:7 3:7`) are a second failure during the first's recovery. A KILL of RANK:group or
RANK:state SIGKILLs that rank's first process inside its first recovery, as it forms the group again
or as the state is sent: a failure during the re-forming; RANK:committed, as its first recovery's
last barrier returns (before its loop goes on: the generation's end, which a rank that died there
never said); RANK:group:host and RANK:committed:host then stop themselves as :host does. RANK:end
SIGKILLs it once its loop is over (past the loop's last barrier). RANK:STEP:pending leaves a
collective pending on its live peers as it begins STEP (an all-reduce of its own, while every other
rank's first process waits in a barrier first) and fails as a collective does when a peer went away:
the shape of a survivor whose next DDP bucket was under way as its previous one failed, whose old
group cannot close while its peers wait on it; RANK:STEP:stuck the same, and the group's destruction
never returns (the recovery's last resort: the rank exits to be replaced). RANK:STEP:hold: that
rank's first process stays in STEP for good, with no collective failing: the shape of a collective
whose peers' connections closed as it began and that never learns of it. RANK:STEP:ahead: that
rank's first process waits as it begins STEP until a worker started ahead (dlrun
--ready-replacements) has run its warmup for each local rank, then SIGKILLs itself.
RANK:STEP:slow: that rank's first process sleeps SLOW_S as it begins STEP, before its collective:
every rank's STEP takes as long (a step watch then waits twice that before it frees a rank).
RANK:STEP:gil: that rank's first process sleeps GIL_S in a C call that holds the GIL as it begins
STEP: stuck where neither a collective failing nor its step watch (a thread of the same
interpreter) can free it.

With INPROCESS_CHECKPOINT=1 every rank saves the model and optimizer through dlrun.checkpoint after
each step. RANK:STEP:saved: that rank's first process dies as its copy of STEP is made, before it
counts it in the store (the step then never completes on every rank).

Every process writes OUT_DIR/start_<RANK>_<PID> as it starts (a worker started ahead, dlrun
--ready-spares or --ready-replacements: OUT_DIR/reserve_<PID> then, OUT_DIR/warm_<PID> as its
loop's warmup runs, and
its start file once its loop ranked it; with INPROCESS_RESERVE_EXIT set it exits 3 there)
and appends each step it completes to OUT_DIR/steps_<RANK>_<PID>; at the end every rank writes
OUT_DIR/final_<RANK>.json with the SHA-256 of its parameters' bytes, its pid, its rank and world
size at the end (a smaller job renumbers), its generation, its recoveries and the last one's
phases. The model, the data (a generator seeded by step and rank) and the optimizer (momentum)
are the same in every run, so a fault-free run's final parameters are the ones to equal, bit for
bit.

INPROCESS_BACKEND=nccl runs it on CUDA through NCCL (test_inprocess_recovery_nccl.py; the device:
worker_util.device_for).
"""

import ctypes
import ctypes.util
import glob
import hashlib
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.checkpoint as checkpoint  # noqa: E402  (dlrun puts its package on PYTHONPATH)
import dlrun.recovery  # noqa: E402
from worker_util import device_for, exit_past_torch_teardown, write_json  # noqa: E402

BATCH = 16
SLOW_S = 2.5  # a :slow step: a step watch frees a rank 5 s on, past 2 s
GIL_S = 120  # a :gil step: past any test's wait; the agent must kill the rank first


def batch(step, rank, device):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def kills(out_dir, args, rank):
    """{step or "end": signal} at which this process kills or stops itself: none but in the
    rank's first process."""
    if os.environ.get("DLRUN_RECOVERY_JOIN") or os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
        return {}
    found = {}
    for arg in args:
        fields = arg.split(":")
        if int(fields[0]) != rank:
            continue
        if fields[1] in ("group", "state", "committed"):
            flag = os.path.join(out_dir, f"lose_host_{rank}") if fields[2:] == ["host"] else None
            die_in_recovery(fields[1], flag)
        elif fields[1] == "end":
            found["end"] = signal.SIGKILL
        else:
            how = {
                "stop": signal.SIGSTOP,
                **{
                    name: name
                    for name in (
                        "host",
                        "pending",
                        "stuck",
                        "hold",
                        "slow",
                        "gil",
                        "saved",
                        "ahead",
                    )
                },
            }
            found[int(fields[1])] = how.get("".join(fields[2:]), signal.SIGKILL)
    return found


def barriers(args):
    """The steps at which every rank's first process waits in a barrier first: where a rank
    leaves a collective pending (RANK:STEP:pending or :stuck)."""
    if os.environ.get("DLRUN_RECOVERY_JOIN") or os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
        return set()
    return {
        int(arg.split(":")[1]) for arg in args if arg.split(":")[2:] in (["pending"], ["stuck"])
    }


def leave_pending(how):
    """An all-reduce no peer matches (they wait in a barrier), left pending, and the error of a
    collective whose peer went away. `stuck`: the group's destruction never returns, the group
    still registered."""
    if how == "stuck":
        dist.destroy_process_group = lambda *args, **kwargs: threading.Event().wait()
    dist.all_reduce(torch.zeros(1), async_op=True)
    raise RuntimeError("Connection reset by peer (injected: a collective left pending)")


def die_in_recovery(phase, host_flag=None):
    """SIGKILLs this process as its loop's first recovery re-forms the group ("group": the
    second init_process_group, before it), sends the state ("state": its first send, receive
    or broadcast, the sending rank's or a receiving one's) or ends ("committed": as the first
    barrier returns, which is that recovery's last). With `host_flag`, writes that file and
    SIGSTOPs itself instead, for the test to kill its host."""
    names = {
        "group": ("init_process_group",),
        "state": ("broadcast", "isend", "recv"),
        "committed": ("barrier",),
    }[phase]
    calls = []

    def end():
        if host_flag:
            open(host_flag, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP if host_flag else signal.SIGKILL)

    def dying(real):
        def call(*args, **kwargs):
            calls.append(1)
            if phase == "committed":
                done = real(*args, **kwargs)
                end()
                return done
            if len(calls) == (2 if phase == "group" else 1):
                end()
            return real(*args, **kwargs)

        return call

    for name in names:
        setattr(dist, name, dying(getattr(dist, name)))


def die_uncounted():
    """The next save's copy is made, and this process dies before it counts it."""
    memory = checkpoint._memory()
    memory._complete = lambda *args: os.kill(os.getpid(), signal.SIGKILL)


def main():
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    pid = os.getpid()
    # dlrun --ready-spares, --ready-replacements: a worker started ahead says so, and has no
    # rank of its own until its loop is made (it takes a lost node's ranks, or a failed
    # worker's, there).
    reserve = bool(os.environ.get("DLRUN_RECOVERY_RESERVE"))
    if reserve:
        open(os.path.join(out_dir, f"reserve_{pid}"), "w").close()
        if os.environ.get("INPROCESS_RESERVE_EXIT"):  # one that ends before it is placed
            return 3
    else:
        rank = int(os.environ["RANK"])
        open(os.path.join(out_dir, f"start_{rank}_{pid}"), "w").close()
        die_at = kills(out_dir, sys.argv[3:], rank)
    backend = os.environ.get("INPROCESS_BACKEND", "gloo")
    device = device_for(backend)
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def warmup(model):
        """A step of its own, the optimizer's too: the state the worker joins with replaces
        all of it (the fault-free weights are equalled all the same)."""
        open(os.path.join(out_dir, f"warm_{pid}"), "w").close()
        x, y = batch(0, 0, device)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    loop = dlrun.recovery.Loop(model, optimizer, backend=backend, exact=True, warmup=warmup)
    if reserve:
        rank = int(os.environ["RANK"])
        open(os.path.join(out_dir, f"start_{rank}_{pid}"), "w").close()
        die_at = {}  # a joining rank's: none
    barrier_at = barriers(sys.argv[3:]) - set(die_at)  # the pending rank's own step: none
    saving = os.environ.get("INPROCESS_CHECKPOINT") == "1"
    log = open(os.path.join(out_dir, f"steps_{rank}_{pid}"), "a", buffering=1)

    def train_step(step, ddp):
        if die_at.get(step) == "host":
            del die_at[step]
            open(os.path.join(out_dir, f"lose_host_{rank}"), "w").close()
            os.kill(pid, signal.SIGSTOP)
        if die_at.get(step) == "hold":
            threading.Event().wait()
        if die_at.get(step) == "slow":
            del die_at[step]
            time.sleep(SLOW_S)
        if die_at.get(step) == "gil":
            ctypes.PyDLL(ctypes.util.find_library("c")).sleep(GIL_S)  # PyDLL: the GIL held
        if die_at.get(step) == "ahead":  # once a worker waits, started ahead, for each local rank
            while len(glob.glob(os.path.join(out_dir, "warm_*"))) < local_world:
                time.sleep(0.01)
            die_at[step] = signal.SIGKILL
        if die_at.get(step) in ("pending", "stuck"):
            leave_pending(die_at.pop(step))
        elif step in barrier_at:
            barrier_at.discard(step)
            dist.barrier()
        if step in die_at and die_at[step] != "saved":
            os.kill(pid, die_at.pop(step))
        x, y = batch(step, rank, device)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        log.write(f"{step}\n")
        if saving:
            if die_at.get(step) == "saved":
                die_uncounted()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint.save(state, step)

    loop.run(train_step, steps)
    if "end" in die_at:
        os.kill(pid, die_at["end"])
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    write_json(
        os.path.join(out_dir, f"final_{rank}.json"),
        {
            "sha256": digest.hexdigest(),
            "pid": pid,
            "generation": loop.generation,
            "recoveries": loop.recoveries,
            "last_recovery": loop.last_recovery,
            "rank": loop.rank,
            "world": loop.world,
            "active": dlrun.recovery.active(),
        },
    )
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
