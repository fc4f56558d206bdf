"""Checkpoints held in memory by the node's dlrun agent (docs/guides/checkpoints.md).

    import dlrun.checkpoint as checkpoint

    found = checkpoint.load()          # every rank calls it: the job's newest step, or None
    start = 0
    if found:
        step, state = found
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = step + 1
    for step in range(start, steps):
        train(step)
        checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)

Under dlrun, save() copies the state's tensors into shared memory that the agent owns
(DLRUN_CHECKPOINT_SHM: one directory a node, removed when the agent ends) and returns as soon as
the copy is made; a thread of the worker then checksums the copy, marks it complete and counts it
in the job's store. A step is the job's once every rank's copy of it is complete. load(), called
by every rank alike, agrees through the store on the newest step that every rank holds whole
(its checksum checked: a corrupt copy is never loaded) and returns it, the same step everywhere.

A rank holds at most two steps: the newest complete one and the one being written (a save waits
for the previous step to be complete on every rank before it drops the one before that).

With dlrun's --checkpoint-dir (DLRUN_CHECKPOINT_DIR) the agent writes copies to that directory
(DIR/rank-R/step-S/, the same files as in memory): one step every --checkpoint-write-every
seconds while the job runs (the same on every rank: _write_if_named), and what is left as it
ends. load() finds a step there too: a job launched again goes on from it.

Preemption: should_stop(step), called by every rank once a step after its save, turns true at the
same step on every rank once any worker of the job got SIGTERM (dlrun stopping the job: a
signal to dlrun, scancel, a pod deleted, `dlrun stop`): the program returns, and that step is
the one a new launch loads.

Outside dlrun (no DLRUN_CHECKPOINT_SHM), save() is a torch.save to DLRUN_CHECKPOINT_DIR (or
`directory`), one file a rank and step, and load() the torch.load of this rank's newest one.
"""
import atexit
import glob
import json
import math
import mmap
import os
import pickle
import threading
import time
import zlib
from datetime import timedelta

from dlrun._job import say, store_client
from dlrun._tree import fill, hollow

__all__ = ["save", "load", "wait", "should_stop", "active"]

KEYS = "dlrun/checkpoint"  # under the attempt's key space of the job's store
ALIGN = 64  # each tensor's bytes start at a multiple of this
BLOCK = 4096  # the checksum's block; a copy's bytes are a whole number of them
COMPLETE_WAIT_S = 120  # a save waits so long for the previous step on every rank
POLL_S = 0.005
WRITE_WAIT_S = 30  # a slot asked to be written waits so long for the agent to take it


class CheckpointError(RuntimeError):
    """A save or load that cannot be done; its message says why in one line."""


def active():
    """Whether checkpoints go to a dlrun agent's memory."""
    return bool(os.environ.get("DLRUN_CHECKPOINT_SHM"))


def save(state, step, directory=None):
    """Saves `state` (dicts, lists and tuples of tensors and picklable values) as step `step` (an
    int, growing from save to save) of this rank."""
    if not active():
        return _disk_save(state, step, directory)
    return _memory().save(state, int(step))


def wait():
    """Waits until this rank's last save is complete (checksummed, counted in the store): before
    the program's end, say, or a step every rank must hold for sure."""
    if active():
        _memory().finish_completing()


def should_stop(step):
    """Whether the program should return now, `step` saved: true at the same step on every rank
    once dlrun is stopping the job (SIGTERM to a worker). Call it once a step, after the step's
    collectives and save. The first call makes SIGTERM this flag instead of the end."""
    _preemption.listen()
    if not active():
        return _preemption.asked
    return _memory().should_stop(int(step))


def load(directory=None):
    """(step, state) of the job's newest complete step, or None when there is none. Every rank
    calls it once an attempt (under dlrun the ranks agree on the step through the store), before
    its first save and after init_process_group. A replacement that joins the survivors in
    process (dlrun.recovery) gets its state from them, and None here: they do not load again."""
    if not active():
        return _disk_load(directory)
    if os.environ.get("DLRUN_RECOVERY_JOIN") == "1":
        return None
    return _memory().load()


