"""A checkpoint's copy as dlrun.checkpoint keeps it (its files in the node's memory or in
--checkpoint-dir, its checksum, its tensors read back) and fetches it from a dlrun agent
(agents/checkpoint_wire.h). The job's agreement on which copy is the job's is checkpoint.py's."""

import contextlib
import ctypes
import glob
import math
import mmap
import os
import pickle
import shutil
import time
import zlib

from dlrun._job import say
from dlrun._tree import fill

BLOCK = 4096  # the checksum's block; a copy's bytes are a whole number of them
ALIGN = 64  # each tensor's bytes start at a multiple of this
POLL_S = 0.005
WRITE_WAIT_S = 30  # a slot asked to be carried waits so long for the agent to take it
REQUESTS = ("write", "replicate")  # what a worker asks its agent to do with a copy
PEER_TIMEOUT_S = 30  # a peer agent that stays silent so long is given up


class CheckpointError(RuntimeError):
    """A save or load that cannot be done; its message says why in one line."""

    __module__ = "dlrun.checkpoint"  # where users meet it (and catch it)


def lay_out(tensors):
    """Where each tensor's bytes go in a copy: ([(dtype, shape, offset, nbytes)], the copy's
    size, a whole number of blocks, at least one)."""
    layout, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        layout.append((str(t.dtype).replace("torch.", ""), tuple(t.shape), size, nbytes))
        size += -(-nbytes // ALIGN) * ALIGN
    return layout, max(-(-size // BLOCK) * BLOCK, BLOCK)


def copy_in(data, tensors, layout):
    """Each tensor's bytes into `data` at its offset (from any device). Returns each 4 KiB
    block's sum (an int64 tensor) where the copy summed them as it went (every tensor in CPU
    memory and the agent's module at hand), else None: checksum() then reads the copy."""
    import torch

    native = _native()
    if native and all(t.device.type == "cpu" and t.layout == torch.strided for t in tensors):
        return _copy_in_native(native, data, tensors, layout)
    for t, (_, _, offset, nbytes) in zip(tensors, layout):
        if nbytes:
            view = torch.frombuffer(data, dtype=t.dtype, count=t.numel(), offset=offset)
            view.copy_(t.detach().reshape(-1))
    return None


def _copy_in_native(native, data, tensors, layout):
    """copy_in through agents/checkpoint_copy.h: streaming stores that sum what they write, one
    pass over memory where torch's copy and the checksum take three."""
    import torch

    sources = readable(tensors)
    pieces = torch.tensor(
        [
            (s.data_ptr(), offset, nbytes)
            for s, (_, _, offset, nbytes) in zip(sources, layout)
            if nbytes
        ],
        dtype=torch.int64,
    ).reshape(-1, 3)
    sums = torch.empty(len(data) // BLOCK, dtype=torch.int64)
    with _address(data) as into:
        done = native.dlrun_checkpoint_copy_in(
            into, len(data), pieces.data_ptr(), len(pieces), sums.data_ptr()
        )
    if not done:
        raise ValueError(f"a copy's layout does not fit its {len(data)} bytes")
    return sums


def readable(tensors):
    """The tensors as the module reads them: their bytes as they read (conjugate and negative
    views resolved, strides made contiguous)."""
    return [t.detach().resolve_conj().resolve_neg().contiguous() for t in tensors]


def _block_sums(data):
    """Each 4 KiB block's sum of `data`, as an int64 tensor."""
    import torch

    native = _native()
    if not native:
        return torch.frombuffer(data, dtype=torch.int64).view(-1, BLOCK // 8).sum(dim=1)
    sums = torch.empty(len(data) // BLOCK, dtype=torch.int64)
    with _address(data) as at:
        native.dlrun_checkpoint_sum_blocks(at, len(data), sums.data_ptr())
    return sums


@contextlib.contextmanager
def _address(data):
    """The address of the first byte of `data` (a writable buffer, a mapping), held only within
    the block: a mapping with its buffer still held cannot be closed."""
    held = ctypes.c_char.from_buffer(data)
    try:
        yield ctypes.addressof(held)
    finally:
        del held


_opened = None  # the agent's module (DLRUN_CHECKPOINT_COPY) once opened, False without one


def _native():
    """The module dlrun's agent names (agents/checkpoint_copy.h), None where there is none: the
    copy and its sums are then torch's, the same bytes and checksum, slower."""
    global _opened
    if _opened is None:
        _opened = False
        path = os.environ.get("DLRUN_CHECKPOINT_COPY")
        if path:
            try:
                native = ctypes.CDLL(path)  # ctypes lets the GIL go during each call
                address, size = ctypes.c_void_p, ctypes.c_uint64
                native.dlrun_checkpoint_copy_in.argtypes = [address, size, address, size, address]
                native.dlrun_checkpoint_copy_in.restype = ctypes.c_int
                native.dlrun_checkpoint_sum_blocks.argtypes = [ctypes.c_void_p] * 3
                native.dlrun_checkpoint_sum_blocks.restype = None
                _opened = native
            except (OSError, AttributeError) as error:
                say("checkpoint", f"{path} cannot be used ({error}); copies go through torch")
    return _opened or None


def checksum(data, meta, blocks=None):
    """A copy's checksum: Fletcher-like over the tensors' bytes as 64-bit words (a sum of each
    4 KiB block, and of those sums weighted by their place: any changed word, any moved block
    shows), at memory speed, and CRC-32 over the structure. `blocks`: the block sums where
    copy_in made them (else read from `data`)."""
    import torch

    if len(data) == 0 or len(data) % BLOCK:
        raise ValueError(f"a copy of {len(data)} bytes, not a whole number of {BLOCK}-byte blocks")
    if blocks is None:
        blocks = _block_sums(data)
    # Integer sums wrap: the same on every machine, in any order.
    weighted = (blocks * torch.arange(1, len(blocks) + 1)).sum()
    return (
        f"{int(blocks.sum()) & (2**64 - 1):016x}{int(weighted) & (2**64 - 1):016x}"
        f"{zlib.crc32(meta):08x}"
    )


class Slot:
    """One of a rank's two places for a copy: `tensors` (the tensors' bytes, a file kept and
    rewritten in place: its memory is allocated once), `meta` (the structure, pickled) and
    `step` ("STEP CHECKSUM", written last, by a rename: the copy is whole once it exists)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.mapped = None  # (size, mmap) this process wrote through
        self.lent = False  # load() gave out tensors mapped from `tensors`: never rewritten
        # Only this process marks and unmarks its slots while it runs (a save reads its two
        # marks each time): what it last wrote or read, until then _UNREAD. The requests it
        # asked since its last unmark, None before one (a former process may have left some).
        self._mark = _UNREAD
        self._asked = None
        self._lock = None  # `lock`, opened once

    def marked(self):
        """(step, checksum) of the whole copy here, None when there is none."""
        if self._mark is _UNREAD:
            try:
                with open(os.path.join(self.path, "step")) as f:
                    step, checksum = f.read().split()
                self._mark = int(step), checksum
            except (OSError, ValueError):
                self._mark = None
        return self._mark

    def await_request(self, request, timeout):
        """Whether the agent took and carried out `request` within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while os.path.exists(os.path.join(self.path, request)):
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def outcome(self, name):
        """What the agent wrote of a request it carried out ("STEP sent"), or None."""
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    def unmark(self):
        """The copy here no longer whole: once the agent, asked to write it to --checkpoint-dir
        or send it to a peer, has read it (it takes a request within a tenth of a second, and
        holds `lock` shared while it reads)."""
        import fcntl

        requests = REQUESTS if self._asked is None else self._asked
        if not requests and self._mark is None:
            return  # nothing here for the agent to read: no lock to take
        deadline = time.monotonic() + WRITE_WAIT_S
        while (
            any(os.path.exists(os.path.join(self.path, name)) for name in requests)
            and time.monotonic() < deadline
        ):
            time.sleep(POLL_S)
        if self._lock is None:
            self._lock = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            for name in ("step", *requests):
                try:
                    os.unlink(os.path.join(self.path, name))
                except FileNotFoundError:
                    pass
            self._mark, self._asked = None, set()
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def ask(self, request, step, word):
        """Asks the agent to carry this copy (agents/checkpoint_courier.h): `write` to
        --checkpoint-dir ("STEP WORLD"), `replicate` to a peer node's agent ("STEP HOST:PORT")."""
        _replace(os.path.join(self.path, request), f"{step} {word}\n")
        if self._asked is not None:
            self._asked.add(request)

    def mark(self, step, checksum):
        _replace(os.path.join(self.path, "step"), f"{step} {checksum}\n")
        self._mark = step, checksum

    def rewrites(self, size):
        """Whether a copy of `size` bytes is written over the last one this process wrote here,
        in memory it holds already."""
        return not self.lent and self.mapped is not None and self.mapped[0] == size

    def writable(self, size):
        """The mapping of `tensors`, `size` bytes, for this save: the last one's when it has the
        size, else the file made anew (a file lent to loaded tensors keeps their pages)."""
        if self.rewrites(size):
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
                raise CheckpointError(
                    f"dlrun.checkpoint: {self.path} cannot hold {size / 2**20:.0f}"
                    f" MiB ({error.strerror}): make /dev/shm larger (docker "
                    "--shm-size, a tmpfs size) or save less"
                ) from None
            self.mapped = (size, mmap.mmap(f.fileno(), size))
        return self.mapped[1]

    def close(self):
        """Closes its `lock` (a renumbered rank's old slots; their mappings go with them)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

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
            data = mmap.mmap(
                f.fileno(),
                os.fstat(f.fileno()).st_size,
                flags=mmap.MAP_PRIVATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        self.lent = True
        return meta, data


_UNREAD = object()  # a Slot's mark before it read or wrote one


def _replace(path, text):
    """`path` holding `text`, whole from the first moment it exists (a rename)."""
    fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(f"{path}.tmp", path)


def on_disk(rank):
    """This rank's steps in --checkpoint-dir (DIR/rank-R/step-S, as the agent writes them)."""
    where = os.environ.get("DLRUN_CHECKPOINT_DIR")
    found = glob.glob(os.path.join(where, f"rank-{rank}", "step-*")) if where else []
    return [Slot(path) for path in found if os.path.isdir(path)]


def sent_here(root, rank):
    """The copies of `rank` another node's agent sent this node's (peer/rank-R/step-S)."""
    return [Slot(path) for path in glob.glob(os.path.join(root, "peer", f"rank-{rank}", "step-*"))]


def node_copies(root):
    """{rank: steps} of every whole copy in this node's memory: the slots of the ranks it ran,
    and the copies other nodes' agents sent it."""
    found = {}
    for path in glob.glob(os.path.join(root, "rank-*", "slot-*")) + glob.glob(
        os.path.join(root, "peer", "rank-*", "step-*")
    ):
        mark = Slot(path).marked()
        if mark:
            found.setdefault(int(os.path.basename(os.path.dirname(path))[5:]), set()).add(mark[0])
    return found


def forget_later(root, step, ranks_here):
    """The copies in this node's memory of steps after `step`, the one every rank just agreed
    on: never the job's (an earlier attempt's), they must not be offered later, nor crowd out
    the agreed step among the two a peer keeps. The node's current ranks forget their own."""
    for path in glob.glob(os.path.join(root, "peer", "rank-*", "step-*")) + glob.glob(
        os.path.join(root, "rank-*", "slot-*")
    ):
        rank = int(os.path.basename(os.path.dirname(path))[5:])
        if os.path.basename(path).startswith("slot-") and rank in ranks_here:
            continue
        mark = Slot(path).marked()
        if not mark or mark[0] <= step:
            continue
        if os.path.basename(path).startswith("step-"):
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            os.unlink(os.path.join(path, "step"))  # no longer whole: never loaded
        except FileNotFoundError:
            pass


def offering(everyone, world):
    """For each rank, {step: [agents that offer its copy of it]}, from every rank's offers."""
    agents = [{} for _ in range(world)]
    for value in everyone:
        for rank, steps in value["offers"].items():
            if int(rank) < world:
                for step in steps:
                    agents[int(rank)].setdefault(step, []).append(value["agent"])
    return agents


def fetch(agent, rank, step, slot):
    """Rank `rank`'s copy of `step` from the agent at `agent` (agents/checkpoint_wire.h) written
    into `slot` and marked: its checksum, which load() checks."""
    import socket

    host, port = agent.rsplit(":", 1)
    slot.unmark()
    with socket.create_connection((host.strip("[]"), int(port)), timeout=PEER_TIMEOUT_S) as conn:
        conn.sendall(f"GET {rank} {step}\n".encode())
        answer = conn.makefile("rb", buffering=0).readline(256).decode().rstrip("\n").split(" ")
        if answer[0] != "HAVE" or len(answer) != 4:
            raise OSError(" ".join(answer[1:]) if answer[0] == "NO" else "no copy sent")
        meta = bytearray(int(answer[1]))
        receive(conn, memoryview(meta))
        receive(conn, memoryview(slot.writable(int(answer[2]))))
    with open(os.path.join(slot.path, "meta"), "wb") as f:
        f.write(meta)
    slot.mark(step, answer[3])
    return answer[3]


def receive(conn, view):
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise OSError("the agent closed the connection mid-copy")
        got += n


def read_state(data, meta):
    """The state saved: its tensors views of `data`."""
    import torch

    saved = pickle.loads(meta)
    tensors = []
    for dtype, shape, offset, nbytes in saved["layout"]:
        kind = getattr(torch, dtype)
        count = math.prod(shape)
        flat = (
            torch.frombuffer(data, dtype=kind, count=count, offset=offset)
            if nbytes
            else torch.empty(0, dtype=kind)
        )
        tensors.append(flat.view(shape))
    return fill(saved["skeleton"], tensors)
