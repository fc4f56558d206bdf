"""What dlrun's worker-side modules share: the job's store as a worker reaches it, a thread
beside the training loop, and their lines on stderr."""

import os
import queue
import sys
import threading
import time

POLL_S = 0.005  # count_reaches looks again so often


def store_client(world, timeout):
    """A client of the store at MASTER_ADDR:MASTER_PORT (torch's TCPStore), no waiting for the
    others."""
    import torch.distributed as dist

    # Without libuv in the workers' torch (USE_LIBUV=0), rank 0's torch serves the store once
    # init_process_group ran: a client that asks for libuv would be refused. A torch before
    # libuv (1.13) has no such choice to make.
    options = {}
    if os.environ.get("USE_LIBUV") == "0" and hasattr(dist.TCPStore, "libuvBackend"):
        options["use_libuv"] = False
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        False,
        timeout,
        wait_for_workers=False,
        **options,
    )


def count_reaches(store, key, count, wait_s):
    """Whether the store's counter `key` reaches `count` within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while store.add(key, 0) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def get_all(store, keys):
    """The values of `keys` (each set already), in one request where the store client has
    multi_get (torch 2), else one each."""
    if hasattr(store, "multi_get"):
        return store.multi_get(keys)
    return [store.get(key) for key in keys]


def say(module, text):
    """`module`'s line for the user, naming this worker's rank."""
    print(
        f"dlrun.{module}: rank {os.environ.get('RANK', '?')}: {text}", file=sys.stderr, flush=True
    )


class Beside:
    """A thread that runs one function at a time beside the training loop, for as long as the
    process (dlrun.checkpoint's saves): handing it a save's completion costs no thread's start
    (which waits for the new thread to run, some 0.1-0.3 ms on busy cores)."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        self.idle = threading.Event()
        self.idle.set()
        self.thread = None

    def run(self, function, *args):
        """Runs function(*args) there; the one before must be done (wait)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name="dlrun-checkpoint", daemon=True)
            self.thread.start()
        self.idle.clear()
        self.jobs.put((function, args))

    def wait(self):
        self.idle.wait()

    def _serve(self):
        while True:
            function, args = self.jobs.get()
            try:
                function(*args)
            except Exception as error:  # said, and the thread serves on: later work waits
                say("checkpoint", f"work beside the loop failed ({type(error).__name__}: {error})")
            finally:
                self.idle.set()
