"""One rank of bench/checkpoint_bench.sh, under dlrun: what a checkpoint costs, dlrun.checkpoint
in the node's memory against torch.save and torch.load to local disk, in the same process.

Usage: checkpoint_worker.py OUT_DIR MEGABYTES STEPS [lose:RANK] [device:DEVICE]

The state: MEGABYTES of float32 in 16 tensors, half "model", half "optimizer". Per step, each of
STEPS: torch.save of the state to OUT_DIR (local disk, page cache as a user's save), then
dlrun.checkpoint.save; the time each blocks the caller, and for dlrun.checkpoint the time from
its return to the copy complete (checksummed and counted; wait()). Then torch.load of the file
and dlrun.checkpoint.load() (every rank: the job's newest step from memory, checksums checked),
each after a gloo barrier: the ranks start a load together, as after a restart.
Writes OUT_DIR/rank_<RANK>.json with each measurement's seconds.

With device:cuda the state lives on the rank's GPU, as a GPU job's does: torch.save and save copy
it from there, torch.load puts it back there, and load() is timed with its tensors moved there
(what a GPU job's load_state_dict then does); each time waits for the GPU.

With lose:RANK (several nodes, simulated hosts that share the machine's /dev/shm:
bench/checkpoint_hosts.py), each step also waits until its copy is held by the peer node's agent
("peer": seconds from save's return), and the ranks meet in a gloo barrier after each step. After
the last step RANK writes OUT_DIR/lose_host (each rank wrote OUT_DIR/pid_<RANK> at its start) and
stops itself for its host to be killed; in the
next attempt every rank times load() ("restore", and whether its node held the step: "local")
and torch.load of its file, and writes OUT_DIR/restored_<RANK>.json.
"""

import glob
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import dlrun.checkpoint as checkpoint  # dlrun puts its package on PYTHONPATH

TENSORS = 16
PEER_WAIT_S = 60


def timed(fn):
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def on(device, value):
    """`value` (what load() returns: the step and the state) with its tensors on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: on(device, v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(on(device, v) for v in value)
    return value


def held_by_peer(rank, step):
    return glob.glob(f"/dev/shm/dlrun-checkpoints.*/peer/rank-{rank}/step-{step}/step")


def held_here(rank, step):
    memory = os.environ["DLRUN_CHECKPOINT_SHM"]
    return any(
        Path(mark).read_text().split()[0] == str(step)
        for mark in glob.glob(f"{memory}/rank-{rank}/slot-*/step")
        + glob.glob(f"{memory}/peer/rank-{rank}/step-*/step")
    )


def restore(out, rank, steps, path):
    """The attempt after the host loss: load() timed against torch.load."""
    local = held_here(rank, steps - 1)
    took, found = timed(checkpoint.load)
    torch_took = timed(lambda: torch.load(path))[0]
    with open(os.path.join(out, f"restored_{rank}.json"), "w") as f:
        json.dump(
            {"restore": took, "torch_load": torch_took, "local": local, "step": found and found[0]},
            f,
        )
    return 0


def main():
    out, megabytes, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    options = dict(arg.split(":", 1) for arg in sys.argv[4:])
    lose = int(options["lose"]) if "lose" in options else None
    device = torch.device(options.get("device", "cpu"))
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    path = os.path.join(out, f"rank{rank}.pt")
    dist.init_process_group("gloo")
    if lose is not None:
        if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0":
            return restore(out, rank, steps, path)
        with open(os.path.join(out, f"pid_{rank}"), "w") as f:
            json.dump(os.getpid(), f)  # which host to kill
    each = int(megabytes * 2**20 / 4 / TENSORS)
    g = torch.Generator().manual_seed(rank)
    tensors = [torch.randn(each, generator=g).to(device) for _ in range(TENSORS)]
    state = {
        "model": {f"w{i}": t for i, t in enumerate(tensors[: TENSORS // 2])},
        "optimizer": {
            "state": {i: {"momentum": t} for i, t in enumerate(tensors[TENSORS // 2 :])},
            "lr": 0.1,
        },
    }
    found = checkpoint.load()
    assert found is None, "a fresh job finds no checkpoint"
    runs = {"torch_save": [], "save": [], "complete": [], "peer": [], "torch_load": [], "load": []}
    for step in range(steps):
        for t in tensors:
            t.add_(1.0)  # a training step's change
        runs["torch_save"].append(timed(lambda: torch.save(state, path))[0])
        runs["save"].append(timed(lambda: checkpoint.save(state, step))[0])
        start = time.perf_counter()
        checkpoint.wait()
        runs["complete"].append(time.perf_counter() - start)
        if lose is not None:
            while not held_by_peer(rank, step):
                if time.perf_counter() - start > PEER_WAIT_S:
                    raise RuntimeError(f"step {step}'s copy reached no peer in {PEER_WAIT_S} s")
                time.sleep(0.001)
            runs["peer"].append(time.perf_counter() - start)
            dist.barrier()
    if lose is not None:
        with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
            json.dump(runs, f)
        if rank == lose:
            open(os.path.join(out, "lose_host"), "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.barrier()  # the lost host's ranks never come: this attempt ends in its failure
        return 1
    for _ in range(3):
        dist.barrier()  # the ranks start each load together, as after a restart
        runs["torch_load"].append(timed(lambda: torch.load(path))[0])
        dist.barrier()
        took, found = timed(lambda: on(device, checkpoint.load()))
        runs["load"].append(took)
        assert found[0] == steps - 1 and torch.equal(found[1]["model"]["w0"], tensors[0])
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(runs, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
