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
save(..., overlap=True) copies beside the next step instead (python/dlrun/_overlap.py).

In a job of several nodes the agent also sends each copy to the next node's agent, which keeps
it (a rank's two newest steps): a rank placed on another node after its node was lost loads its
step from whichever agent holds it.

With dlrun's --checkpoint-dir (DLRUN_CHECKPOINT_DIR) the agent writes copies to that directory
(DIR/rank-R/step-S/, the same files as in memory): one step every --checkpoint-write-every
seconds while the job runs (the same on every rank: _write_if_named), and what is left as it
ends. load() finds a step there too: a job launched again goes on from it.

Preemption (python/dlrun/_stop.py): should_stop(step), called by every rank once a step after its
save, turns true at the same step on every rank once any worker of the job got SIGTERM (dlrun
stopping the job: a signal to dlrun, scancel, a pod deleted, `dlrun stop`), two steps after the
first rank saw it: the program returns, and that step is the one a new launch loads. Where rank
0's torch serves the job's store, rank 0's should_stop() returns once every rank has its answer
(the store ends with rank 0).

Outside dlrun (no DLRUN_CHECKPOINT_SHM), save() is a torch.save to DLRUN_CHECKPOINT_DIR (or
`directory`), one file a rank and step, and load() the torch.load of this rank's newest one.
"""

import atexit
import glob
import itertools
import json
import os
import pickle
import time
from datetime import timedelta

from dlrun import _overlap
from dlrun._copies import (
    PEER_TIMEOUT_S,
    WRITE_WAIT_S,
    CheckpointError,
    Slot,
    checksum,
    copy_in,
    fetch,
    forget_later,
    lay_out,
    node_copies,
    offering,
    on_disk,
    read_state,
    sent_here,
)
from dlrun._job import POLL_S, Beside, get_all, say, store_client
from dlrun._overlap import copy as copy_beside
from dlrun._stop import Stop
from dlrun._stop import preemption as _preemption
from dlrun._tree import hollow

__all__ = ["save", "load", "wait", "should_stop", "active"]

KEYS = "dlrun/checkpoint"  # under the attempt's key space of the job's store
COMPLETE_WAIT_S = 120  # a save waits so long for the previous step on every rank


def active():
    """Whether checkpoints go to a dlrun agent's memory."""
    return bool(os.environ.get("DLRUN_CHECKPOINT_SHM"))


def save(state, step, directory=None, overlap=False):
    """Saves `state` (dicts, lists and tuples of tensors and picklable values) as step `step` (an
    int, growing from save to save) of this rank. `overlap`: returns before the tensors that
    optimizers own are copied; they are copied beside the next step's forward and backward, and
    every optimizer's next step() waits for the copy (torch 2, CPU tensors; else as without)."""
    if not active():
        return _disk_save(state, step, directory)
    return _memory().save(state, int(step), overlap)


def wait():
    """Waits until this rank's last save is complete (checksummed, counted in the store): before
    the program's end, say, or a step every rank must hold for sure."""
    if active():
        _memory().finish_completing()
        _memory()._raise_failed()


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


# --- outside dlrun: plain files ------------------------------------------------------------------


def _rank():
    return int(os.environ.get("RANK", "0"))


def _directory(directory):
    found = directory or os.environ.get("DLRUN_CHECKPOINT_DIR")
    if not found:
        raise CheckpointError(
            "dlrun.checkpoint: outside dlrun, give a directory (directory= or "
            "DLRUN_CHECKPOINT_DIR) to save and load checkpoints in"
        )
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


def _generation():
    """The in-process recovery's generation this process last recovered in (dlrun.recovery
    sets it), "0" before any."""
    return os.environ.get("DLRUN_RECOVERY_GENERATION", "0")


def _memory():
    global _instance
    if _instance is None:
        _instance = _Memory(os.environ["DLRUN_CHECKPOINT_SHM"])
    return _instance


class _Memory:
    """This rank's copies in the node's shared memory (two slots), and the job's record of them
    in the store of the attempt."""

    def __init__(self, root):
        self.root = root
        # A job of several nodes: where this node's agent keeps copies for the others and serves
        # any it holds (agents/checkpoint_peer.h), HOST:PORT
        self.agent = os.environ.get("DLRUN_CHECKPOINT_AGENT")
        self._number(_rank(), int(os.environ["WORLD_SIZE"]))
        self.store = self._client()
        self._announce()
        self.stop = Stop(self._client, KEYS)  # should_stop's, with a store client of its own
        self.completing = Beside()  # the thread completing the last save
        # _number sets the rest: self.last, the last step saved by this process in its
        # numbering; self.complete, the newest step known complete on every rank, and
        # self.complete_on_disk, whether it was loaded from --checkpoint-dir; self.written,
        # self.written_step and self.named_at, of _write_if_named.
        self.loads = 0
        self.failed = None  # what stopped a save made beside the loop (_save_beside)
        # --checkpoint-write-every: rank 0 names a step to write to --checkpoint-dir so often
        every = os.environ.get("DLRUN_CHECKPOINT_WRITE_EVERY")
        self.write_every = float(every) if every and os.environ.get("DLRUN_CHECKPOINT_DIR") else 0
        atexit.register(self.finish_completing)  # the last save is the job's even at the end

    def _number(self, rank, world):
        """This process as rank `rank` of `world`: its slots, and nothing known of the job's
        steps in that numbering yet."""
        for slot in getattr(self, "slots", ()):
            slot.close()
        self.rank, self.world = rank, world
        self.dir = os.path.join(self.root, f"rank-{rank}")
        self.slots = [Slot(os.path.join(self.dir, f"slot-{i}")) for i in range(2)]
        self.last = self.complete = None
        # (step, complete on every rank, requests to stop) as the thread completing the save of
        # that step saw them at its end (its own `saw`, taken when it is joined)
        self.seen = self.saw = None
        self.saved_in = None  # the recovery generation the last save was made in (_generation)
        self.complete_on_disk = False
        self.written, self.written_step, self.named_at = 0, -1, None
        self.peer = None  # the agent keeping copies of this rank's steps, once known

    def _follow_numbering(self):
        """In-process recovery renumbers the survivors of a lost node without a spare
        (dlrun.recovery sets RANK and WORLD_SIZE anew): from then on this process saves as its
        new rank, and a step is complete once the new world has it."""
        rank, world = _rank(), int(os.environ["WORLD_SIZE"])
        if (rank, world) != (self.rank, self.world):
            self.finish_completing()
            self._number(rank, world)
            self._announce()

    def _client(self):
        return store_client(self.world, timedelta(seconds=COMPLETE_WAIT_S))

    # Stopping -------------------------------------------------------------------------------

    def should_stop(self, step):
        return self.stop.asks(
            step, self._looked_before(step), self.rank, self.world, self.finish_completing
        )

    def _looked_before(self, step):
        """The count of requests to stop as the thread completing the save of `step` or `step` -
        1 saw it, None where neither such thread looked (no such save, not joined yet, or
        made before the program first asked should_stop())."""
        return self.seen[2] if self.seen is not None and self.seen[0] >= step - 1 else None

    # Saving ---------------------------------------------------------------------------------

    def save(self, state, step, overlap):
        self.finish_completing()
        self._raise_failed()
        self._follow_numbering()
        if self.last is not None and step <= self.last:
            raise CheckpointError(
                f"dlrun.checkpoint: step {step} saved after step {self.last}: steps must grow"
            )
        tensors = []
        skeleton = hollow(state, tensors)
        layout, size = lay_out(tensors)
        meta = pickle.dumps({"step": step, "skeleton": skeleton, "layout": layout})
        previous = self.last, self.saved_in  # the step saved before, and its generation
        self.saw = None
        if overlap and _overlap.available(tensors):
            pending = _overlap.Pending(tensors)
            self.last, self.saved_in = step, _generation()
            try:
                self.completing.run(self._save_beside, previous, step, pending, layout, size, meta)
            except BaseException:  # no thread to make the copy: nothing for the loop to wait for
                pending.made.set()
                _overlap.check()
                raise
            return
        slot, data = self._slot_for(previous, size, meta)
        blocks = copy_in(data, tensors, layout)
        _write(slot, meta)
        self.last, self.saved_in = step, _generation()
        # The checksum (from the copy's block sums, or read from the copy where torch copied it)
        # and the count in the store go on beside the training loop (torch's sums and the store's
        # requests release the GIL): the step is the job's once every rank's copy is whole.
        self.completing.run(self._complete, slot, step, data, meta, blocks)

    def _slot_for(self, previous, size, meta):
        """(slot, its mapping of `size` bytes) for this save, once the step saved before
        (`previous`: it, and the generation it was saved in) is complete on every rank or known
        never to be."""
        if previous[0] is not None:
            self._await_complete(*previous)
        # The slot of the job's newest step stays; the other takes this one (an attempt's later
        # steps, a copy never completed, go).
        slot = self._free_slot()
        slot.unmark()
        if not slot.rewrites(size):  # else no more memory than it holds
            self._check_room(slot, size + len(meta))
        return slot, slot.writable(size)

    def _save_beside(self, previous, step, pending, layout, size, meta):
        """save(overlap=True) from the slot's choice on, beside the next step's forward and
        backward (python/dlrun/_overlap.py). A copy torn by a change in place, or not made,
        does not count, and the step is settled as short: no rank waits for it."""
        slot = data = blocks = None
        try:
            slot, data = self._slot_for(previous, size, meta)
            blocks = copy_beside(pending, data, layout)
        except Exception as error:  # raised by the next save() or wait()
            self.failed = error
        finally:
            pending.made.set()
        pending.checked.wait()  # the loop's look at the tensors' versions (_overlap.check)
        try:
            if self.failed is None and not pending.torn:
                _write(slot, meta)
                self._complete(slot, step, data, meta, blocks)
                return
            if pending.torn:
                _say(
                    f"step {step}'s state changed in place while it was copied (after "
                    "save(overlap=True), before an optimizer's step); not counted: the job's "
                    "step stays the one before, and this process's later saves copy at once"
                )
        except Exception as error:
            self.failed = self.failed or error
        self._settle_short(step)

    def _raise_failed(self):
        if self.failed is not None:
            error, self.failed = self.failed, None
            raise error

    def _free_slot(self):
        """The slot this save may write: not the one holding the job's newest complete step (or,
        before any is known here, the newest step held: another rank may hold only that)."""
        marks = {slot: slot.marked() for slot in self.slots}
        if self.complete is not None:
            kept = [slot for slot, mark in marks.items() if mark and mark[0] == self.complete]
            if not kept and not self.complete_on_disk:
                raise CheckpointError(
                    f"dlrun.checkpoint: this rank's copy of step "
                    f"{self.complete}, the job's newest, is gone"
                )
        else:
            held = [slot for slot, mark in marks.items() if mark]
            if os.environ.get("DLRUN_RECOVERY_JOIN") == "1":
                # A rank replaced in process: its predecessor's newest copy may be one it never
                # counted, a step the others keep no copy of (_await_complete): the newest
                # settled as complete stays.
                complete = [slot for slot in held if self._settled(marks[slot][0])]
                held = complete or held
            kept = [max(held, key=lambda slot: marks[slot][0])] if held else []
        return next(slot for slot in self.slots if slot not in kept)

    def _complete(self, slot, step, data, meta, blocks):
        try:
            slot.mark(step, checksum(data, meta, blocks))
            if self.write_every:
                self._write_if_named(slot, step)
            self._replicate(slot, step)
            once = self.store.add(f"{KEYS}/saved/{step}/{self.rank}", 1) == 1  # once a rank
            counted = self.store.add(f"{KEYS}/saved/{step}", 1 if once else 0)
            # What the next save and should_stop() would otherwise ask the store themselves, in
            # one more request here beside the loop: the count again where this rank was not
            # the last (the others count theirs meanwhile), the requests to stop once the
            # program asks should_stop().
            keys = [f"{KEYS}/saved/{step}"] if counted < self.world else []
            if _preemption.listening:
                keys.append(f"{KEYS}/stop-asked")  # made by _announce
            read = [int(value) for value in get_all(self.store, keys)] if keys else []
            if counted < self.world:
                counted = read.pop(0)
            self.saw = (step, counted >= self.world, read[0] if read else None)
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
            slot.ask("write", step, self.world)
        if (
            self.rank == 0
            and named <= self.written
            and step > self.written_step
            and (self.named_at is None or time.monotonic() - self.named_at >= self.write_every)
        ):
            self.named_at = time.monotonic()
            self.store.add(key, step + 2 - named)

    def _replicate(self, slot, step):
        """Has the agent send this copy to the agent of the next node (its ranks follow this
        node's), which keeps it (agents/checkpoint_peer.h), before the step counts: a step the
        job completed is on a peer too, and a lost node's ranks find it there. A copy that does
        not get there (the peer gone) counts all the same, and the peer is looked up again."""
        if not self.agent or self.world <= int(os.environ.get("LOCAL_WORLD_SIZE", self.world)):
            return
        if self.peer is None:
            self.peer = self._next_node()
        if not self.peer:
            return
        slot.ask("replicate", step, self.peer)
        if (
            not slot.await_request("replicate", PEER_TIMEOUT_S + WRITE_WAIT_S)
            or slot.outcome("replicated") != f"{step} sent"
        ):
            self.peer = None

    def _announce(self):
        """This rank's agent, for the ranks of other nodes that choose it as their peer (set
        before load()'s agreement: every rank has set it once load() returns); and the count of
        requests to stop made, for _complete to read with the count of a step."""
        if self.agent:
            self.store.set(f"{KEYS}/agent/{self.rank}", self.agent)
        self.store.add(f"{KEYS}/stop-asked", 0)  # read with others at once (_complete)

    def _next_node(self):
        """The agent of the first rank after this node's ranks that runs elsewhere; None while
        that rank has not said (asked again at the next save), "" where there is none."""
        for offset in range(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), self.world):
            key = f"{KEYS}/agent/{(self.rank + offset) % self.world}"
            if not self.store.check([key]):
                return None
            agent = self.store.get(key).decode()
            if agent != self.agent:
                return agent
        return ""

    def finish_completing(self):
        _overlap.check()  # a copy left to the copier made now, and checked
        self.completing.wait()
        self.seen = self.saw

    def _await_complete(self, step, saved_in):
        """Waits until every rank's copy of `step` is complete, or a rank settled it as short
        (its copy torn or not made: _save_beside). `saved_in`: the recovery generation `step` was
        saved in. Not where an in-process recovery came between
        its save and now: a rank lost before it counted its copy never will (its replacement
        starts past the step), so the step is settled as it stands (_settled), and where it is
        short the slot of the step known complete before stays (_free_slot)."""
        if self.complete is not None and self.complete >= step:
            return
        if self.seen is not None and self.seen[:2] == (step, True):  # the last rank to count
            self.complete, self.complete_on_disk = step, False
            return
        deadline = time.monotonic() + COMPLETE_WAIT_S
        while self.store.add(f"{KEYS}/saved/{step}", 0) < self.world:
            if saved_in != _generation() or self.store.check([f"{KEYS}/settled/{step}"]):
                if self._settled(step):
                    self.complete, self.complete_on_disk = step, False
                return
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"dlrun.checkpoint: step {step} is not complete on every rank after "
                    f"{COMPLETE_WAIT_S} s"
                )
            time.sleep(POLL_S)
        self.complete, self.complete_on_disk = step, False

    def _settle_short(self, step):
        try:
            self.store.compare_set(f"{KEYS}/settled/{step}", "", "short")
        except Exception as error:  # the store gone: the job is ending or failing
            _say(f"step {step} could not be settled as short ({error})")

    def _settled(self, step):
        """Whether `step` counts as complete on every rank, once an in-process recovery may have
        lost a rank's count of it for good: the first rank to ask decides from the count as it
        stands (a survivor's own may still come, its copy on its way to a peer) and every rank
        takes that verdict (compare-and-set), so that all keep the same step."""
        whole = self.store.add(f"{KEYS}/saved/{step}", 0) >= self.world
        verdict = self.store.compare_set(
            f"{KEYS}/settled/{step}", "", "complete" if whole else "short"
        )
        return verdict in (b"complete", "complete")

    def _check_room(self, slot, needed):
        held = 0 if slot.lent else slot.size()  # rewritten in place: no more memory
        fs = os.statvfs(self.dir)
        free = fs.f_bavail * fs.f_frsize + held
        if needed > free:
            raise CheckpointError(
                f"dlrun.checkpoint: {os.path.dirname(self.dir)} has {free / 2**20:.0f} MiB free, "
                f"a copy of this rank's state needs {needed / 2**20:.0f} MiB: make /dev/shm "
                "larger (docker --shm-size, a tmpfs size) or save less"
            )

    # Loading --------------------------------------------------------------------------------

    def load(self):
        """The newest step every rank can load whole: the ranks agree on the newest step they
        all hold (in their memory, on disk) or that an agent holds for them (a copy of a rank
        now elsewhere, or sent by a peer: fetched from it), each checks its copy of it, and a
        step any rank finds corrupt or cannot fetch is left out (it says so) and they agree
        again."""
        self.finish_completing()
        self._follow_numbering()
        held = {m[0]: (slot, m[1]) for slot in on_disk(self.rank) if (m := slot.marked())}
        held.update(
            {m[0]: (slot, m[1]) for slot in sent_here(self.root, self.rank) if (m := slot.marked())}
        )
        held.update({m[0]: (slot, m[1]) for slot in self.slots if (m := slot.marked())})
        # One rank a node offers the node's copies to the ranks elsewhere.
        offers = (
            node_copies(self.root) if self.agent and os.environ.get("LOCAL_RANK") == "0" else {}
        )
        self.loads += 1
        tried = set()
        for turn in itertools.count():  # each turn leaves a step out: they run out
            keys = f"{KEYS}/load-{self.loads}/{turn}"
            everyone = self._gather(
                f"{keys}/held",
                {
                    "held": sorted(set(held) - tried),
                    "agent": self.agent,
                    "offers": {str(r): sorted(set(steps) - tried) for r, steps in offers.items()},
                },
            )
            agents = offering(everyone, self.world)
            available = [set(v["held"]) | set(agents[r]) for r, v in enumerate(everyone)]
            common = set.intersection(*available)
            if not common:
                return None
            step = max(common)
            tried.add(step)
            if offers:
                forget_later(self.root, step, self._ranks_here())
            try:
                if step not in held:  # then held as its own: unmarked below unless loaded
                    held[step] = self._fetch(agents[self.rank][step], step, held)
                slot, expected = held[step]
                meta, data = slot.lend()
                whole = checksum(data, meta) == expected
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
                return step, read_state(data, meta)
            # A rank's copy is not whole: the step is not the job's; the next newest, then.

    def _ranks_here(self):
        """The ranks this node runs now (each forgets its own later steps itself)."""
        first = self.rank - int(os.environ.get("LOCAL_RANK", "0"))
        return range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def _fetch(self, agents, step, held):
        """This rank's copy of `step` from the first of `agents` (HOST:PORT) that sends it whole,
        into a slot of this rank (the one of the oldest step, which leaves `held`): (slot,
        checksum). Raises OSError naming why where none does."""
        slot = min(self.slots, key=lambda s: (1, m[0]) if (m := s.marked()) else (0, 0))
        for older in [k for k, (other, _) in held.items() if other is slot]:
            del held[older]
        why = None
        for agent in agents:
            try:
                return slot, fetch(agent, self.rank, step, slot)
            except (OSError, ValueError, OverflowError, MemoryError) as error:  # bad bytes too
                why = f"from {agent}: {error}"
        raise OSError(why)

    def _gather(self, keys, mine):
        """Every rank's value (JSON) set under `keys`, this rank's `mine` among them."""
        self.store.set(f"{keys}/{self.rank}", json.dumps(mine))
        named = [f"{keys}/{rank}" for rank in range(self.world)]
        self.store.wait(named)
        return [json.loads(value) for value in get_all(self.store, named)]


def _write(slot, meta):
    with open(os.path.join(slot.path, "meta"), "wb") as f:
        f.write(meta)


def _say(text):
    say("checkpoint", text)
