"""The process group of one generation of dlrun.recovery's loop: made in the generation's key
space of the job's store, left (destroyed, its connections shut down, an NCCL group aborted
first) and, for the step watch, failed under a rank that waits in it."""

import gc
import os
import threading
from datetime import timedelta

from dlrun._job import say, store_client
from dlrun._stuck import shut_down, sockets

CLOSE_S = 0.5  # an old group's unregistering, then its destruction, is waited for so long
LOOK_S = 0.5  # a forming group's watch looks so often


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

    def form(self, store, keys, rank, world, timeout, watch=None):
        """The group of a generation (`keys`: its keys), in a key space of its own. `watch`:
        (look, the store's sockets), where a member may never come (a node lost as the group
        forms, its ranks met already): while the group forms, a thread looks every LOOK_S on a
        client of its own; once look(client) finds something (the survivors' move to a round
        that kept them), it shuts the store's connection down, which fails a formation that
        waits in the store for a rank's address (gloo's; one that waits on a connection to a
        host gone silent waits for its timeout), and form returns what it found, the store's
        connection shut and the group, should it have formed after all, left. Else None."""
        import torch.distributed as dist

        prefixed = dist.PrefixStore(f"{keys}/group", store)
        before = sockets()
        found, formed, failure = [], threading.Event(), None
        watching = None
        if watch:
            watching = threading.Thread(
                target=_watch_forming,
                args=(*watch, world, formed, found),
                name="dlrun-watch-forming",
                daemon=True,
            )
            watching.start()
        try:
            dist.init_process_group(
                self.backend, store=prefixed, rank=rank, world_size=world, timeout=timeout
            )
        except Exception as error:
            failure = error
            if dist.is_initialized():  # torch 1.13 registers it before its store barrier
                dist.destroy_process_group()
            # The next group is named as a fresh process's first (torch counts the groups it
            # made, this one too; a newcomer's count is 0): the one named after it never forms.
            dist.distributed_c10d._group_count = 0
        finally:
            formed.set()
            if watching:  # a look under way may still find the move and shut the store down
                watching.join()
        # Made as the group formed: its backend's connections.
        self._sockets = {
            fd: inode for fd, inode in sockets().items() if inode not in before.values()
        }
        if found:
            if dist.is_initialized():
                dist.destroy_process_group()  # just made: nothing runs on it yet
            return found[0]
        if failure is not None:
            raise failure
        return None

    def leave(self, exit_replaced):
        """Takes the group out of torch's registry at once and leaves its destruction to a thread
        of its own (_end), which nothing of the new group waits on: gloo's destruction waits a
        tick of its event loop (10 ms) for each connection. The destruction closes the group's
        connections, and a peer still waiting on this rank fails then, not at the group's
        timeout; where it has not ended within CLOSE_S (on torch 2.13 a gloo collective still
        pending on a live peer, DDP's next bucket under way as the previous one failed, holds
        it until the collective's timeout) or left them open (torch 1.13), they are shut down
        (gloo has no abort). Not sooner: a peer's all-reduce queued after the shut-down waits
        in its receive, never told, until its timeout. Should torch not even unregister the
        group within CLOSE_S twice, exit_replaced(why) ends this rank, which closes every socket
        it has, and its agent starts a replacement in its place (it has not met the new
        generation)."""
        import torch.distributed as dist

        held = []  # the group's last reference, dropped by _end

        def unregister():
            self.abort()  # nothing waits on its collective as the group goes
            if dist.is_initialized():
                held.append(dist.distributed_c10d._get_default_group())
                dist.destroy_process_group()

        # A thread: should torch's unregistering block after all, it is not waited for long.
        closing = threading.Thread(target=unregister, name="dlrun-leave-group", daemon=True)
        closing.start()
        closing.join(CLOSE_S)
        group_sockets, self._sockets = self._sockets, {}
        if closing.is_alive():
            shut_down(group_sockets)  # the peers waiting on this rank are freed meanwhile
            closing.join(CLOSE_S)
            if dist.is_initialized():
                exit_replaced(f"the old process group was still registered after {2 * CLOSE_S:g} s")
        ending = threading.Thread(
            target=_end, args=(held, group_sockets), name="dlrun-end-group", daemon=True
        )
        ending.start()

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


def _watch_forming(look, store_sockets, world, formed, found):
    """form's watch: looks every LOOK_S until the group formed; what it finds goes to `found`,
    and the formation's store connection (`store_sockets`) is shut down."""
    client = None
    while not formed.wait(LOOK_S):
        try:
            if client is None:
                client = store_client(world, timedelta(seconds=4 * LOOK_S))
            seen = look(client)
        except RuntimeError:  # the store out of reach: the formation's own wait says so
            client = None
            continue
        if seen:
            found.append(seen)
            shut_down(store_sockets)
            return


def _end(held, group_sockets):
    """Destroys the old group, then shuts down what is left of its connections
    (`group_sockets`), at the latest CLOSE_S on. `held`: the group's last reference, dropped
    once the collection freed the DDP around it, so that the destruction runs in torch's
    deallocation of the group, which releases the GIL."""

    def destroy():
        gc.collect()
        held.clear()

    destroying = threading.Thread(target=destroy, name="dlrun-destroy-group", daemon=True)
    destroying.start()
    destroying.join(CLOSE_S)
    if destroying.is_alive():
        say(
            "recovery",
            f"the old process group did not end within {CLOSE_S:g} s (a collective pending); "
            "its connections shut down, it ends in the background",
        )
    shut_down(group_sockets)


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
