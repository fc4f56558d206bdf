"""What frees a rank of dlrun.recovery's loop stuck in a collective: its process group's
connections shut down (gloo has no abort), and a watch on the step under way for peers that
have moved on to the next generation."""

import os
import socket
import threading
import time

from dlrun._job import store_client

WATCH_S = 0.5  # a step under way this long (or twice the last step's time) is looked at


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
    """A thread that frees this rank when it is still in a step of its generation while its
    peers meet in the next: they left its group, so the step can never finish, whatever it
    waits on (a peer stuck in turn; a gloo collective that, now and then, waits out its timeout
    though its peers closed or left the group; an NCCL collective on a dead peer, which never
    fails). First the group's connections are shut down (NCCL: its communicators aborted),
    which fails a collective waiting on them, and the rank recovers in its process; one look
    later, still in that step, it exits with the agent's replace code, to be replaced like a
    dead worker. Without it such a step ends at torch's group timeout. Looks at the store only
    while a step has lasted a whole look: never in a step of usual length."""

    def __init__(self):
        self.step_s = 0.0  # the last step's time
        self.current = None  # (generation, step) of the step under way; a new tuple each step

    def start(self, keys, world, timeout, unblock, exit_replaced):
        """Under dlrun: the looks begin (outside it, the loop's notes go nowhere). `keys`: the
        generations' keys in the job's store (dlrun.recovery's); `unblock` and `exit_replaced`:
        the loop's two resorts, each called with why."""
        self._keys, self._world, self._timeout = keys, world, timeout
        self._unblock, self._exit_replaced = unblock, exit_replaced
        self._store = None  # its own client: the loop's may be in use as it looks
        threading.Thread(target=self._run, name="dlrun-step-watch", daemon=True).start()

    def _peers_meet(self, generation):
        try:
            if self._store is None:
                self._store = store_client(self._world, self._timeout)
            return self._store.add(f"{self._keys}/{generation + 1}/arrived", 0) > 0
        except (RuntimeError, OSError):  # the store out of reach: asked again at the next look
            self._store = None
            return False

    def _run(self):
        seen, meeting, freed = None, False, False
        while True:
            time.sleep(max(WATCH_S, 2 * self.step_s))
            current = self.current
            if current is None or current is not seen:
                seen, meeting, freed = current, False, False
                continue
            # No step ended for a whole look. Acts once the peers were found meeting on two
            # looks in a row: a rank merely slow to reach its failing collective gets there
            # within a step's time.
            was_meeting, meeting = meeting, self._peers_meet(current[0])
            if not (was_meeting and meeting) or self.current is not current:
                continue
            why = (
                f"still in step {current[1]} of generation {current[0]} while the others "
                "meet in the next"
            )
            if not freed:
                freed = True
                self._unblock(why)
            else:
                self._exit_replaced(why)