class _Preemption:
    """SIGTERM as a request to stop, once the program asks should_stop()."""

    def __init__(self):
        self.asked = False
        self.listening = False

    def listen(self):
        if self.listening:
            return
        import signal
        try:
            signal.signal(signal.SIGTERM, self._asked)
        except ValueError:  # not the main thread: SIGTERM stays the end of the process
            return
        self.listening = True

    def _asked(self, signum, frame):
        self.asked = True


_preemption = _Preemption()


# --- outside dlrun: plain files ------------------------------------------------------------------

def _rank():
    return int(os.environ.get("RANK", "0"))


def _directory(directory):
    found = directory or os.environ.get("DLRUN_CHECKPOINT_DIR")
    if not found:
        raise CheckpointError("dlrun.checkpoint: outside dlrun, give a directory (directory= or "
                              "DLRUN_CHECKPOINT_DIR) to save and load checkpoints in")
    return found


def _disk_save(state, step, directory):
    import torch
    where = _directory(directory)
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"step-{int(step)}-rank-{_rank()}.pt")
    torch.save({"step": int(step), "state": state}, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)  # whole or not at all


def _disk_load(directory):
    import torch
    where = _directory(directory)
    steps = []
    for path in glob.glob(os.path.join(where, f"step-*-rank-{_rank()}.pt")):
        steps.append((int(os.path.basename(path).split("-")[1]), path))
    if not steps:
        return None
    saved = torch.load(max(steps)[1])
    return saved["step"], saved["state"]


# --- under dlrun: the agent's shared memory ------------------------------------------------------

_instance = None


def _memory():
    global _instance
    if _instance is None:
        _instance = _Memory(os.environ["DLRUN_CHECKPOINT_SHM"])
    return _instance


def _copy_in(data, tensors, layout):
    """Each tensor's bytes into `data` at its offset (from any device)."""
    import torch
    for t, (_, _, offset, nbytes) in zip(tensors, layout):
        if nbytes:
            view = torch.frombuffer(data, dtype=t.dtype, count=t.numel(), offset=offset)
            view.copy_(t.detach().reshape(-1))


