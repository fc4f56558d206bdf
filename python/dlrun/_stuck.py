"""What frees a rank of dlrun.recovery's loop stuck in a collective: its process group's
connections shut down (gloo has no abort), and a watch on the step under way for peers that
have moved on to the next generation."""

import os
import socket
import threading
import time
from datetime import timedelta

from dlrun._job import store_client

# A rank still in a step of its generation once a peer arrived in the next is left this long
# (or twice the last step's time) to fail by itself, then freed; a look later (WATCH_S, or
# twice the step's time), still in that step and idle since, it exits to be replaced.
GRACE_S = 0.05
WATCH_S = 0.5
# A loop that used more than BUSY_SHARE of a core since the last look is not stuck but slow (its
# collective failed; its cores busy): it is looked at again, up to BUSY_S in all, before it
# exits. Less is a wait's (one that polls, as torch's NCCL blocking wait, uses a little).
BUSY_SHARE = 0.04
BUSY_S = 5.0
# Within the grace the rank is looked at every LOOK_S: freed at once where its agent moved it on
# (a node lost: no step of its generation can end), or where IDLE_LOOKS looks in a row find the
# loop's thread asleep, its CPU time moved less than IDLE_CPU_S (it waits, its collective
# posted: it would learn of the failure only as its neighbours' old groups close, one after
# another). A thread that computes, or waits for a core, is given the grace: freed before it
# posts its collective, it would post it on connections already shut down.
LOOK_S = 0.0025
IDLE_LOOKS = 3
IDLE_CPU_S = 0.0002
# One store wait's length, renewed: a wait that timed out leaves the store's late answer on its
# connection, so the next is asked on a new client.
WAIT_S = 3600
IDLE_S = 0.01  # between a recovery's end and the first step of the new generation
RETRY_S = 0.5  # the store out of reach: asked again so much later


