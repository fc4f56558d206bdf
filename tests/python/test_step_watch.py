"""dlrun.recovery's step watch (python/dlrun/_stuck.py) against a real store (dlrund), under
torch 2.13, without a training job: the loop's side is played here by setting `current` as the
loop does and recording the watch's two resorts.

- A rank still in a step of its generation once a peer arrived in the next is freed (its first
  resort), and, still in that step, a look later told to exit (its second), each naming it.
- A rank whose loop's thread waits idle in the step (its collective posted) is freed at once;
  one whose thread computes is given the grace (twice a step) to reach its collective first.
- Where its agent moves it on (a node of the group lost), it is freed as a rank in a step that
  cannot end, not one merely still in it: at once, also when another arrival came first (the
  grace cut short).
- A rank that left the step when freed (recovering) is not told to exit; one whose thread
  computes on in it (slow, not stuck) is told only once it waits idle.
- A rank that ended the step and is in the generation's next step is freed again there (the
  next step can never finish either).
- No arrival in the next generation: nothing is freed, however long the step.
- The loop leaving its step waits for a freeing under way (never two NCCL aborts at once).
"""

import os
import sys
import threading
import time
import unittest
from datetime import timedelta

from dlrund_fixture import main, start_dlrund

sys.path.insert(0, os.environ["DLRUN_PYTHONDIR"])
from dlrun import _stuck  # noqa: E402

KEYS = "/dlrun/recovery"
EVENT_S = 10  # far above the watch's grace (50 ms) and look (0.5 s)


def compute_until(event, seconds):
    """The loop's thread (this one) computes until `event` is set or `seconds` passed; whether
    it was set."""
    until = time.monotonic() + seconds
    while not event.is_set() and time.monotonic() < until:
        pass
    return event.is_set()


class Resorts:
    """The loop's two resorts as the watch calls them, each call an event."""

    def __init__(self, hold=None):
        self.freed, self.exited = [], []
        self.freed_event, self.exited_event = threading.Event(), threading.Event()
        self.hold = hold  # an event the first resort waits for (a slow abort)

    def unblock(self, why):
        self.freed.append(why)
        self.freed_event.set()
        if self.hold:
            self.hold.wait(EVENT_S)

    def exit_replaced(self, why):
        self.exited.append(why)
        self.exited_event.set()


