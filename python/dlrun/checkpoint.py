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

Outside dlrun (no DLRUN_CHECKPOINT_SHM), save() is a torch.save to DLRUN_CHECKPOINT_DIR (or
`directory`), one file a rank and step, and load() the torch.load of this rank's newest one.
"""
import atexit
import glob
import json
import mmap
import os
import pickle
import shutil
import threading
import time
import zlib
from datetime import timedelta

from dlrun._tree import fill, hollow

__all__ = ["save", "load", "wait", "active"]

KEYS = "dlrun/checkpoint"  # under the attempt's key space of the job's store
ALIGN = 64  # each tensor's bytes start at a multiple of this
COMPLETE_WAIT_S = 120  # a save waits so long for the previous step on every rank
POLL_S = 0.005


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


def load(directory=None):
    """(step, state) of the job's newest complete step, or None when there is none. Every rank
    calls it (under dlrun the ranks agree on the step through the store), before its first
    save."""
    if not active():
        return _disk_load(directory)
    return _memory().load()


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


def _step_dirs(rank_dir):
    """{step: path} of the complete copies in a rank's directory."""
    found = {}
    for path in glob.glob(os.path.join(rank_dir, "step-*")):
        found[int(os.path.basename(path)[len("step-"):])] = path
    return found


def _copy_in(data, tensors, layout):
    """Each tensor's bytes into `data` at its offset (from any device)."""
    import torch
    for t, (_, _, offset, nbytes) in zip(tensors, layout):
        if nbytes:
            view = torch.frombuffer(data, dtype=t.dtype, count=t.numel(), offset=offset)
            view.copy_(t.detach().reshape(-1))


def _checksum(data, meta):
    return f"{zlib.crc32(meta, zlib.crc32(data)):08x}"


