"""Preemption for dlrun.checkpoint (should_stop): SIGTERM as a request to stop, and the step
every rank stops at, agreed through the job's store under the checkpoints' keys."""

import os

from dlrun._job import count_reaches, say

STOP_WAIT_S = 10  # rank 0 serving the store waits so long for its peers to stop


class Preemption:
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


preemption = Preemption()


class Stop:
    """The step the job stops at. `client()` makes a store client of its own (a thread that
    completes saves uses the other); `keys`, the checkpoints' keys in it."""

    def __init__(self, client, keys):
        self.client, self.keys = client, keys
        self.store = None
        self.at = None  # the step the job stops at, once agreed
        self.told = False  # this rank counted its SIGTERM in the store
        self.stopping = False  # this rank counted itself as stopping (_together)

    def asks(self, step, looked, rank, world, finish):
        """True at the agreed step. The first rank to see a request (its own SIGTERM, or the
        count in the store) names the step two after its own. No rank is past it: a rank
        finishing that step met this one in its collectives after the name was written. And
        every rank learns of it by then without a request of its own each step: `looked`, the
        count as the thread completing its save of this step or the one before saw it after
        that step's collectives, so after this rank had seen it (None: ask the store now).
        `finish` waits until this rank's last save is counted."""
        if self.at is None:
            tell = preemption.asked and not self.told
            self.told = self.told or tell
            asked = None if tell else looked
            if asked is None:
                asked = self._store().add(f"{self.keys}/stop-asked", 1 if tell else 0)
            if asked > 0:
                named = self._store().compare_set(f"{self.keys}/stop-at", "", str(step + 2))
                self.at = int(named)
        if self.at is None or step < self.at:
            return False
        if step > self.at:
            say(
                "checkpoint",
                f"step {step} is past step {self.at}, where the job stops (should_stop() not "
                "called every step): stopping here",
            )
        if not self.stopping:
            self.stopping = True
            self._together(rank, world, finish)
        return True

    def _store(self):
        if self.store is None:
            self.store = self.client()
        return self.store

    def _together(self, rank, world, finish):
        """Where rank 0's torch serves the store (TORCHELASTIC_USE_AGENT_STORE=False), the store
        ends with rank 0's process: each rank's save is counted, then the rank counts itself as
        stopping (its last request to the store), and rank 0 stays until every rank has
        (STOP_WAIT_S at most: a rank gone or that never asks again does not keep the job)."""
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "False":
            return
        finish()
        try:
            self._store().add(f"{self.keys}/stopping", 1)
        except RuntimeError:  # rank 0 no longer waited: its stop is this rank's all the same
            say("checkpoint", "the job's store ended with rank 0 before this rank said it stops")
            return
        if rank != 0:
            return
        if not count_reaches(self._store(), f"{self.keys}/stopping", world, STOP_WAIT_S):
            say(
                "checkpoint",
                f"not every rank said it stops within {STOP_WAIT_S} s; this rank ends, and with "
                "it the job's store (its torch serves it)",
            )
