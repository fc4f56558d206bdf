"""The frames between the dlrun agent and its warm-start zygote (python/dlrun_warm_start.py),
as agents/warm_start_wire.h writes and reads them: a little-endian u32 length, a kind byte, the
body; texts as a u32 length and their bytes. Their codec, receive(), which reads one from the
control socket with the descriptors sent with it, and what a worker takes on from a start's
request (take_on, set_cpus): where the zygote forks it, and where a worker started ahead takes
its place (dlrun/_reserve.py)."""

import ctypes
import os
import socket
import struct
import threading

SPAWN = 1  # the agent's one request
READY, REFUSED, SPAWNED, FAILED = 1, 2, 3, 4  # the zygote's answers
MAX_FRAME = 64 << 20


def frame(kind, payload=b""):
    return struct.pack("<IB", 1 + len(payload), kind) + payload


def text_frame(kind, text):
    data = " ".join(str(text).split("\n")).encode("utf-8", "replace")
    return frame(kind, struct.pack("<I", len(data)) + data)


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def u32(self):
        (value,) = struct.unpack_from("<I", self.data, self.at)
        self.at += 4
        return value

    def text(self):
        size = self.u32()
        value = bytes(self.data[self.at : self.at + size])
        if len(value) != size:
            raise ValueError("a field runs past the frame")
        self.at += size
        return value

    def texts(self):
        return [self.text() for _ in range(self.u32())]


class Spawn:
    """One Spawn frame: what the worker is to become."""

    def __init__(self, body):
        r = Reader(body)
        self.agent = r.u32()
        self.argv = [os.fsdecode(a) for a in r.texts()]
        self.env = r.texts()
        self.cwd = r.text()
        self.cpus = [r.u32() for _ in range(r.u32())]


def receive(ctl):
    """The next frame's body and the descriptors that came with it; (None, []) at the end."""
    data, fds, flags, _ = socket.recv_fds(ctl, 1 << 16, 8)
    if flags & getattr(socket, "MSG_CTRUNC", 0):
        raise ValueError("descriptors were lost on the way")
    while 0 < len(data) < 4:
        more = ctl.recv(4 - len(data))
        if not more:
            break
        data += more
    if len(data) < 4:
        return None, fds
    (length,) = struct.unpack_from("<I", data)
    if length == 0 or length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes")
    while len(data) < 4 + length:
        more = ctl.recv(min(1 << 20, 4 + length - len(data)))
        if not more:
            return None, fds
        data += more
    return data[4:], fds


def take_on(request, stdio):
    """The worker's own part of `request` (a Spawn): its standard streams from `stdio` (three
    descriptors, closed here), its working directory, its environment (wholesale: os.environ
    and the C library's alike). Its CPUs: set_cpus."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    for fd in set(stdio):
        os.close(fd)
    if request.cwd:
        os.chdir(request.cwd)
    os.environ.clear()
    ctypes.CDLL(None).clearenv()
    for entry in request.env:
        key, sep, value = entry.partition(b"=")
        if sep and key:
            os.environb[key] = value


def set_cpus(cpus):
    """Runs this process on `cpus` (all when empty): None, or why it cannot (one line). The
    calling thread first, whose error is the answer; then every other thread of it (a worker
    started ahead may have some), listed again until no new one appears (a thread ended
    meanwhile is passed over)."""
    if not cpus:
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        return f"cannot run on CPUs {cpus} (--numa-binding): {e.strerror}"
    done = {threading.get_native_id()}
    while True:
        try:
            tasks = {int(task) for task in os.listdir("/proc/self/task")} - done
        except OSError:  # no /proc: the calling thread's CPUs are set
            return None
        if not tasks:
            return None
        for task in tasks:
            try:
                os.sched_setaffinity(task, cpus)
            except ProcessLookupError:
                pass
        done |= tasks