class _Memory:
    """This rank's copies in the node's shared memory, and the job's record of them in the store
    of the attempt."""

    def __init__(self, root):
        import torch.distributed as dist
        self.rank, self.world = _rank(), int(os.environ["WORLD_SIZE"])
        self.dir = os.path.join(root, f"rank-{self.rank}")
        os.makedirs(self.dir, exist_ok=True)
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                   self.world, False, timedelta(seconds=COMPLETE_WAIT_S),
                                   wait_for_workers=False)
        self.completing = None  # the thread completing the last save
        self.last = None  # the last step saved by this process
        self.complete = None  # the newest step known complete on every rank
        self.loads = 0
        atexit.register(self.finish_completing)  # the last save is the job's even at the end

    # Saving ---------------------------------------------------------------------------------

    def save(self, state, step):
        self.finish_completing()
        if self.last is not None and step <= self.last:
            raise CheckpointError(f"dlrun.checkpoint: step {step} saved after step {self.last}: "
                                  "steps must grow")
        if self.last is not None:
            self._await_complete(self.last)
        for old, path in _step_dirs(self.dir).items():  # an attempt's later steps included
            if old != self.complete:
                shutil.rmtree(path, ignore_errors=True)
        self._drop_partials()
        tensors = []
        skeleton = hollow(state, tensors)
        layout, size = [], 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            layout.append((str(t.dtype).replace("torch.", ""), tuple(t.shape), size, nbytes))
            size += -(-nbytes // ALIGN) * ALIGN
        meta = pickle.dumps({"step": step, "skeleton": skeleton, "layout": layout, "size": size})
        self._check_room(size + len(meta))
        partial = os.path.join(self.dir, f".partial-{step}")
        os.makedirs(partial)
        with open(os.path.join(partial, "tensors"), "wb+") as f:
            f.truncate(max(size, 1))
            data = mmap.mmap(f.fileno(), max(size, 1))
        _copy_in(data, tensors, layout)
        with open(os.path.join(partial, "meta"), "wb") as f:
            f.write(meta)
        self.last = step
        # The checksum and the count in the store go on beside the training loop (zlib releases
        # the GIL): the step is the job's once every rank's copy is whole.
        self.completing = threading.Thread(target=self._complete, args=(partial, step, data, meta),
                                           name="dlrun-checkpoint", daemon=True)
        self.completing.start()

    def _complete(self, partial, step, data, meta):
        try:
            with open(os.path.join(partial, "sum"), "w") as f:
                f.write(_checksum(data, meta))
            data.close()
            os.rename(partial, os.path.join(self.dir, f"step-{step}"))
            self.store.add(f"{KEYS}/saved/{step}", 1)
        except Exception as error:  # the step stays incomplete: the job's step stays older
            _say(f"step {step} could not be completed ({type(error).__name__}: {error})")

    def finish_completing(self):
        if self.completing is not None:
            self.completing.join()
            self.completing = None

    def _await_complete(self, step):
        """Waits until every rank's copy of `step` is complete."""
        deadline = time.monotonic() + COMPLETE_WAIT_S
        while self.complete is None or self.complete < step:
            if self.store.add(f"{KEYS}/saved/{step}", 0) >= self.world:
                self.complete = step
                return
            if time.monotonic() > deadline:
                raise CheckpointError(f"dlrun.checkpoint: step {step} is not complete on every "
                                      f"rank after {COMPLETE_WAIT_S} s")
            time.sleep(POLL_S)

    def _check_room(self, needed):
        fs = os.statvfs(self.dir)
        free = fs.f_bavail * fs.f_frsize
        if needed > free:
            raise CheckpointError(
                f"dlrun.checkpoint: {os.path.dirname(self.dir)} has {free / 2**20:.0f} MiB free, "
                f"a copy of this rank's state needs {needed / 2**20:.0f} MiB: make /dev/shm "
                "larger (docker --shm-size, a tmpfs size) or save less")

    def _drop_partials(self):
        for path in glob.glob(os.path.join(self.dir, ".partial-*")):
            shutil.rmtree(path, ignore_errors=True)

    # Loading --------------------------------------------------------------------------------

    def load(self):
        self.finish_completing()
        self._drop_partials()
        whole = {}
        for step, path in sorted(_step_dirs(self.dir).items(), reverse=True):
            opened = self._open(path, step)
            if opened is not None:
                whole[step] = opened
        self.loads += 1
        keys = f"{KEYS}/load-{self.loads}"
        self.store.set(f"{keys}/{self.rank}", json.dumps(sorted(whole)))
        common = set(whole)
        for rank in range(self.world):
            self.store.wait([f"{keys}/{rank}"])
            common &= set(json.loads(self.store.get(f"{keys}/{rank}")))
        if not common:
            return None
        step = max(common)
        self.complete = step
        self.last = step
        return step, self._read(*whole[step])

    def _open(self, path, step):
        """(data, meta) of the copy at `path`, None (and said) when it is not whole."""
        try:
            with open(os.path.join(path, "meta"), "rb") as f:
                meta = f.read()
            with open(os.path.join(path, "sum")) as f:
                expected = f.read().strip()
            with open(os.path.join(path, "tensors"), "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)  # the tensors' own memory
                f.readinto(data)
        except OSError as error:
            _say(f"step {step}'s copy cannot be read ({error}); not loaded")
            return None
        if _checksum(data, meta) != expected:
            _say(f"step {step}'s copy does not match its checksum; not loaded")
            return None
        return data, meta

    @staticmethod
    def _read(data, meta):
        import torch
        saved = pickle.loads(meta)
        tensors = []
        for dtype, shape, offset, nbytes in saved["layout"]:
            kind = getattr(torch, dtype)
            count = 1
            for n in shape:
                count *= n
            if nbytes:
                flat = torch.frombuffer(data, dtype=kind, count=count, offset=offset)
            else:
                flat = torch.empty(0, dtype=kind)
            tensors.append(flat.view(shape))
        return fill(saved["skeleton"], tensors)


def _say(text):
    import sys
    print(f"dlrun.checkpoint: rank {os.environ.get('RANK', '?')}: {text}", file=sys.stderr,
          flush=True)
