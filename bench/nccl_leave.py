"""What a survivor's leaving of a broken NCCL group costs, in parts: the in-process recovery's
"leave" phase on NCCL (python/dlrun/recovery.py), taken apart without dlrun.

Four ranks (processes of torch alone) all-reduce 4 MB on the node's GPUs (sharing one as NCCL
hosts of their own, over sockets on loopback, where there are fewer); rank 3 SIGKILLs itself at
its 50th all-reduce. Each survivor times, from its collective's failure: the group's abort
(`_abort_process_group`, as the loop's leave), the collection that frees it, a new group of
the three survivors, and that group's first all-reduce. A survivor that NCCL gives no error
(not a neighbour of the dead rank) is freed as the loop's step watch frees it: its group aborted
50 ms after another survivor said it failed, and the time to that is reported. Run once with
the watchdog aborting a failed communicator itself (TORCH_NCCL_ASYNC_ERROR_HANDLING=2, the
loop's setting) and once without (0: the abort is the survivor's alone).

Usage: python3 bench/nccl_leave.py            (a CUDA device and torch with NCCL)
"""

import gc
import os
import signal
import sys
import threading
import time
from datetime import timedelta

WORLD = 4
KILLED_AT = 50
GRACE_S = 0.05  # as dlrun.recovery's step watch


class Watch:
    """dlrun.recovery's step watch, reduced: a survivor NCCL gives no error (one that is not a
    neighbour of the dead rank) waits in its collective until the group's timeout; once another
    survivor said it failed, this aborts the group, after GRACE_S (the time from that failure
    to the freeing is reported)."""

    def __init__(self, port):
        self.lock = threading.Lock()
        self.failed = False
        self.freed_after = None
        threading.Thread(target=self._run, args=(port,), daemon=True).start()

    def _run(self, port):
        import torch.distributed as dist

        client = dist.TCPStore(
            "127.0.0.1", port, WORLD, False, timeout=timedelta(seconds=60), wait_for_workers=False
        )
        client.wait(["failed"], timedelta(seconds=600))
        seen = time.monotonic()
        time.sleep(GRACE_S)
        with self.lock:
            if not self.failed:
                dist.distributed_c10d._abort_process_group()
                self.freed_after = time.monotonic() - seen


def rank_main(rank, port, handling, results):
    import torch
    import torch.distributed as dist

    count = torch.cuda.device_count()
    if count < WORLD:
        os.environ["NCCL_HOSTID"] = f"nccl-leave-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.update(TORCH_NCCL_ASYNC_ERROR_HANDLING=handling, TORCH_NCCL_BLOCKING_WAIT="1")
    torch.cuda.set_device(rank % count)
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=timedelta(seconds=60))
    timeout = timedelta(seconds=30)
    dist.init_process_group(
        "nccl", store=dist.PrefixStore("old", store), rank=rank, world_size=WORLD, timeout=timeout
    )
    watch = Watch(port)
    data = torch.ones(1 << 20, device="cuda")
    for i in range(10 * KILLED_AT):
        if i == KILLED_AT and rank == WORLD - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(data)
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001  (any failure of the collective: a peer's loss)
            break
    else:
        results.put((rank, None))
        return
    times = [time.monotonic()]
    with watch.lock:
        watch.failed = True
        if dist.is_initialized():  # not aborted by the watch already
            dist.distributed_c10d._abort_process_group()
    store.add("failed", 1)
    times.append(time.monotonic())
    gc.collect()
    times.append(time.monotonic())
    dist.init_process_group(
        "nccl",
        store=dist.PrefixStore("new", store),
        rank=rank,
        world_size=WORLD - 1,
        timeout=timeout,
    )
    times.append(time.monotonic())
    data.fill_(1)
    dist.all_reduce(data)
    torch.cuda.synchronize()
    times.append(time.monotonic())
    parts = [b - a for a, b in zip(times, times[1:])]
    results.put((rank, parts + [data[0].item(), watch.freed_after]))
    dist.destroy_process_group()


def run(handling, port):
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(target=rank_main, args=(rank, port, handling, results))
        for rank in range(WORLD)
    ]
    for process in ranks:
        process.start()
    got = []
    deadline = time.monotonic() + 120
    while len(got) < WORLD - 1 and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=5))
        except Exception:  # noqa: BLE001  (queue.Empty: look at the deadline again)
            if not any(process.is_alive() for process in ranks):
                break
    for process in ranks:
        process.kill()
        process.join()
    print(f"TORCH_NCCL_ASYNC_ERROR_HANDLING={handling}:")
    for rank, parts in sorted(got):
        if parts is None:
            print(f"  rank {rank}: its all-reduces never failed")
            continue
        abort, collect, group, first, total, freed_after = parts
        how = (
            f"freed by the watch {freed_after:.3f} s after the first failure"
            if freed_after is not None
            else "its collective failed"
        )
        print(
            f"  rank {rank}: {how}; abort {abort:.3f} s, gc {collect:.3f} s, new group "
            f"{group:.3f} s, first all-reduce {first:.3f} s (sum {total:g}, {WORLD - 1} expected)"
        )
    return len(got) == WORLD - 1 and all(p and p[-2] == WORLD - 1 for _, p in got)


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main():
    import torch

    if not torch.cuda.is_available():
        print("nccl_leave: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    ok = True
    for handling in ("2", "0"):
        ok = run(handling, free_port()) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
