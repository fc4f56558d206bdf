"""What wakes the ranks of dlrun.recovery meeting in a generation (python/dlrun/_news.py) against
a real store (dlrund), without a training job: a rank waiting there as the loop does, played by a
thread, and the news told by this test.

- News told once its cause is in the store wakes the waiting rank, which finds the cause; news
  whose cause another rank's look does not find leaves it waiting.
- News told before the rank reads the count: found by its first look, no wait.
- News counted whose key was never set (its teller's reply lost): the rank's own thread finds the
  cause within a few beats, long before the deadline.
- No news: the wait ends at its deadline with TimeoutError, after a few requests, not a poll
  (dlrund's count of ADDs over a wait of 4 s).
"""

import os
import re
import signal
import sys
import threading
import time
import unittest
from datetime import timedelta

from dlrund_fixture import main, start_dlrund

sys.path.insert(0, os.environ["DLRUN_PYTHONDIR"])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
from dlrun import _news  # noqa: E402
from worker_util import client_options, lacks_libuv  # noqa: E402

NEWS = "dlrun/recovery/1/news"
CAUSE = "dlrun/recovery/1/ready"
EVENT_S = 20  # the waits' deadline: far above the thread's look (3 s)


class NewsTest(unittest.TestCase):
    def setUp(self):
        self.dlrund = start_dlrund(self, "--stats")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.dlrund.port))
        # As dlrun tells workers whose torch lacks libuv (Debian 13's): the thread's client too.
        if lacks_libuv():
            os.environ["USE_LIBUV"] = "0"
        else:
            os.environ.pop("USE_LIBUV", None)
        self.teller = self.client()

    def client(self):
        import torch.distributed as dist

        return dist.TCPStore(
            "127.0.0.1",
            self.dlrund.port,
            2,
            False,
            timedelta(seconds=EVENT_S),
            wait_for_workers=False,
            **client_options(),
        )

    def waiting(self, deadline_s=EVENT_S):
        """A rank waiting for CAUSE in a thread of this process: (thread, outcome), the outcome
        {"found": ..., "error": ..., "after": seconds} once it returns."""
        store, outcome = self.client(), {}
        deadline = time.monotonic() + deadline_s

        def left():
            remaining = deadline - time.monotonic()
            if remaining <= 0.01:
                raise TimeoutError("no news within the deadline")
            return timedelta(seconds=remaining)

        def look(client):
            return "ready" if client.add(CAUSE, 0) >= 1 else None

        def run():
            began = time.monotonic()
            try:
                outcome["found"] = _news.wait(store, NEWS, look, left, 7, 2)
            except Exception as error:
                outcome["error"] = error
            outcome["after"] = time.monotonic() - began

        thread = threading.Thread(target=run)
        thread.start()
        return thread, outcome

    def until_waiting(self):
        """Until the waiting rank has read the count and looked (its wait under way, or about to
        be: news told from here on wakes it)."""
        while int(self.stats().get("ADD", 0)) < 2:
            time.sleep(0.01)

    def stats(self):
        """dlrund's counts now (--stats, on SIGUSR1)."""
        self.dlrund.proc.send_signal(signal.SIGUSR1)
        while not (line := self.dlrund.proc.stdout.readline().decode()).startswith("dlrund stats:"):
            pass
        return dict(re.findall(r"(\w+)=(\d+)", line))

    def test_news_once_its_cause_is_in_the_store_wakes_the_rank(self):
        self.only_news_wakes()
        thread, outcome = self.waiting()
        self.until_waiting()
        _news.tell(self.teller, NEWS)  # no cause yet: the rank looks and waits again
        self.teller.add(CAUSE, 1)
        _news.tell(self.teller, NEWS)
        thread.join(EVENT_S)
        self.assertEqual(outcome.get("found"), "ready", outcome)

    def test_news_told_before_the_rank_waits_is_found_by_its_first_look(self):
        self.only_news_wakes()
        self.teller.add(CAUSE, 1)
        _news.tell(self.teller, NEWS)
        thread, outcome = self.waiting()
        thread.join(EVENT_S)
        self.assertEqual(outcome.get("found"), "ready", outcome)

    def test_news_counted_but_never_set_is_found_by_the_ranks_thread(self):
        thread, outcome = self.waiting()
        self.until_waiting()
        self.teller.add(CAUSE, 1)
        self.teller.add(NEWS, 1)  # its teller's SET never came
        thread.join(EVENT_S)
        self.assertEqual(outcome.get("found"), "ready", outcome)  # not the deadline's error

    def test_no_news_ends_the_wait_at_its_deadline_after_a_few_requests(self):
        # 4 s: the rank's thread looks once meanwhile; a poll every few milliseconds would be
        # hundreds of requests.
        thread, outcome = self.waiting(deadline_s=4)
        thread.join(EVENT_S)
        self.assertIsInstance(outcome.get("error"), TimeoutError, outcome)
        self.assertLess(int(self.stats()["ADD"]), 12, outcome)

    def only_news_wakes(self):
        """The rank's thread never looks during this test: news alone can end the wait."""
        looks = _news.LOOK_BEATS
        _news.LOOK_BEATS = 10**6
        self.addCleanup(setattr, _news, "LOOK_BEATS", looks)


if __name__ == "__main__":
    main()
