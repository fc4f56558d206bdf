"""How store_sequence.py makes and records a step's client calls: fresh torch TCPStore clients,
each call's value or exception class and its timing class, calls left blocked in the background
and the trigger that wakes them; and the steps' registry (STEPS, in the order they run).
"""

import hashlib
import json
import threading
import time
from datetime import timedelta

import torch.distributed as dist

IMMEDIATE_S = 1.5  # generous: two shared cores run several of these sequences at once
BLOCK_CHECK_S = 1.0  # how long a background call must stay blocked before its trigger
FINISH_GRACE_S = 10  # past its own timeout, how long a background call may take to return
CONNECT_TIMEOUT_S = 60
HAS_USE_LIBUV = hasattr(dist.TCPStore, "libuvBackend")
PRINT_LOCK = threading.Lock()


def plain(value):
    """A JSON form of a client call's result."""
    if isinstance(value, bytes):
        if len(value) > 64:
            return {"bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}
        return {"bytes": value.hex()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def capture(fn):
    start = time.monotonic()
    try:
        value, error = plain(fn()), None
    except Exception as e:  # the class is the recorded behaviour
        value, error = None, type(e).__name__
    return value, error, start, time.monotonic()


class Background:
    """A call run on its own thread, to observe it block and be released by another client."""

    def __init__(self, fn):
        self.done = None
        self.thread = threading.Thread(
            target=lambda: setattr(self, "done", capture(fn)), daemon=True
        )
        self.thread.start()


class Step:
    def __init__(self, run, name):
        self.run, self.name = run, name
        self.results = []
        self.triggered_at = None

    def client(self, timeout_s=None):
        return self.run.client(timeout_s or self.run.timeout_s)

    def k(self, name):
        return f"{self.name}/{name}"

    def record(self, label, value, error, timing):
        self.results.append([label, {"value": value, "error": error, "timing": timing}])

    def call(self, label, fn):
        value, error, start, end = capture(fn)
        # A TypeError comes from the bindings before anything is sent, and its message names
        # the store, whose repr may wait seconds on a reverse DNS lookup: its time is noise.
        timing = "client-side" if error == "TypeError" else self.timing(end - start)
        self.record(label, value, error, timing)
        return value

    def timing(self, elapsed):
        if elapsed < IMMEDIATE_S:
            return "immediate"
        if elapsed >= 0.9 * self.run.timeout_s:
            return "timeout"
        return "slow"

    def blocked(self, label, *calls):
        """Records, for each background call, whether it is still blocked after BLOCK_CHECK_S."""
        deadline = time.monotonic() + BLOCK_CHECK_S
        for c in calls:
            c.thread.join(max(0.0, deadline - time.monotonic()))
        self.record(label, [c.thread.is_alive() for c in calls], None, "immediate")

    def trigger(self, label, fn):
        self.triggered_at = time.monotonic()
        return self.call(label, fn)

    def finish(self, label, call):
        call.thread.join(self.run.timeout_s + FINISH_GRACE_S)
        if call.done is None:
            return self.record(label, None, "still blocked", "hang")
        value, error, start, end = call.done
        timing = self.timing(end - start)
        trigger = self.triggered_at
        if (
            trigger is not None
            and start + 0.9 * BLOCK_CHECK_S <= trigger <= end
            and end - trigger < IMMEDIATE_S
            and timing != "timeout"
        ):
            timing = "woken"
        self.record(label, value, error, timing)


class Run:
    def __init__(self, host, port, libuv, timeout_s):
        self.host, self.port, self.libuv, self.timeout_s = host, port, libuv, timeout_s

    def client(self, timeout_s):
        # Connecting may take seconds here: torch looks up the server's name, and a DNS server
        # that is slow to say "no such name" would fail a connect bound by the step's timeout.
        options = {"use_libuv": self.libuv} if HAS_USE_LIBUV else {}
        store = dist.TCPStore(
            self.host, self.port, None, False, timedelta(seconds=CONNECT_TIMEOUT_S), **options
        )
        store.set_timeout(timedelta(seconds=timeout_s))
        return store

    def run(self, name, ops, body):
        if not all(hasattr(dist.TCPStore, op) for op in ops):
            return
        step = Step(self, name)
        body(step)
        line = json.dumps({"step": name, "ops": sorted(ops), "results": step.results})
        with PRINT_LOCK:  # one whole line at a time from the servers' threads
            print(line, flush=True)


STEPS = []


def step(*ops):
    """Registers a step; `ops` are the client methods it calls (it runs only where all exist)."""

    def register(body):
        STEPS.append((body.__name__, list(ops), body))
        return body

    return register


def td(seconds):
    return timedelta(seconds=seconds)
