"""In-process recovery for a data-parallel training loop (docs/guides/in-process-recovery.md).

    import dlrun.recovery

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = dlrun.recovery.Loop(model, optimizer, backend="gloo")

    def train_step(step, ddp):           # `ddp`: the model wrapped in DistributedDataParallel
        x, y = batch(step)               # the data of step `step` (its position is the step)
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()    # DDP all-reduces the gradients here
        optimizer.step()

    loop.run(train_step, steps=1000)

Under `dlrun --recovery=in-process` a worker that dies is started again alone, with its RANK, and
the others keep their processes: the collective that failed in a survivor raises, the loop
destroys the process group, meets the replacement in the next generation's key space of the
job's store, makes the group again there, sends the model, the optimizer, the step and `state`
from the surviving ranks furthest along (on gloo each sending to some; on NCCL the lowest, by a
broadcast) to every rank that does not hold them already (sent in the new group, no file), and
runs the failed step again. Every step is taken once: all ranks go on from the same state and
step (a step whose optimizer.step() ran on such a rank counts as done). What a step draws at
random should come from the step (a generator seeded by it), since a replacement has none of its
dead process's state.

Each step done is reported through dlrun.progress, so --hang-timeout watches the loop: a rank
found hung is replaced the same way, once its stack is taken. A rank still in a step while its
peers meet in the next generation is freed by the loop itself (dlrun._stuck).

Whatever the recovery cannot finish (a second failure, a rank that never comes, no survivor, its
deadline) ends the worker with the agent's fallback code, and dlrun restarts the whole group, as
without --recovery. Outside dlrun, or without --recovery=in-process, the loop is a plain loop
over init_process_group("env://") and DistributedDataParallel: nothing else happens.
"""

import functools
import gc
import importlib.util
import json
import os
import sys
import threading
import time
from datetime import timedelta

from dlrun import _memory, _news, _state, progress
from dlrun._group import Group, prepare_nccl
from dlrun._job import get_all, say, store_client
from dlrun._reserve import reserved, take_place
from dlrun._stuck import StepWatch, sockets

__all__ = ["Loop", "active"]

KEYS = "dlrun/recovery"  # under the attempt's key space of the job's store
RECOVERY_TIMEOUT_S = 120  # a recovery not done by then falls back to the whole-group restart
EXACT_BUCKET_MB = 1e-6  # under any parameter's size: a bucket each
LEFT = -1  # what a wait's look finds where a rank left the loop
MOVE_BASE = 1_000_000  # a move's value: round * MOVE_BASE + rank + 1 (agents/recovery.h)
MOVE_WAIT_S = 10  # a survivor whose group's formation failed waits so long for its move


def active():
    """Whether this worker runs under dlrun --recovery=in-process."""
    return bool(os.environ.get("DLRUN_RECOVERY_DIR"))


def _say(text):
    say("recovery", text)


def _describe(error):
    """`error` in one line (gloo's and torch's messages run over several)."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}"


def _move_after(store, prefix, rank, met_in):
    """The move counter `rank`'s agent set under `prefix` (MOVE_BASE) where it names a round
    later than `met_in`, else None."""
    found = store.add(f"{prefix}/{rank}", 0)
    return found if found > 0 and found // MOVE_BASE > met_in else None


def _can_recover(backend):
    """Whether this torch can recover `backend` in process: an NCCL group must be aborted
    (torch 2.5 on). Where it cannot, the rank says so and the loop runs as outside dlrun's
    recovery: a failure restarts the whole group."""
    import torch
    import torch.distributed as dist

    if backend != "nccl" or hasattr(dist.distributed_c10d, "_abort_process_group"):
        return True
    _say(
        f"torch {torch.__version__} cannot abort an NCCL process group (torch 2.5 can): "
        "a failure restarts the whole group"
    )
    return False


def _peer_failure(error):
    """A collective or the store failed because a peer went away (gloo's pair closed or reset,
    NCCL's communicator aborted, a store connection lost): what recovery is for. Not a CUDA
    error: it stays with the process's context, which only a new process is rid of."""
    import torch.distributed as dist

    text = str(error)
    if "CUDA error" in text or "unhandled cuda error" in text:
        return False
    kinds = tuple(getattr(dist, name) for name in ("DistError",) if hasattr(dist, name))
    if kinds and isinstance(error, kinds):
        return True
    return isinstance(error, RuntimeError) and any(
        marker in text
        for marker in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "NCCL",
            "gloo",
            "Socket Timeout",
        )
    )


