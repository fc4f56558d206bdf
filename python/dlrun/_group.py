"""The process group of one generation of dlrun.recovery's loop: made in the generation's key
space of the job's store, left (destroyed, its connections shut down, an NCCL group aborted
first) and, for the step watch, failed under a rank that waits in it."""

import gc
import os
import threading

from dlrun._job import say
from dlrun._stuck import shut_down, sockets

CLOSE_S = 0.5  # an old group's destruction is waited for so long (leave); 0.05 s usual


class Group:
    """The loop's process group over `backend`, and the connections it made (under dlrun)."""

    def __init__(self, backend):
        self.backend = backend
        self._sockets = {}  # {fd: inode}: the group's own, which leave() may shut down

    def device(self):
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def form(self, store, keys, rank, world, timeout):
        """The group of a generation (`keys`: its keys), in a key space of its own."""
        import torch.distributed as dist

        prefixed = dist.PrefixStore(f"{keys}/group", store)
        before = sockets()
        dist.init_process_group(
            self.backend, store=prefixed, rank=rank, world_size=world, timeout=timeout
        )
        # Made as the group formed: its backend's connections.
        self._sockets = {
            fd: inode for fd, inode in sockets().items() if inode not in before.values()
        }

    def leave(self, exit_replaced):
        """Destroys the group and shuts its connections down (gloo has no abort): a peer still
        waiting on this rank fails at once, not at the group's timeout (torch 1.13 keeps a
        destroyed group's connections open). On torch 2.13 a gloo collective still pending on a
        live peer (DDP's next bucket, under way as the previous one failed) holds the group's
        destruction until the collective's timeout: past CLOSE_S its connections are shut down,
        and once the group has left torch's registry its destruction goes on in the background
        (nothing of the new group waits on it). Should it still be registered after another
        CLOSE_S, exit_replaced(why) ends this rank, which closes every socket it has, and its
        agent starts a replacement in its place (it has not met the new generation)."""
        import torch.distributed as dist

        def close():
            gc.collect()
            self.abort()  # nothing waits on its collective as the group goes
            if dist.is_initialized():
                dist.destroy_process_group()
            gc.collect()

        # A thread: the destruction may block for the collective's timeout, which is not waited.
        closing = threading.Thread(target=close, name="dlrun-leave-group", daemon=True)
        closing.start()
        closing.join(CLOSE_S)
        stuck = closing.is_alive()
        shut_down(self._sockets)
        self._sockets = {}
        if not stuck:
            return
        late = f"the old process group did not close within {CLOSE_S:g} s (a collective pending)"
        if not dist.is_initialized():  # out of torch's registry: the new group is not held up
            say("recovery", f"{late}; its connections shut down, it ends in the background")
            return
        closing.join(CLOSE_S)
        if dist.is_initialized():
            exit_replaced(late)

    def fail(self):
        """Fails the collective this rank may wait in: an NCCL group aborted, the connections
        shut down."""
        self.abort()
        shut_down(self._sockets)

    def abort(self):
        """Aborts an NCCL group: a communicator with a dead peer never ends its collective, nor
        can it be destroyed (a gloo group ends as its connections close)."""
        import torch.distributed as dist

        if self.backend == "nccl" and dist.is_initialized():
            dist.distributed_c10d._abort_process_group()


def prepare_nccl(optimizer, world):
    """What a recovery needs of NCCL, set before the first group. The watchdog aborts a failed
    communicator and keeps the process (dlrun's workers get 1: the process ends, and a survivor
    would end with its peer). A collective cut short by an abort leaves its result partial: the
    program's own collectives wait and raise then (blocking wait; an all-reduced stop flag would
    otherwise read as anything), and the optimizer checks its step's collectives first (DDP's do
    not wait on the CPU: a step on a dead peer's gradients would count as done with weights no
    other rank holds). `world()`: the world size now (a lost node's survivors are renumbered)."""
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        os.environ[name] = "2"  # read as each group is made
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
    optimizer.register_step_pre_hook(lambda *_: _check_collectives(world()))


def _check_collectives(world):
    """Raises unless every collective this rank queued so far completed: a one-element
    all-reduce queued after them, waited for, sums to the world size only then."""
    import torch
    import torch.distributed as dist

    flag = torch.ones(1, device=torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(flag)
    if flag.item() != world:
        raise RuntimeError("NCCL: the step's collectives did not complete (a peer failed)")