class StepWatchTest(unittest.TestCase):
    def setUp(self):
        store = start_dlrund(self)
        os.environ.update(MASTER_ADDR=store.host, MASTER_PORT=str(store.port))
        import torch.distributed as dist

        self.store = dist.TCPStore(
            store.host, store.port, 2, False, timedelta(seconds=EVENT_S), wait_for_workers=False
        )

    def watch(self, resorts, move_key=None):
        watch = _stuck.StepWatch()
        watch.start(
            KEYS, 2, timedelta(seconds=EVENT_S), resorts.unblock, resorts.exit_replaced, move_key
        )
        self.addCleanup(watch.leave, True)
        return watch

    def arrive(self, generation):
        self.store.add(f"{KEYS}/{generation}/arrived", 1)

    def freed_in_step_5(self, hold=None):
        """A watch whose rank is in step 5 of generation 0 as a peer arrives in generation 1:
        (its resorts, the watch), once it was freed."""
        resorts = Resorts(hold)
        watch = self.watch(resorts)
        watch.current = (0, 5)
        self.arrive(1)
        self.assertTrue(resorts.freed_event.wait(EVENT_S), "not freed")
        return resorts, watch

    def test_a_rank_still_in_its_step_is_freed_then_told_to_exit(self):
        resorts, _ = self.freed_in_step_5()
        self.assertTrue(resorts.exited_event.wait(EVENT_S), "not told to exit")
        why = "still in step 5 of generation 0 while the others meet in the next"
        self.assertEqual((resorts.freed, resorts.exited), ([why], [why]))

    def test_a_rank_busy_in_its_step_is_told_to_exit_only_once_idle(self):
        # Freed, the loop's thread (this one) computes on for three looks: slow, not stuck (its
        # collective failed and its cores are busy); once it waits idle, it is told to exit.
        resorts, _ = self.freed_in_step_5()
        busy_until = time.monotonic() + 3 * _stuck.WATCH_S
        while time.monotonic() < busy_until:
            pass
        self.assertEqual(resorts.exited, [])
        self.assertTrue(resorts.exited_event.wait(EVENT_S), "not told to exit once idle")

    def long_step_watch(self, resorts, move_key=None):
        """A watch whose rank is in step 5 of generation 0, its steps as long as the test's
        waits (the grace twice that)."""
        watch = self.watch(resorts, move_key)
        watch.step_s = EVENT_S
        watch.current = (0, 5)
        return watch

    def test_a_rank_waiting_idle_in_its_step_is_freed_before_the_grace_ends(self):
        resorts = Resorts()
        self.long_step_watch(resorts)
        self.arrive(1)
        self.assertTrue(resorts.freed_event.wait(EVENT_S), "not freed before the grace's end")
        why = "still in step 5 of generation 0 while the others meet in the next"
        self.assertEqual(resorts.freed, [why])

    def test_a_rank_computing_in_its_step_is_given_the_grace(self):
        resorts = Resorts()
        watch = self.watch(resorts)
        watch.step_s = 0.5  # the grace: 1 s
        watch.current = (0, 5)
        self.arrive(1)
        self.assertFalse(compute_until(resorts.freed_event, 0.5), "freed while it computed")
        self.assertTrue(resorts.freed_event.wait(EVENT_S), "not freed after the grace")

    def moved_watch(self, resorts, looked, looking=None):
        """A long step's watch (long_step_watch) whose move keys asked for are recorded in
        `looked` (and the event `looking` set then)."""

        def move_key(generation):
            looked.append(generation)
            if looking:
                looking.set()
            return f"{KEYS}/{generation}/move/0"

        return self.long_step_watch(resorts, move_key)

    def test_a_rank_its_agent_moved_on_is_freed_as_in_a_step_that_cannot_end(self):
        resorts, looked = Resorts(), []
        watch = self.moved_watch(resorts, looked)
        self.store.set(f"{KEYS}/1/move/0", "1000001")  # the agent's move, then the arrival's key
        self.store.add(f"{KEYS}/1/arrived", 0)
        self.assertTrue(resorts.freed_event.wait(EVENT_S), "not freed within the grace")
        watch.leave()
        self.assertEqual(looked, [1])
        lost = "in step 5 of generation 0 as a node of the group was lost"
        self.assertEqual(resorts.freed, [lost])

    def test_a_move_after_another_arrival_cuts_the_grace_short(self):
        # Another node's agent (or a replacement) arrived first; this rank's own agent moves it
        # on while the watch gives its computing loop the grace (twice the test's waits).
        resorts, looked, looking = Resorts(), [], threading.Event()
        watch = self.moved_watch(resorts, looked, looking)
        self.arrive(1)
        self.assertTrue(compute_until(looking, EVENT_S), "the watch never looked for the move")
        self.store.set(f"{KEYS}/1/move/0", "1000001")
        self.assertTrue(compute_until(resorts.freed_event, EVENT_S), "not freed within the grace")
        watch.leave()
        lost = "in step 5 of generation 0 as a node of the group was lost"
        self.assertEqual(resorts.freed, [lost])

    def test_a_rank_that_left_its_step_when_freed_is_not_told_to_exit(self):
        resorts, watch = self.freed_in_step_5()
        watch.leave()  # its collective failed: it recovers
        self.assertFalse(resorts.exited_event.wait(2 * _stuck.WATCH_S + 0.5))
        self.assertEqual(len(resorts.freed), 1)

    def test_the_generations_next_step_is_freed_too(self):
        resorts, watch = self.freed_in_step_5()
        resorts.freed_event.clear()
        watch.current = (0, 6)  # step 5 ended after all; step 6 can never end either
        self.assertTrue(resorts.freed_event.wait(EVENT_S), "step 6 not freed")
        self.assertIn("still in step 6 of generation 0", resorts.freed[-1])
        watch.leave()
        self.assertEqual(len(resorts.exited), 0)

    def test_nothing_is_freed_without_an_arrival_in_the_next_generation(self):
        resorts = Resorts()
        watch = self.watch(resorts)
        watch.current = (0, 5)
        self.arrive(0)  # this generation's own arrivals say nothing
        self.assertFalse(resorts.freed_event.wait(1.0))

    def test_leaving_the_step_waits_for_a_freeing_under_way(self):
        hold = threading.Event()
        resorts, watch = self.freed_in_step_5(hold)
        left = threading.Event()
        leaving = threading.Thread(target=lambda: (watch.leave(), left.set()))
        leaving.start()
        self.assertFalse(left.wait(0.3), "the loop left its step while it was being freed")
        hold.set()
        self.assertTrue(left.wait(EVENT_S), "the loop never left its step")
        leaving.join()
        self.assertEqual(len(resorts.exited), 0)


if __name__ == "__main__":
    main()