def _checksum(data, meta):
    """A copy's checksum: Fletcher-like over the tensors' bytes as 64-bit words (a sum of each
    4 KiB block, and of those sums weighted by their place: any changed word, any moved block
    shows), at memory speed, and CRC-32 over the structure."""
    import torch
    if len(data) == 0 or len(data) % BLOCK:
        raise ValueError(f"a copy of {len(data)} bytes, not a whole number of {BLOCK}-byte blocks")
    words = torch.frombuffer(data, dtype=torch.int64).view(-1, BLOCK // 8)
    blocks = words.sum(dim=1)  # integer sums wrap: the same on every machine, in any order
    weighted = (blocks * torch.arange(1, len(blocks) + 1)).sum()
    return f"{int(blocks.sum()) & (2**64 - 1):016x}{int(weighted) & (2**64 - 1):016x}" \
           f"{zlib.crc32(meta):08x}"


class _Slot:
    """One of a rank's two places for a copy: `tensors` (the tensors' bytes, a file kept and
    rewritten in place: its memory is allocated once), `meta` (the structure, pickled) and
    `step` ("STEP CHECKSUM", written last, by a rename: the copy is whole once it exists)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.mapped = None  # (size, mmap) this process wrote through
        self.lent = False  # load() gave out tensors mapped from `tensors`: never rewritten

    def marked(self):
        """(step, checksum) of the whole copy here, None when there is none."""
        try:
            with open(os.path.join(self.path, "step")) as f:
                step, checksum = f.read().split()
            return int(step), checksum
        except (OSError, ValueError):
            return None

    def unmark(self):
        """The copy here no longer whole: once the agent, asked to write it to --checkpoint-dir,
        has read it (it takes the request within a tenth of a second, and holds `lock` shared
        while it reads)."""
        import fcntl
        deadline = time.monotonic() + WRITE_WAIT_S
        while os.path.exists(os.path.join(self.path, "write")) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        fd = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for name in ("step", "write"):
                try:
                    os.unlink(os.path.join(self.path, name))
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)  # and the lock with it

    def ask_write(self, step, world):
        """Asks the agent to write this copy to --checkpoint-dir (agents/checkpoint_flush.h)."""
        with open(os.path.join(self.path, "write.tmp"), "w") as f:
            f.write(f"{step} {world}\n")
        os.replace(os.path.join(self.path, "write.tmp"), os.path.join(self.path, "write"))

    def mark(self, step, checksum):
        with open(os.path.join(self.path, "step.tmp"), "w") as f:
            f.write(f"{step} {checksum}\n")
        os.replace(os.path.join(self.path, "step.tmp"), os.path.join(self.path, "step"))

    def writable(self, size):
        """The mapping of `tensors`, `size` bytes, for this save: the last one's when it has the
        size, else the file made anew (a file lent to loaded tensors keeps their pages)."""
        if not self.lent and self.mapped is not None and self.mapped[0] == size:
            return self.mapped[1]
        path = os.path.join(self.path, "tensors")
        if self.mapped is not None:
            self.mapped[1].close()
            self.mapped = None
        if self.lent and os.path.exists(path):
            os.unlink(path)  # the loaded tensors keep its pages; this save gets new ones
        self.lent = False
        with open(path, "ab+") as f:
            f.truncate(size)
            try:  # allocated now: a full /dev/shm is an error here, not a SIGBUS in the copy
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as error:
                raise CheckpointError(f"dlrun.checkpoint: {self.path} cannot hold {size / 2**20:.0f}"
                                      f" MiB ({error.strerror}): make /dev/shm larger (docker "
                                      "--shm-size, a tmpfs size) or save less") from None
            self.mapped = (size, mmap.mmap(f.fileno(), size))
        return self.mapped[1]

    def size(self):
        """The bytes its `tensors` holds now (a rewrite takes no more memory than the rest)."""
        try:
            return os.path.getsize(os.path.join(self.path, "tensors"))
        except OSError:
            return 0

    def lend(self):
        """(meta, the tensors' bytes mapped copy-on-write): loaded tensors of their own."""
        with open(os.path.join(self.path, "meta"), "rb") as f:
            meta = f.read()
        with open(os.path.join(self.path, "tensors"), "rb") as f:
            data = mmap.mmap(f.fileno(), os.fstat(f.fileno()).st_size, flags=mmap.MAP_PRIVATE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.lent = True
        return meta, data


class _Memory:
    """This rank's copies in the node's shared memory (two slots), and the job's record of them
    in the store of the attempt."""

    def __init__(self, root):
        self.root = root
        self._number(_rank(), int(os.environ["WORLD_SIZE"]))
        self.store = self._client()
        self.stop_store = None  # should_stop's: the completing thread uses `store` meanwhile
        self.completing = None  # the thread completing the last save
        # _number sets the rest: self.last, the last step saved by this process in its
        # numbering; self.complete, the newest step known complete on every rank, and
        # self.complete_on_disk, whether it was loaded from --checkpoint-dir; self.written,
        # self.written_step and self.named_at, of _write_if_named.
        self.loads = 0
        # --checkpoint-write-every: rank 0 names a step to write to --checkpoint-dir so often
        every = os.environ.get("DLRUN_CHECKPOINT_WRITE_EVERY")
        self.write_every = float(every) if every and os.environ.get("DLRUN_CHECKPOINT_DIR") else 0
        self.stop_at = None  # the step the job stops at, once agreed
        self.told = False  # this rank counted its SIGTERM in the store
        atexit.register(self.finish_completing)  # the last save is the job's even at the end

    def _number(self, rank, world):
        """This process as rank `rank` of `world`: its slots, and nothing known of the job's
        steps in that numbering yet."""
        self.rank, self.world = rank, world
        self.dir = os.path.join(self.root, f"rank-{rank}")
        self.slots = [_Slot(os.path.join(self.dir, f"slot-{i}")) for i in range(2)]
        self.last = self.complete = None
        self.complete_on_disk = False
        self.written, self.written_step, self.named_at = 0, -1, None

    def _follow_numbering(self):
        """In-process recovery renumbers the survivors of a lost node without a spare
        (dlrun.recovery sets RANK and WORLD_SIZE anew): from then on this process saves as its
        new rank, and a step is complete once the new world has it."""
        rank, world = _rank(), int(os.environ["WORLD_SIZE"])
        if (rank, world) != (self.rank, self.world):
            self.finish_completing()
            self._number(rank, world)

    def _client(self):
        return store_client(self.world, timedelta(seconds=COMPLETE_WAIT_S))

    # Stopping -------------------------------------------------------------------------------

    def should_stop(self, step):
        """True at the agreed step. The first rank to see a request (its own SIGTERM, or the
        count in the store) names the step after its own: no rank is past it, for a rank
        finishing that step met this one in its collectives after the name was written."""
        if self.stop_at is None:
            if self.stop_store is None:
                self.stop_store = self._client()
            tell = _preemption.asked and not self.told
            self.told = self.told or tell
            if self.stop_store.add(f"{KEYS}/stop-asked", 1 if tell else 0) > 0:
                self.stop_at = int(self.stop_store.compare_set(f"{KEYS}/stop-at", "",
                                                               str(step + 1)))
        if self.stop_at is None or step < self.stop_at:
            return False
        if step > self.stop_at:
            _say(f"step {step} is past step {self.stop_at}, where the job stops (should_stop() "
                 "not called every step): stopping here")
        return True

    # Saving ---------------------------------------------------------------------------------

    def save(self, state, step):
        self.finish_completing()
        self._follow_numbering()
        if self.last is not None and step <= self.last:
            raise CheckpointError(f"dlrun.checkpoint: step {step} saved after step {self.last}: "
                                  "steps must grow")
        if self.last is not None:
            self._await_complete(self.last)
        # The slot of the job's newest step stays; the other takes this one (an attempt's later
        # steps, a copy never completed, go).
        slot = self._free_slot()
        slot.unmark()
        tensors = []
        skeleton = hollow(state, tensors)
        layout, size = [], 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            layout.append((str(t.dtype).replace("torch.", ""), tuple(t.shape), size, nbytes))
            size += -(-nbytes // ALIGN) * ALIGN
        size = max(-(-size // BLOCK) * BLOCK, BLOCK)
        meta = pickle.dumps({"step": step, "skeleton": skeleton, "layout": layout})
        self._check_room(slot, size + len(meta))
        data = slot.writable(size)
        _copy_in(data, tensors, layout)
        with open(os.path.join(slot.path, "meta"), "wb") as f:
            f.write(meta)
        self.last = step
        # The checksum and the count in the store go on beside the training loop (torch's sums
        # release the GIL): the step is the job's once every rank's copy is whole.
        self.completing = threading.Thread(target=self._complete, args=(slot, step, data, meta),
                                           name="dlrun-checkpoint", daemon=True)
        self.completing.start()

    def _free_slot(self):
        """The slot this save may write: not the one holding the job's newest complete step (or,
        before any is known here, the newest step held: another rank may hold only that)."""
        marks = {slot: slot.marked() for slot in self.slots}
        if self.complete is not None:
            kept = [slot for slot, mark in marks.items() if mark and mark[0] == self.complete]
            if not kept and not self.complete_on_disk:
                raise CheckpointError(f"dlrun.checkpoint: this rank's copy of step "
                                      f"{self.complete}, the job's newest, is gone")
        else:
            held = [slot for slot, mark in marks.items() if mark]
            kept = [max(held, key=lambda slot: marks[slot][0])] if held else []
        return next(slot for slot in self.slots if slot not in kept)

    def _complete(self, slot, step, data, meta):
        try:
            slot.mark(step, _checksum(data, meta))
            if self.write_every:
                self._write_if_named(slot, step)
            if self.store.add(f"{KEYS}/saved/{step}/{self.rank}", 1) == 1:  # once a rank
                self.store.add(f"{KEYS}/saved/{step}", 1)
        except Exception as error:  # the step stays incomplete: the job's step stays older
            _say(f"step {step} could not be completed ({type(error).__name__}: {error})")

    def _write_if_named(self, slot, step):
        """The steps written to --checkpoint-dir while the job runs, the same on every rank.
        Rank 0 names one, every write_every seconds, two after the step it completes; each rank
        asks its agent to write the first step it completes at or past it (they save the same
        steps). Both before the step is counted: no rank completes a later step before rank 0
        named this one, and rank 0 names the next only once a step after the one written is
        complete, when every rank has read the name for that one."""
        key = f"{KEYS}/write-at"
        named = self.store.add(key, 0)
        if step >= named > self.written:
            self.written, self.written_step = named, step
            slot.ask_write(step, self.world)
        if (self.rank == 0 and named <= self.written and step > self.written_step
                and (self.named_at is None
                     or time.monotonic() - self.named_at >= self.write_every)):
            self.named_at = time.monotonic()
            self.store.add(key, step + 2 - named)

    def finish_completing(self):
        if self.completing is not None:
            self.completing.join()
            self.completing = None

    def _await_complete(self, step):
        """Waits until every rank's copy of `step` is complete."""
        deadline = time.monotonic() + COMPLETE_WAIT_S
        while self.complete is None or self.complete < step:
            if self.store.add(f"{KEYS}/saved/{step}", 0) >= self.world:
                self.complete, self.complete_on_disk = step, False
                return
            if time.monotonic() > deadline:
                raise CheckpointError(f"dlrun.checkpoint: step {step} is not complete on every "
                                      f"rank after {COMPLETE_WAIT_S} s")
            time.sleep(POLL_S)

    def _check_room(self, slot, needed):
        held = 0 if slot.lent else slot.size()  # rewritten in place: no more memory
        fs = os.statvfs(self.dir)
        free = fs.f_bavail * fs.f_frsize + held
        if needed > free:
            raise CheckpointError(
                f"dlrun.checkpoint: {os.path.dirname(self.dir)} has {free / 2**20:.0f} MiB free, "
                f"a copy of this rank's state needs {needed / 2**20:.0f} MiB: make /dev/shm "
                "larger (docker --shm-size, a tmpfs size) or save less")

    # Loading --------------------------------------------------------------------------------

    def load(self):
        """The newest step every rank holds whole: the ranks agree on the newest step they all
        marked, each checks its copy of it, and a step any rank finds corrupt is left out (it
        says so) and they agree again."""
        self.finish_completing()
        self._follow_numbering()
        held = {m[0]: (slot, m[1]) for slot in _on_disk(self.rank) if (m := slot.marked())}
        held.update({m[0]: (slot, m[1]) for slot in self.slots if (m := slot.marked())})
        self.loads += 1
        for turn in range(len(self.slots) + 1):
            keys = f"{KEYS}/load-{self.loads}/{turn}"
            common = set.intersection(*map(set, self._gather(f"{keys}/held", sorted(held))))
            if not common:
                return None
            step = max(common)
            slot, expected = held.pop(step)
            try:
                meta, data = slot.lend()
                whole = _checksum(data, meta) == expected
                why = "does not match its checksum"
            except (OSError, ValueError, RuntimeError) as error:  # cut short, missing, unmappable
                whole, why = False, f"cannot be read ({error})"
            if not whole:
                _say(f"step {step}'s copy {why}; not loaded")
            if all(self._gather(f"{keys}/whole", whole)):
                self.complete = self.last = step
                self.complete_on_disk = slot not in self.slots
                for later, (other, _) in held.items():  # an earlier attempt's, not the job's
                    if later > step and other in self.slots:
                        other.unmark()
                return step, _read(data, meta)
            # A rank's copy is not whole: the step is not the job's; the next newest, then.
        return None

    def _gather(self, keys, mine):
        """Every rank's value (JSON) set under `keys`, this rank's `mine` among them."""
        self.store.set(f"{keys}/{self.rank}", json.dumps(mine))
        values = []
        for rank in range(self.world):
            self.store.wait([f"{keys}/{rank}"])
            values.append(json.loads(self.store.get(f"{keys}/{rank}")))
        return values


def _on_disk(rank):
    """This rank's steps in --checkpoint-dir (DIR/rank-R/step-S, as the agent writes them)."""
    where = os.environ.get("DLRUN_CHECKPOINT_DIR")
    found = glob.glob(os.path.join(where, f"rank-{rank}", "step-*")) if where else []
    return [_Slot(path) for path in found if os.path.isdir(path)]


def _read(data, meta):
    """The state saved: its tensors views of `data`."""
    import torch
    saved = pickle.loads(meta)
    tensors = []
    for dtype, shape, offset, nbytes in saved["layout"]:
        kind = getattr(torch, dtype)
        count = math.prod(shape)
        flat = (torch.frombuffer(data, dtype=kind, count=count, offset=offset) if nbytes
                else torch.empty(0, dtype=kind))
        tensors.append(flat.view(shape))
    return fill(saved["skeleton"], tensors)


def _say(text):
    say("checkpoint", text)
