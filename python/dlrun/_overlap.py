"""A save whose copy is made beside the next step (dlrun.checkpoint.save(..., overlap=True)).

A step's forward and backward leave the parameters and the optimizers' state as they are: only
an optimizer's step() changes them. So save() may return before they are copied, and every
optimizer's next step() waits for the copy (torch 2's hook on every optimizer's step). What an
optimizer does not own (a BatchNorm's running statistics, which forward updates; a tensor of the
program's own) is cloned at once. Each tensor copied later has its version counter (torch counts
every in-place change) read at save() and again after the copy: a tensor changed meanwhile makes
the copy torn, and the caller does not count it. A change through `.data` or NumPy escapes the
counter: the guide says so.

The copy itself (dlrun's module) is made in chunks by a thread of idle priority: it takes only
cycles nothing else of the machine wants. An optimizer that must step before it is done, or a
save or wait() that needs it, takes the chunks left itself: never slower than a copy at once.
"""

import os
import queue
import threading
import weakref

from dlrun._copies import BLOCK, _address, _native, copy_in

_seen = weakref.WeakSet()  # the optimizers that stepped since the hook was put in
_hooked = False
copied = threading.Event()  # no copy waits to be made: an optimizer may step
copied.set()


def available(tensors):
    """Whether a save of `tensors` can overlap: torch 2's hook on every optimizer's step, and
    every tensor in CPU memory (a GPU's copy waits for a stream: not yet done beside)."""
    global _hooked
    if not _hooked:
        from torch.optim import optimizer

        if not hasattr(optimizer, "register_optimizer_step_pre_hook"):
            return False
        optimizer.register_optimizer_step_pre_hook(_before_step)
        _hooked = True
    return all(t.device.type == "cpu" for t in tensors)


def _before_step(optimizer, args, kwargs):
    hurry()
    copied.wait()
    _seen.add(optimizer)


def hold(tensors):
    """(`tensors` as the copy will read them, the versions to check after it): those an
    optimizer that stepped owns (its parameters and state) as they are, the others cloned
    now."""
    owned = _owned()
    held, versions = [], []
    for t in tensors:
        mine = owned.get(t.data_ptr()) == t.untyped_storage().nbytes()
        held.append(t if mine else t.detach().clone())
        versions.append(t._version if mine else None)
    return held, versions


def changed(tensors, versions):
    """Whether any tensor held as it was changed in place since hold()."""
    return any(v is not None and t._version != v for t, v in zip(tensors, versions))


CHUNK = 1 << 20  # bytes of a copy claimed at a time


class _Chunked:
    """One copy (copy_in's, through the module) cut into chunks of whole blocks, each claimed
    once, by the copier or by a thread that cannot wait for it."""

    def __init__(self, native, data, tensors, versions, layout):
        import torch

        self.native, self.tensors, self.versions = native, tensors, versions
        self.torn = None  # once every chunk is made: whether a tensor changed meanwhile
        # Their bytes as they read: conjugate and negative views resolved, strides made
        # contiguous (copy_in's _copy_in_native does the same).
        self.sources = [t.detach().resolve_conj().resolve_neg().contiguous() for t in tensors]
        whole = [
            (s.data_ptr(), offset, nbytes)
            for s, (_, _, offset, nbytes) in zip(self.sources, layout)
            if nbytes
        ]
        self.chunks = []
        for start in range(0, len(data), CHUNK):
            end = min(start + CHUNK, len(data))
            pieces = [
                (
                    at + max(offset, start) - offset,
                    max(offset, start) - start,
                    min(offset + nbytes, end) - max(offset, start),
                )
                for at, offset, nbytes in whole
                if offset < end and offset + nbytes > start
            ]
            self.chunks.append((start, end, torch.tensor(pieces, dtype=torch.int64).reshape(-1, 3)))
        self.sums = torch.empty(len(data) // BLOCK, dtype=torch.int64)
        self.data = data  # mapped while the copy is made: its address is all the module gets
        with _address(data) as at:
            self.at = at
        self.claimed = self.done = 0
        self.failed = False
        self.changed = threading.Condition()

    def work(self):
        """Makes chunks until none is left to claim."""
        while True:
            with self.changed:
                if self.claimed == len(self.chunks):
                    return
                start, end, pieces = self.chunks[self.claimed]
                self.claimed += 1
            made = self.native.dlrun_checkpoint_copy_in(
                self.at + start,
                end - start,
                pieces.data_ptr(),
                len(pieces),
                self.sums.data_ptr() + start // BLOCK * self.sums.element_size(),
            )
            with self.changed:
                self.failed = self.failed or not made
                self.done += 1
                if self.done == len(self.chunks):
                    # Checked by the thread making the last chunk, before any optimizer steps.
                    self.torn = changed(self.tensors, self.versions)
                    copied.set()
                self.changed.notify_all()

    def wait(self):
        with self.changed:
            self.changed.wait_for(lambda: self.done == len(self.chunks))
        if self.failed:
            raise ValueError("a copy's layout does not fit its chunks")


_pending = None  # the _Chunked copy being made
_work = queue.SimpleQueue()  # for the copier
_copier = None


def copy(data, tensors, versions, layout):
    """copy_in of tensors held by hold(), the module's copy made by the copier (idle priority)
    while this thread waits: (the block sums, whether a tensor changed meanwhile). An optimizer
    may step once it returns (`copied`)."""
    global _pending, _copier
    native = _native()
    if not native:
        sums = copy_in(data, tensors, layout)
        torn = changed(tensors, versions)
        copied.set()
        return sums, torn
    chunked = _Chunked(native, data, tensors, versions, layout)
    if _copier is None:
        _copier = threading.Thread(target=_copy_chunks, name="dlrun-checkpoint-copy", daemon=True)
        _copier.start()
    _pending = chunked
    _work.put(chunked)
    try:
        chunked.wait()
    finally:
        _pending = None
    return chunked.sums, chunked.torn


def hurry():
    """Makes what is left of the copy being made, here and now, and waits for it."""
    pending = _pending
    if pending is not None:
        pending.work()
        pending.wait()


def _copy_chunks():
    """The copier. SCHED_IDLE (Linux; any thread may lower its own priority): it runs where a
    core would otherwise idle; hurry() is what bounds a wait for it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass  # at the usual priority: a copy beside the loop all the same
    while True:
        _work.get().work()


def _owned():
    """{data_ptr: the storage's bytes} of every parameter and state tensor of the optimizers
    seen stepping."""
    import torch

    owned = {}
    for optimizer in list(_seen):
        tensors = [p for group in optimizer.param_groups for p in group["params"]]
        tensors += [
            v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
        ]
        for t in tensors:
            owned[t.data_ptr()] = t.untyped_storage().nbytes()
    return owned