def _exact_buckets():
    """DistributedDataParallel's options for a bucket a parameter from the first iteration on.
    torch 2.13 puts every parameter in one bucket for a DDP's first iteration unless each
    bucket's cap is given (bucket_cap_mb_list): a new DDP after a recovery would otherwise sum
    its first step in another order than the fault-free run did. torch 1.13 has no such option:
    there only a DDP that looks for unused parameters buckets its first iteration by size, with
    a first bucket of torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, made a byte here (for every
    DDP of the process: exact=True is the program's choice)."""
    import inspect

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if "bucket_cap_mb_list" in inspect.signature(DistributedDataParallel).parameters:
        return {"bucket_cap_mb_list": [EXACT_BUCKET_MB]}
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1
    return {"bucket_cap_mb": EXACT_BUCKET_MB, "find_unused_parameters": True}


class Loop:
    """Owns the process group, the DistributedDataParallel wrapper and the step counter of a
    training loop; see the module's text. `state`: a dict of more picklable values every rank
    must agree on (an epoch, a scheduler's state_dict), replaced by the senders' after a
    recovery where a rank is not at their step. `ddp_options`: DistributedDataParallel's
    keyword arguments. `exact`: one gradient bucket per parameter, so that every sum is made in
    the same order in every generation and a deterministic job's weights equal a fault-free
    run's bit for bit (DDP's own buckets are laid out anew in a new group, which moves the sums'
    rounding; more all-reduces per step). `warmup`: a callable, warmup(model), that a worker
    started ahead (dlrun --ready-spares, --ready-replacements) calls once before it waits for
    its place: a forward and backward pass on a batch of the job's shape, so that its first step
    in the job runs warm (the first pass allocates and initialises what every later one reuses;
    on a GPU, the kernels and the cuBLAS handles). What it leaves in the model and the optimizer
    is replaced by the survivors' state as the worker joins; no other worker calls it."""

    def __init__(
        self,
        model,
        optimizer,
        backend="gloo",
        state=None,
        ddp_options=None,
        timeout=timedelta(seconds=60),
        exact=False,
        warmup=None,
    ):
        import torch.distributed as dist

        # Heap for what a recovery allocates again, touched once past a step (dlrun._memory).
        touch = _memory.prepare(model) if active() or reserved() else 0
        if warmup is not None and reserved():
            warmup(model)
            model.zero_grad(set_to_none=True)
            _memory.touch_heap(touch)
            touch = 0
        take_place()  # a worker started ahead gets its ranks here
        self.module, self.optimizer, self.backend = model, optimizer, backend
        self.state = state if state is not None else {}
        self.step = 0
        self.generation = 0
        self.recoveries = 0
        # The last recovery's phases in seconds ({"leave": ..., "meet": ..., "group": ...,
        # "state": ..., "total": ...}), None before the first.
        self.last_recovery = None
        self._ddp_options = dict(ddp_options or {})
        if exact:
            self._ddp_options.update(_exact_buckets())
        self._timeout = timeout
        self._group = Group(backend)
        # Whether the optimizer stepped in the step under way: a step that failed after it
        # (in a later collective) is done, and is not taken again.
        self._applied = False
        self._freed = False  # whether the step watch freed the step under way (_unblock)
        # The step's time as last marked, and when the last recovery ended (its mark's "at").
        self._marked_step_s = 0.0
        self._recovered_at = 0.0
        # One mark written at a time: the step watch's last resort writes one and exits in it.
        self._marking = threading.Lock()
        self._touch = touch
        if hasattr(optimizer, "register_step_post_hook"):  # torch 2.x
            optimizer.register_step_post_hook(lambda *_: setattr(self, "_applied", True))
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self._active = active() and _can_recover(backend)
        self._watch = StepWatch()
        if not self._active:
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
            self.ddp = self._wrap()
            return
        # What is alive now (torch's modules, the model) is left out of the collector's passes
        # from here on: a recovery's collections, which free the old group, then cost what
        # the loop made since, not the 0.2 s each that torch's imports cost (a warm start's
        # zygote did so before it forked). torch 2's first DistributedDataParallel imports
        # torch._dynamo (some 800 modules, 75 ms of each collection unfrozen): imported first.
        if importlib.util.find_spec("torch._dynamo") is not None:
            importlib.import_module("torch._dynamo")
        gc.freeze()
        if backend == "nccl":
            prepare_nccl(optimizer, lambda: self.world)
        self._fallback_code = int(os.environ["DLRUN_RECOVERY_FALLBACK"])
        self._replace_code = int(os.environ["DLRUN_RECOVERY_REPLACE"])
        self._store = self._connect()
        self._watch.start(
            KEYS, self.world, timeout, self._unblock, self._exit_replaced, self._move_key
        )
        if os.environ.get("DLRUN_RECOVERY_JOIN") == "1":
            self._recover(joining=True)  # a replacement: the survivors' next generation
        else:
            self._group.form(self._store, f"{KEYS}/0", self.rank, self.world, timeout)
            self.ddp = self._wrap()
        self._mark()

    def _mark(self, done=False, recovering=False):
        """The agent's sign that this rank recovers in process: where it finds none, a failure
        restarts the whole group, as for a program without this loop. A replacement's mark also
        says how its recovery went (the agent's "recovered" event); `done`: this rank left the
        loop, so a failure of it now restarts the whole group at once (no peer is left to meet
        a replacement); `recovering`: a survivor's collective failed and it is recovering (a
        lost node's: its agent keeps it running into the next round only then). Its step's
        time, `step_s`, tells a lost node's survivors' agent how long their step watch may take
        to free them (the agent's grace)."""
        with self._marking:
            self._write_mark(done, recovering)

    def _write_mark(self, done, recovering):
        record = {"pid": os.getpid(), "generation": self.generation, "step_s": self._marked_step_s}
        if self.last_recovery:
            record.update(at=self._recovered_at, phases=self.last_recovery)
        if done:
            record["done"] = True
        if recovering:
            record["recovering"] = True
        mark = os.path.join(os.environ["DLRUN_RECOVERY_DIR"], os.environ["LOCAL_RANK"])
        with open(f"{mark}.tmp", "w") as f:  # whole or not at all: the agent reads it any time
            json.dump(record, f)
        os.replace(f"{mark}.tmp", mark)

    def _mark_step_time(self, step_s):
        """The step's time marked again where it moved: more than half again as long as marked,
        or less than half (a few writes in a job, not one a step)."""
        self._watch.step_s = step_s
        if self._active and not self._marked_step_s / 2 <= step_s <= self._marked_step_s * 1.5:
            self._marked_step_s = step_s
            self._mark()

    def run(self, train_step, steps):
        """Calls train_step(step, ddp) for each step from self.step up to `steps`, once in
        effect: a step a peer's failure cut short runs again after the recovery. Under dlrun it
        ends with a barrier: no rank leaves while a peer may still fail in the last step (the
        recovery would wait for it in vain)."""
        import torch.distributed as dist

        while True:
            self._applied = False
            self._freed = False
            began = time.monotonic()
            self._watch.current = (self.generation, self.step)
            try:
                if self.step < steps:
                    train_step(self.step, self.ddp)
                    self._mark_step_time(time.monotonic() - began)
                    self.step += 1
                    progress.step(self.step)  # --hang-timeout's watch sees each step
                    if self._touch:
                        _memory.touch_heap(self._touch)
                        self._touch = 0
                    continue
                if not self._active:
                    return
                dist.barrier()
                # Said in the store first: a peer recovering now (its barrier cut short as this
                # rank's completed) can never meet this rank again, and falls back at once.
                try:
                    self._store.add(f"{KEYS}/done", 1)
                    _news.tell(self._store, f"{KEYS}/{self.generation + 1}/news")
                except RuntimeError:  # a hint only: without it, such a peer falls back later
                    pass
                self._mark(done=True)
                self._watch.leave(done=True)
                return
            except Exception as error:
                self._watch.leave()
                # A step the watch freed fails however it does (an aborted NCCL group is gone
                # from torch's registry: the next call on it says so).
                if not self._active or not (self._freed or _peer_failure(error)):
                    raise
                why = _describe(error)
            # Out of the except block: the traceback, which holds the old group, is gone.
            _say(f"step {self.step} failed ({why}); recovering")
            if self._applied:
                self.step += 1
            self._recover(joining=False)

    # --- the generations ---------------------------------------------------------------------

    def _wrap(self, synced=False):
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        options = dict(self._ddp_options)
        if synced and "init_sync" in inspect.signature(DistributedDataParallel).parameters:
            options.setdefault("init_sync", False)  # torch 2.4 and later
        return DistributedDataParallel(self.module, **options)

    def _state_to_send(self, keys, publish):
        """A sender's part of the state, readied before the new group forms (dlrun._state):
        the model, the optimizer, the step and `state`."""
        whole = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        return _state.ready(
            self._store, keys, whole, (self.step, self.state), self._group.device(), publish
        )

    def _take_state(self, plan, keys, flats, left):
        """The state sent in the new group as `plan` says ({receiver: its sender}); the
        receivers load it in place of their own (a survivor at the senders' step holds it
        already)."""
        device = self._group.device()
        broadcast = self.backend == "nccl"
        taken = _state.take(self._store, keys, plan, flats, device, left, broadcast)
        if taken is None:
            return
        (step, state), whole = taken
        self.module.load_state_dict(whole["model"])
        self.optimizer.load_state_dict(whole["optimizer"])
        self.step = step
        self.state.clear()
        self.state.update(state)

    def _unblock(self, why):
        """Fails the collective this rank may wait in (the step watch's first resort)."""
        self._freed = True
        _say(f"{why}; shutting its group's connections down")
        self._group.fail()

    def _move_key(self, generation):
        """The key of this rank's move to a round of `generation`, which its agent sets (the
        step watch looks for it)."""
        return f"{KEYS}/{generation}/move/{self.rank}"

    def _exit_replaced(self, why):
        """Ends this rank, which has not met the new generation, for its agent to start a
        replacement in its place (the mark says it recovers: a survivor's failure)."""
        self._marking.acquire()  # held as it exits: no later mark undoes this one
        self._write_mark(done=False, recovering=True)
        _say(f"{why}; exiting to be replaced (exit {self._replace_code})")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self._replace_code)

    def _recover(self, joining):
        progress.step(self.step)  # a recovery under way is no hang
        if not joining:
            self._mark(recovering=True)
        started = time.monotonic()
        deadline = started + RECOVERY_TIMEOUT_S
        try:
            phases = self._recover_within(joining, deadline)
        except Exception as error:  # a second failure, a deadline: the whole group restarts
            _say(
                f"recovery failed ({_describe(error)}); falling back to the "
                f"whole-group restart (exit {self._fallback_code})"
            )
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self._fallback_code)
        self.recoveries += 1
        took = time.monotonic() - started
        self.last_recovery = dict(phases, total=took)
        self._recovered_at = time.time()
        if not joining:
            self._mark()  # recovered (a replacement marks once its loop is made)
        _say(
            f"generation {self.generation}: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in phases)
            + f"; back at step {self.step} after {took:.3f} s"
        )

    def _await(self, counter, news, left, move=None):
        """Waits for the counter `counter` to be set, woken by the generation's news (dlrun._news):
        a rank that left the loop (past its last barrier) never comes, and the wait ends then,
        for the whole-group restart. With `move`, (the prefix of the counters the agent sets when
        a round kept its ranks, a node lost; this rank; the round it is met in, if any): returns
        its counter's value once it names a later round, else 0."""

        def look(store):
            if store.add(counter, 0) >= 1:
                return 0
            if move and (found := _move_after(store, *move)):
                return found
            if store.add(f"{KEYS}/done", 0) > 0:
                return LEFT
            return None

        found = _news.wait(self._store, news, look, left, self.step, self.world)
        if found == LEFT:
            raise RuntimeError("a rank has left the loop: the group cannot meet again")
        return found

    def _meet(self, keys, record, news, left, move):
        """Arrives in a generation's keys and waits for every rank; the move counter's value
        (see _await; `move`: its prefix and the round met in) where a round kept this rank
        meanwhile, else 0."""
        self._store.set(f"{keys}/rank/{self.rank}", record)
        if self._store.add(f"{keys}/arrived", 1) == self.world:
            self._store.add(f"{keys}/ready", 1)
            _news.tell(self._store, news)
            return 0  # the last to arrive: met (a waiting rank's look finds the same first)
        return self._await(f"{keys}/ready", news, left, move and (move[0], self.rank, move[1]))

    def _connect(self):
        """A client of the job's store; its connections in self._sockets (a forming group's
        watch shuts them down to end the formation)."""
        before = sockets()
        store = store_client(self.world, self._timeout)
        made = sockets().items()
        self._sockets = {fd: inode for fd, inode in made if inode not in before.values()}
        return store

    def _await_move(self, keys, met_in, left):
        """This rank's move counter in the generation's `keys` once it names a round later than
        `met_in`, within MOVE_WAIT_S (and the recovery's deadline); None when it does not."""
        until = time.monotonic() + MOVE_WAIT_S

        def within():
            if time.monotonic() >= until:
                raise TimeoutError(f"no move within {MOVE_WAIT_S} s")
            return min(left(), timedelta(seconds=until - time.monotonic()))

        look = self._move_look(keys, met_in)
        try:
            return _news.wait(self._store, f"{keys}/news", look, within, self.step, self.world)
        except (RuntimeError, TimeoutError):
            return None

    def _move_look(self, keys, met_in):
        """look(store): this rank's move counter in the generation's `keys` where it names a
        round later than `met_in`, else None."""
        return functools.partial(_move_after, prefix=f"{keys}/move", rank=self.rank, met_in=met_in)

    def _move(self, keys, moved):
        """This rank in the round that kept it (`moved`, the counter its agent set in the
        generation's `keys`): (the round, its keys); the rank and world size there taken."""
        met_in, rank = divmod(moved, MOVE_BASE)
        here = f"{keys}/round{met_in}"
        world = self._store.add(f"{here}/world", 0)
        if (rank - 1, world) != (self.rank, self.world):
            _say(f"now rank {rank - 1} of {world} (a node was lost; none took its place)")
        self.rank, self.world = rank - 1, world
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world))
        return met_in, here

    def _senders(self, keys):
        """{each rank that lacks the state: the rank that sends it}, from the records of the
        ranks met under `keys`. The survivors furthest along send: a rank whose optimizer
        stepped had the step's whole gradient sum (a ring all-reduce can complete on some ranks
        as a peer dies and not on others), so that step is done, and a rank behind it takes it
        from a sender. Every survivor at that step holds the same state (each applied the same
        all-reduced gradients as often): only the newcomers and the survivors behind are sent
        it, shared out among those survivors (NCCL: from the lowest, by a broadcast; it also
        publishes what is not a tensor)."""
        said = get_all(self._store, [f"{keys}/rank/{r}" for r in range(self.world)])
        records = [json.loads(record) for record in said]
        survivors = [r for r, record in enumerate(records) if record["survivor"]]
        if not survivors:
            raise RuntimeError("no rank survived to send the state")
        furthest = max(records[r]["step"] for r in survivors)
        senders = [r for r in survivors if records[r]["step"] == furthest]
        if self.backend == "nccl":
            senders = senders[:1]
        receivers = [
            r
            for r, record in enumerate(records)
            if not record["survivor"] or record["step"] != furthest
        ]
        return {r: senders[i % len(senders)] for i, r in enumerate(receivers)}

    def _recover_within(self, joining, deadline):
        import torch.distributed as dist

        phases = []
        mark = time.monotonic()

        def phase(name, at=None):
            nonlocal mark
            now = time.monotonic() if at is None else at
            phases.append((name, now - mark))
            mark = now

        def left():
            remaining = deadline - time.monotonic()
            if remaining <= 0.01:  # a store's timeout is whole milliseconds: less is none
                raise TimeoutError(f"no recovery within {RECOVERY_TIMEOUT_S} s")
            return timedelta(seconds=remaining)

        # The old group's sockets close only once nothing holds it (DDP does): a peer still
        # waiting on this rank then fails at once instead of at its timeout.
        self.ddp = None
        if not joining:  # a replacement has no group to leave
            self._group.leave(self._exit_replaced)
        phase("leave")
        # The generation every rank moves to: a survivor's next; a replacement's the one after
        # the last that completed (the survivors are on their way there).
        committed = self._store.add(f"{KEYS}/generation", 0)
        generation = committed + 1 if joining else self.generation + 1
        keys = here = f"{KEYS}/{generation}"
        if joining and os.environ.get("DLRUN_RECOVERY_ROUND"):
            # In a lost node's place: the round that kept the survivors has keys of its own.
            here = f"{keys}/round{os.environ['DLRUN_RECOVERY_ROUND']}"
        record = json.dumps({"survivor": not joining, "step": self.step})
        met_in = -1
        if (not joining or os.environ.get("DLRUN_RECOVERY_KEPT")) and here == keys:
            # A survivor its agent moved already (a round kept it, a node lost: its step watch
            # freed it on the move) meets in that round at once, not first under the
            # generation's keys; so does the replacement of a rank that failed once a round had
            # kept it (a look suffices: its agent moved them before starting it).
            if moved := _move_after(self._store, f"{keys}/move", self.rank, -1):
                met_in, here = self._move(keys, moved)
        while True:
            while moved := self._meet(
                here, record, f"{keys}/news", left, None if joining else (f"{keys}/move", met_in)
            ):
                # A node was lost and a round kept the survivors (their agents said so): they
                # meet again under its keys, with the newcomers, or alone in a smaller world,
                # renumbered.
                met_in, here = self._move(keys, moved)
            met = time.monotonic()
            plan = self._senders(here)
            # The senders ready the state while the ranks make the group (a newcomer's first
            # gloo group takes longest).
            flats = None
            if self.rank in plan.values():
                flats = self._state_to_send(here, publish=self.rank == min(plan.values()))
            look = None
            if not joining:  # a node lost as the group forms: its ranks never come
                look = (self._move_look(keys, met_in), self._sockets)
            try:
                moved = self._group.form(self._store, here, self.rank, self.world, left(), look)
            except Exception:
                # A peer that left the formation for the round that kept it may fail it here (a
                # connection to it closed); this rank's own move follows (its agent's, a moment
                # later) or the failure stands.
                if joining or not (moved := self._await_move(keys, met_in, left)):
                    raise
            else:
                if moved:  # the watch shut the store's connection down to end the formation
                    self._store = self._connect()
            if not moved:
                break
            # The round that kept this rank says where it meets now, as in the meet.
            met_in, here = self._move(keys, moved)
        keys = here
        phase("meet", met)
        phase("group")
        if plan:
            self._take_state(plan, keys, flats, left)
        flats = None  # sent: DDP's buckets take its pages
        # Every rank holds the senders' weights now: DDP's own first broadcast of them is spared.
        self.ddp = self._wrap(synced=True)
        dist.barrier()
        phase("state")
        self.generation = generation
        os.environ["DLRUN_RECOVERY_GENERATION"] = str(generation)  # dlrun.checkpoint reads it
        # Every rank commits it, before it can fail again (a compare-and-set, whoever is first):
        # the agent reads it to say where kept workers meet, a replacement to find the
        # survivors, and a sender alone could die between the barrier and its word.
        self._store.compare_set(f"{KEYS}/generation", str(generation - 1), str(generation))
        return phases
