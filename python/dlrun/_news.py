"""What wakes the ranks of dlrun.recovery meeting in a generation (agents/recovery.h, newsKey).

Whoever has news for the meeting (the last rank to arrive, an agent whose ranks a round kept, a
rank that left the loop) counts it in the job's store once its cause is there and sets that
count's key. A waiting rank reads the count, looks at the causes, then waits for the next
count's key in one store request: a store's wait is for all of its keys, not any, and polling
would be a request a millisecond a rank, a million a second for 10,000 ranks.

Meanwhile a thread beats the progress board (a rank waiting for a replacement's start is
recovering, not hung: --hang-timeout) and, now and then, looks at the causes itself on a client
of its own: news counted whose key was never set (its teller's reply lost, its connection gone)
then costs a few seconds, not the recovery's deadline."""

import threading
from datetime import timedelta

from dlrun import progress
from dlrun._job import store_client

BEAT_S = 1.0  # a wait beats the progress board this often
LOOK_BEATS = 3  # and its thread looks at the causes every so many beats


def tell(store, news):
    """News for the ranks waiting on `news`, its cause in the store already."""
    store.set(f"{news}/{store.add(news, 1)}", "1")


def wait(store, news, look, left, step, world):
    """What look(store) finds (anything but None), once it finds it. `left()`: the time left, a
    timedelta, raising past the deadline; `step`: the step the progress board is beaten at;
    `world`: the job's, for the thread's own client."""
    seen = [0]  # the count this rank read last, for the thread
    with _Watch(news, look, seen, step, world):
        while True:
            seen[0] = store.add(news, 0)  # before the looks: news after it sets the next key
            found = look(store)
            if found is not None:
                return found
            try:  # one wait to the deadline: torch 1.13 leaves a late answer to a timed-out one
                store.wait([f"{news}/{seen[0] + 1}"], left())
            except RuntimeError:
                left()  # past the deadline: says so
                raise


class _Watch:
    """The waiting rank's thread: the board's beat, and a look at the causes every LOOK_BEATS
    beats; where it finds one the rank did not hear of, it sets the key the rank waits for."""

    def __init__(self, news, look, seen, step, world):
        self._news, self._look, self._seen, self._step, self._world = news, look, seen, step, world
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dlrun-recovery-watch", daemon=True)

    def __enter__(self):
        self._thread.start()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()  # at most a store request's timeout (below) when one is under way

    def _run(self):
        client, beats = None, 0
        while not self._stop.wait(BEAT_S):
            progress.step(self._step)
            beats += 1
            if beats % LOOK_BEATS:
                continue
            try:
                if client is None:
                    client = store_client(self._world, timedelta(seconds=BEAT_S * LOOK_BEATS))
                seen = self._seen[0]
                if self._look(client) is not None and not self._stop.is_set():
                    client.set(f"{self._news}/{seen + 1}", "1")
            except RuntimeError:  # the store out of reach: the rank's own wait says so
                client = None