def sockets():
    """This process's open sockets: {fd: "socket:[inode]"}."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own fd among them)
            continue
        if link.startswith("socket:"):
            found[int(fd)] = link
    return found


def shut_down(group_sockets):
    """Shuts down the connected TCP sockets among `group_sockets` ({fd: inode}, as sockets())
    that are still the same sockets: their pending reads and writes fail here and at the peer.
    A listening socket is left alone (gloo's listener ends the process on an error)."""
    for fd, inode in group_sockets.items():
        try:
            dup = os.dup(fd)  # shares the connection; checked after: the fd may be another's now
        except OSError:  # closed meanwhile
            continue
        try:
            if f"socket:[{os.fstat(dup).st_ino}]" != inode:
                continue
            with socket.socket(fileno=os.dup(dup)) as sock:
                if (
                    sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.type == socket.SOCK_STREAM
                    and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                ):
                    sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # not connected: nothing to end
            pass
        finally:
            os.close(dup)


class StepWatch:
    """A thread that frees this rank when it is still in a step of its generation once a peer
    arrived in the next: that peer left its group, so the step can never finish, whatever it
    waits on (a peer stuck in turn; a gloo collective that, now and then, waits out its timeout
    though its peers closed or left the group: gloo fails no send already queued for writing
    when its connection fails; an NCCL collective whose peers are not the dead
    rank's neighbours, which NCCL never fails). It waits in the store for the next generation's
    first arrival (nothing is exchanged meanwhile, whatever the steps); then, the rank still in
    that step after a grace (cut short once its loop's thread waits idle), the group's
    connections are shut down (NCCL: its communicators aborted), which fails a collective
    waiting on them, and the rank recovers in its process; a look later, still in that step and
    its thread idle since (a thread that used CPU is slow, not stuck: its cores busy, it is
    looked at again for a while), it exits with the agent's replace code, to be replaced like a
    dead worker. Without it such a step ends at torch's group timeout."""

    def __init__(self):
        self.step_s = 0.0  # the last step's time
        self.current = None  # (generation, step) of the step under way; a new tuple each step
        self._lock = threading.Lock()  # the loop leaves a step only once a freeing under way ended
        self._done = False

    def start(self, keys, world, timeout, unblock, exit_replaced, move_key=None):
        """Under dlrun: the watch begins (outside it, the loop's notes go nowhere). `keys`: the
        generations' keys in the job's store (dlrun.recovery's); `unblock` and `exit_replaced`:
        the loop's two resorts, each called with why; `move_key(generation)`: the key this
        rank's agent makes as it keeps the rank for `generation` (a node of the group was lost:
        at 0 at once, then naming the round that kept it; no step of theirs can end, and the
        rank is freed as soon as the key is there, the grace cut short). No one else makes it
        while the rank is in a step of the generation before (the loop reads it once it
        recovers). Called from the thread that runs the loop's steps (its CPU time is
        watched)."""
        self._keys, self._world, self._timeout = keys, world, timeout
        self._unblock, self._exit_replaced, self._move_key = unblock, exit_replaced, move_key
        self._store = None  # its own client: the loop's may be in use meanwhile
        self._loop_clock = time.pthread_getcpuclockid(threading.get_ident())  # the loop's thread
        self._loop_stat = f"/proc/self/task/{threading.get_native_id()}/stat"
        threading.Thread(target=self._run, name="dlrun-step-watch", daemon=True).start()

    def leave(self, done=False):
        """The loop is out of its step (it failed, or the loop ended: `done`): nothing is freed
        from now on. Returns once a freeing under way ended (an NCCL abort is never run twice at
        once)."""
        with self._lock:
            self.current = None
            self._done = done

    def _arrived(self, generation):
        """Waits until a rank arrived in `generation`: True then, False where the store failed
        (after a pause)."""
        try:
            if self._store is None:
                self._store = store_client(self._world, self._timeout)
            self._store.wait([f"{self._keys}/{generation}/arrived"], timedelta(seconds=WAIT_S))
            return True
        except (RuntimeError, OSError):  # out of reach, or the wait's time up: a new client
            self._store = None
            time.sleep(RETRY_S)
            return False

    def _run(self):
        handled = None  # the generation whose successor's first arrival was acted on
        while not self._done:
            current = self.current
            if current is None or current[0] == handled:
                time.sleep(IDLE_S)  # recovering, or the first step of a generation not begun
                continue
            if self._arrived(current[0] + 1):
                self._free(current[0])
                handled = current[0]

    def _grace(self, step, generation, grace):
        """Looks at the rank in `step` every LOOK_S for `grace` seconds: "moved" where its agent
        moved it on to `generation` (its move key set, whoever arrived first), "waits" where its
        loop's thread waits idle; None once the grace is over or the step is. (Not a store wait
        with a timeout: torch warns of each one that times out, and its late answer would cost
        a new client.)"""
        until = time.monotonic() + grace
        idle, used = 0, None
        while self.current is step:
            if self._moved(generation):
                return "moved"
            was, used = used, time.clock_gettime(self._loop_clock)
            asleep = self._loop_asleep() and (was is None or used - was < IDLE_CPU_S)
            idle = idle + 1 if asleep else 0
            if idle >= IDLE_LOOKS:
                return "waits"
            left = until - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, LOOK_S))
        return None

    def _moved(self, generation):
        """Whether this rank's agent moved it on to `generation`; False where the store is out
        of reach (the grace as it is)."""
        if self._move_key is None:
            return False
        try:
            if self._store is None:
                self._store = store_client(self._world, self._timeout)
            return self._store.check([self._move_key(generation)])
        except (RuntimeError, OSError):
            self._store = None
            return False

    def _loop_asleep(self):
        """Whether the loop's thread sleeps (its state S or D: neither running nor waiting for
        a core)."""
        try:
            with open(self._loop_stat, "rb") as stat:
                return stat.read().rsplit(b")", 1)[1][1:2] in (b"S", b"D")
        except (OSError, IndexError):  # not readable: not known to sleep
            return False

    def _free(self, generation):
        """Frees each step of `generation` this rank is found in, after the grace (a rank merely
        slow to reach its failing collective gets there within a step's time), or as soon as
        its loop waits idle or its agent moves it on (a node of the group lost: a host gone
        silent never fails its collective), until it is out of that generation: recovering, or
        in a later one."""
        while True:
            step = self.current
            if step is None or step[0] != generation:
                return
            if self._grace(step, generation + 1, max(GRACE_S, 2 * self.step_s)) == "moved":
                why = (
                    f"in step {step[1]} of generation {generation} as a node of the group was lost"
                )
            else:
                why = (
                    f"still in step {step[1]} of generation {generation} while the others meet "
                    "in the next"
                )
            with self._lock:
                if self.current is not step:
                    continue  # a step of this generation ended: the next is watched the same way
                self._unblock(why)
                used = time.clock_gettime(self._loop_clock)  # its thread alive while in a step
            self._exit_if_stuck(step, why, used)

    def _exit_if_stuck(self, step, why, used):
        """Once freed (`used`: the loop thread's CPU time then): a look later, the loop still in
        `step` and idle since (it waits on something the freeing did not end), it exits to be
        replaced; a loop that computed meanwhile is looked at again, until BUSY_S passed."""
        look = max(WATCH_S, 2 * self.step_s)
        until = time.monotonic() + max(BUSY_S, look)
        while True:
            time.sleep(look)
            with self._lock:  # the loop cannot be leaving the step meanwhile
                if self.current is not step:
                    return
                before, used = used, time.clock_gettime(self._loop_clock)
                if used - before < BUSY_SHARE * look or time.monotonic() >= until:
                    self._exit_replaced(why)
                    return
