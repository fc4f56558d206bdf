"""A save whose copy is made beside the next step (dlrun.checkpoint.save(..., overlap=True)).

A step's forward and backward leave the parameters and the optimizers' state as they are: only
an optimizer's step() changes them. So save() may return before they are copied, and every
optimizer's next step() waits for the copy (torch 2's hook on every optimizer's step). What an
optimizer does not own (a BatchNorm's running statistics, which forward updates; a tensor of the
program's own) is cloned at once. Each tensor copied later has its version counter (torch counts
every in-place change) read at save() and again by the loop's thread before an optimizer steps,
the copy made: a tensor changed meanwhile makes the copy torn, the caller does not count it, and
this process's later saves copy at once. A change through `.data` or NumPy escapes the counter:
the guide says so.

The copy itself (dlrun's module) is made in chunks by a thread of idle priority: it takes only
cycles nothing else of the machine wants. An optimizer that must step before it is done, or a
save or wait() that needs it, takes the chunks left itself: never slower than a copy at once.
"""

import os
import queue
import threading
import weakref

from dlrun._copies import BLOCK, _address, _native, copy_in, readable

_seen = weakref.WeakSet()  # the optimizers that stepped since the hook was put in
_hooked = False
_off = False  # a copy of this process was torn: its later saves copy at once
_current = None  # the Pending of the last save beside the loop, until its check is made
CHUNK = 1 << 20  # bytes of a copy claimed at a time


def available(tensors):
    """Whether a save of `tensors` can overlap: torch 2's hook on every optimizer's step, every
    tensor in CPU memory (a GPU's copy waits for a stream: not yet done beside), and no copy of
    this process torn before."""
    global _hooked
    if _off:
        return False
    if not _hooked:
        from torch.optim import optimizer

        if not hasattr(optimizer, "register_optimizer_step_pre_hook"):
            return False
        optimizer.register_optimizer_step_pre_hook(_before_step)
        _hooked = True
    return all(t.device.type == "cpu" for t in tensors)


class Pending:
    """One save's tensors on their way: as the copy reads them (an optimizer's own as they are,
    the others cloned now), the versions of the former then, and the copy's two moments: `made`
    (the copy's thread: every chunk made, or no copy at all) and `checked` (the thread of the
    loop: no tensor changed by then, `torn` otherwise)."""

    def __init__(self, tensors):
        global _current
        owned = _owned()
        self.tensors, self.versions = [], []
        for t in tensors:
            mine = owned.get(t.data_ptr()) == _storage_bytes(t)
            self.tensors.append(t if mine else t.detach().clone())
            self.versions.append(t._version if mine else None)
        self.made, self.checked = threading.Event(), threading.Event()
        self.torn = False
        self.chunked = None  # the copy in chunks, once begun
        self.hurried = False  # the loop waits: the copy's thread makes the chunks itself
        _current = self

    def hurry(self):
        """Makes what is left of the copy here, or has the copy's thread make it."""
        chunked = self.chunked
        if chunked is None:
            self.hurried = True
            chunked = self.chunked  # begun meanwhile: its thread may have missed the word
        if chunked is not None:
            chunked.work()


def check():
    """In the loop's thread, before an optimizer steps (and before a save or wait() waits for the
    last one): waits for the copy, then compares each tensor's version with the one it had at
    save(). Every in-place change the loop made before this has its version counted by now."""
    global _current, _off
    pending = _current
    if pending is None:
        return
    pending.hurry()
    pending.made.wait()
    pending.torn = any(
        v is not None and t._version != v for t, v in zip(pending.tensors, pending.versions)
    )
    _off = _off or pending.torn
    _current = None
    pending.checked.set()


def _before_step(optimizer, args, kwargs):
    check()
    _seen.add(optimizer)


class _Chunked:
    """One copy (copy_in's, through the module) cut into chunks of whole blocks, each claimed
    once, by the copier or by a thread that cannot wait for it."""

    def __init__(self, native, data, tensors, layout):
        import torch

        self.native = native
        self.sources = readable(tensors)
        chunks = [[] for _ in range(-(-len(data) // CHUNK))]
        for s, (_, _, offset, nbytes) in zip(self.sources, layout):
            at, end = offset, offset + nbytes
            while at < end:  # the tensor's bytes in each chunk they cross
                chunk = at // CHUNK
                upto = min(end, (chunk + 1) * CHUNK)
                chunks[chunk].append((s.data_ptr() + at - offset, at - chunk * CHUNK, upto - at))
                at = upto
        self.chunks = [
            (i * CHUNK, min((i + 1) * CHUNK, len(data)), torch.tensor(c, dtype=torch.int64))
            for i, c in enumerate(chunks)
        ]
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
            made = False
            try:
                made = self.native.dlrun_checkpoint_copy_in(
                    self.at + start,
                    end - start,
                    pieces.data_ptr(),
                    len(pieces),
                    self.sums.data_ptr() + start // BLOCK * self.sums.element_size(),
                )
            finally:  # counted made or not, whatever stops this thread (a KeyboardInterrupt)
                with self.changed:
                    self.failed = self.failed or not made
                    self.done += 1
                    self.changed.notify_all()

    def wait(self):
        with self.changed:
            self.changed.wait_for(lambda: self.done == len(self.chunks))
        if self.failed:
            raise ValueError("a copy's layout does not fit its chunks")


_work = queue.SimpleQueue()  # for the copier
_copier = None


def copy(pending, data, layout):
    """copy_in of the tensors `pending` holds, by the copier (idle priority) while this thread
    waits, unless the loop is waiting: the block sums. Sets `pending.made` however it ends."""
    global _copier
    try:
        native = _native()
        if not native:
            return copy_in(data, pending.tensors, layout)
        chunked = _Chunked(native, data, pending.tensors, layout)
        if _copier is None:
            _copier = threading.Thread(
                target=_copy_chunks, name="dlrun-checkpoint-copy", daemon=True
            )
            _copier.start()
        pending.chunked = chunked
        _work.put(chunked)
        if pending.hurried:
            chunked.work()
        chunked.wait()
        return chunked.sums
    finally:
        pending.made.set()


def _copy_chunks():
    """The copier. SCHED_IDLE (Linux; any thread may lower its own priority): it runs where a
    core would otherwise idle; Pending.hurry() is what bounds a wait for it."""
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
            owned[t.data_ptr()] = _storage_bytes(t)
    return owned


def _storage_bytes(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).nbytes()
