"""dlrun's warm-start zygote (agents/warm_start.h, docs/guides/warm-start.md).

The dlrun agent runs it as `INTERPRETER [OPTIONS] dlrun_warm_start.py MODULES STANDBYS --
WORKER_ARGV`, under the workers' own interpreter and options, with the node's common environment
and its control socket as stdin (WORKER_ARGV, the longest of its workers', only makes room for
each worker's own argv in /proc/PID/cmdline). It imports MODULES (comma-separated), answers
Ready (or Refused, one line, and exits), then forks one worker per Spawn request (the frames of
agents/warm_start_wire.h), or hands the request to a worker it forked ahead (Standby; up to
STANDBYS of them, the node's worker count).

Each worker becomes what `INTERPRETER [OPTIONS] SCRIPT ARGS` (or `-m MODULE ARGS`) started by
the agent would be: environment, working directory, sys.argv, sys.path, __main__, stdio (-u
too), process group, parent (the agent: the zygote forks a middle child that forks the worker
and exits), parent-death signal, signal dispositions and mask, sitecustomize, and Python's own
exit codes: SystemExit's, 1 after an uncaught exception's traceback, death by SIGINT after an
uncaught KeyboardInterrupt.
"""

import os
import signal
import sys

# A fresh interpreter's state, as the agent's fresh workers start with it: taken before
# anything else runs, since this process is a fresh interpreter started as they are.
_FRESH = {
    "signals": {
        sig: signal.getsignal(sig)
        for sig in signal.valid_signals()
        if sig not in (signal.SIGKILL, signal.SIGSTOP)
    },
    "mask": signal.pthread_sigmask(signal.SIG_BLOCK, ()),
    "path": list(sys.path),
    "pythonpath": None if sys.flags.ignore_environment else os.environ.get("PYTHONPATH"),
    "stdio": [
        (s.encoding, s.errors) if s is not None else None
        for s in (sys.stdin, sys.stdout, sys.stderr)
    ],
    "unbuffered": sys.stdout is not None and sys.stdout.write_through,
}

import ctypes  # noqa: E402  (after the snapshot above)
import io  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402


def _beside(name):
    """dlrun's module `name`, from the file beside this one whatever sys.path holds (-I, -P)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(name, os.path.join(here, f"{name}.py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_beside("dlrun_warm_start_wire")
from dlrun_warm_start_wire import (  # noqa: E402
    FAILED,
    READY,
    REFUSED,
    SPAWN,
    SPAWNED,
    Spawn,
    frame,
    receive,
    set_cpus,
    take_on,
    text_frame,
)

PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61
SELF = (lambda: None).__code__.co_filename  # this file, as its frames name it
RESERVE = b"DLRUN_RECOVERY_RESERVE"  # agents/recovery.h: a worker started ahead (--ready-spares)
STANDBY_IDLE_S = 1.0  # a standby worker is forked after so long without a request (Standby)
_AGENT = os.getppid()  # the zygote is the agent's child
_FORKS_CLOSE = []  # the zygote's own sockets (control, a standby's): closed in every worker
_libc = ctypes.CDLL(None, use_errno=True)


def preload(modules):
    """Imports `modules`; None, or why this zygote cannot serve (one line)."""
    import importlib
    import importlib.util

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit and KeyboardInterrupt refuse too
            return f"cannot import {name} (--preload): {type(e).__name__}: {e}"
    torch = sys.modules.get("torch")
    if "torch" in modules and importlib.util.find_spec("torch._dynamo") is not None:
        # torch 2's first optimizer or DistributedDataParallel imports torch._dynamo (some 800
        # modules, 1-2 s): once here, not again in every worker and replacement.
        try:
            importlib.import_module("torch._dynamo")
        except Exception:  # a speed-up only: the worker imports it itself then
            pass
    if "torch" in modules:
        # dlrun's in-process recovery (and dlrun.progress with it), some 10 ms of a replacement's
        # start otherwise: it starts no thread at import, and progress reopens its board in a fork.
        try:
            importlib.import_module("dlrun.recovery")
        except Exception:  # a speed-up only, as above
            pass
    try:
        cuda = torch is not None and torch.cuda.is_initialized()
    except Exception:
        cuda = False
    if cuda:
        return (
            "CUDA was initialised while preloading (torch.cuda.is_initialized()), and a "
            "forked worker cannot use it: preload no module that initialises CUDA"
        )
    import threading

    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        return (
            f"preloading started Python threads ({', '.join(threads)}), which a forked "
            "worker would not have: preload no module that starts threads at import"
        )
    return None


def parse_command(argv):
    """('script' or 'module', target, arguments) of a Python command line, as the agent's
    warm::parsePythonCommand read it."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg == "-" or not arg.startswith("-"):
            break
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        for j, c in enumerate(arg[1:], 1):
            if c in "mWX":
                value = arg[j + 1 :]
                if not value:
                    i += 1
                    value = argv[i]
                if c == "m":
                    return "module", value, argv[i + 1 :]
                break
        i += 1
    return "script", argv[i], argv[i + 1 :]


def prctl(option, value):
    _libc.prctl(
        ctypes.c_int(option),
        ctypes.c_ulong(value),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )


def retitle(argv):
    """/proc/self/cmdline (ps, pkill -f) shows `argv`, as far as the zygote's own had room: the
    kernel reads it from this process's original argv area, which setproctitle rewrites too."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48, 49
        data = b"\0".join(os.fsencode(a) for a in argv)[: end - start - 1]
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    except (OSError, ValueError, IndexError):
        pass  # the zygote's command line stays


def fresh_stdio():
    """sys.stdin, stdout and stderr over descriptors 0, 1 and 2, as CPython makes them."""
    unbuffered = _FRESH["unbuffered"]
    streams = []
    for fd, (name, mode) in enumerate((("<stdin>", "r"), ("<stdout>", "w"), ("<stderr>", "w"))):
        encoding, errors = _FRESH["stdio"][fd] or (None, None)
        buffering = 0 if unbuffered and mode == "w" else -1
        try:
            buf = open(fd, mode + "b", buffering, closefd=False)
        except OSError:
            streams.append(None)
            continue
        raw = buf if buffering == 0 else buf.raw
        raw.name = name
        line = not unbuffered and (raw.isatty() or fd == 2)
        stream = io.TextIOWrapper(
            buf, encoding, errors, newline="\n", line_buffering=line, write_through=unbuffered
        )
        stream.mode = mode
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def fresh_path(kind, target):
    """sys.path as CPython computes it for this command, cwd and PYTHONPATH."""
    safe = getattr(sys.flags, "safe_path", False)
    own = _FRESH["pythonpath"]
    rest = _FRESH["path"][(0 if safe else 1) + (len(own.split(os.pathsep)) if own else 0) :]
    head = []
    if not safe:
        head.append(
            os.getcwd()
            if kind == "module"
            else os.path.dirname(os.path.realpath(os.path.join(os.getcwd(), target)))
        )
    pythonpath = None if sys.flags.ignore_environment else os.environ.get("PYTHONPATH")
    if pythonpath:
        head += [os.path.abspath(p) for p in pythonpath.split(os.pathsep)]
    sys.path[:] = head + rest
    import importlib

    importlib.invalidate_caches()  # directories written since the zygote looked


def fresh_signals():
    for sig, handler in _FRESH["signals"].items():
        if handler is not None:
            try:
                signal.signal(sig, handler)
            except (OSError, ValueError, RuntimeError):
                pass
    signal.set_wakeup_fd(-1)


def rerun_site():
    """sitecustomize (dlrun's stack hook among them) and usercustomize from the worker's path."""
    if sys.flags.no_site:
        return
    import site

    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()
    if site.ENABLE_USER_SITE:
        sys.modules.pop("usercustomize", None)
        site.execusercustomize()


def become_worker(request, fds):
    """In the worker: wait for the agent's go, take on the worker's state. Never returns."""
    try:
        stdin, stdout, stderr, go = fds
        if os.read(go, 1) != b"g":
            os._exit(127)  # the agent is gone
        # --ready-spares: a worker started ahead keeps the go socket, over which its place
        # comes (dlrun/_reserve.py); the variable names it.
        reserve = any(entry.startswith(RESERVE + b"=") for entry in request.env)
        if not reserve:
            os.close(go)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != request.agent:
            os._exit(127)  # the agent died before the line above
        prctl(PR_SET_PTRACER, request.agent)
        take_on(request, (stdin, stdout, stderr))
        if reserve:
            os.set_inheritable(go, False)
            os.environ[RESERVE.decode()] = str(go)
        retitle(request.argv)
        kind, target, args = parse_command(request.argv)
        fresh_stdio()
        fresh_path(kind, target)
        fresh_signals()  # before sitecustomize, whose stack hook registers a signal
        rerun_site()
        signal.pthread_sigmask(signal.SIG_SETMASK, _FRESH["mask"])
    except BaseException as e:
        os.write(
            2,
            f"dlrun warm start: cannot set up the worker: {type(e).__name__}: {e}\n".encode(
                errors="replace"
            ),
        )
        os._exit(127)
    os._exit(run(request.argv, kind, target, args))


def fresh_main():
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    return main


def run_script(main, path, program):
    filename = os.path.join(os.getcwd(), path)  # absolute, not normalised, as CPython's
    try:
        with io.open_code(filename) as f:
            source = f.read()
    except OSError as e:
        sys.stderr.write(
            f"{program}: can't open file {filename!r}: [Errno {e.errno}] {e.strerror}\n"
        )
        return 2
    main.__file__ = filename
    main.__cached__ = None
    import importlib.machinery

    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", filename)
    exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)
    return 0


def print_exception(e):
    """As PyErr_Print: the traceback from the program's own first frame."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == SELF:
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.excepthook(type(e), e, tb)


def exit_code(e):
    """SystemExit's code as CPython's exit."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < (1 << 63) else 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def run(argv, kind, target, args):
    """The program as __main__, then Python's finalisation; the exit code."""
    main = fresh_main()
    sys.orig_argv = list(argv)
    interrupted = False
    try:
        if kind == "module":
            import runpy

            sys.argv = ["-m", *args]
            code = 0
            runpy._run_module_as_main(target, alter_argv=True)
        else:
            sys.argv = [target, *args]
            code = run_script(main, target, argv[0])
    except SystemExit as e:
        code = exit_code(e)
    except BaseException as e:
        print_exception(e)
        code = 1
        interrupted = isinstance(e, KeyboardInterrupt)
    if kind == "script":
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__cached__", None)
    return finish(code, interrupted)


def finish(code, interrupted):
    """Py_FinalizeEx's visible part: threads joined, atexit, stdio flushed."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException as e:
            print_exception(e)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:
            code = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    return code


def spawn(request, fds):
    """Forks the worker of `request` (a Spawn; None: a standby, fds its socket's) through a
    middle child, which exits once the worker leads its process group: the worker is reparented
    to the agent. The reply frame."""
    r, w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        middle = os.fork()
    except OSError as e:
        for fd in (r, w, *fds):
            os.close(fd)
        return text_frame(FAILED, f"fork: {e.strerror}")
    if middle == 0:
        try:
            os.close(r)
            problem = set_cpus(request.cpus) if request else None
            if problem:
                os.write(w, b"E" + problem.encode())
                os._exit(0)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                for sock in _FORKS_CLOSE:
                    sock.close()
                os.setpgid(0, 0)
                if request:
                    become_worker(request, fds)
                stand_by(socket.socket(fileno=fds[0]), _AGENT)
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass  # it did so itself
            os.write(w, b"P" + struct.pack("<I", pid))
        except BaseException as e:
            os.write(w, f"E{type(e).__name__}: {e}".encode(errors="replace"))
        os._exit(0)
    os.close(w)
    for fd in fds:
        os.close(fd)
    os.waitpid(middle, 0)
    os.set_blocking(r, False)
    try:
        said = os.read(r, 1 << 16)
    except BlockingIOError:
        said = b""
    os.close(r)
    if said[:1] == b"P" and len(said) == 5:
        return frame(SPAWNED, said[1:])
    if said[:1] == b"E":
        return text_frame(FAILED, said[1:].decode(errors="replace"))
    return text_frame(FAILED, "the middle child ended without a word")


class Standby:
    """A worker forked ahead of its request, waiting for it on a socket pair (stand_by): a start
    then costs no fork (two of them, some 30 ms for an interpreter that imported torch, most of
    a replacement's start under --recovery=in-process). Made once the zygote has had no request
    for STANDBY_IDLE_S, so its forks never take a core from a start or a recovery under way."""

    def __init__(self):
        self.pid = None
        self.sock, theirs = socket.socketpair()
        _FORKS_CLOSE.append(self.sock)  # a worker forked later must not hold it open
        reply = spawn(None, [theirs.detach()])
        if reply[4] != SPAWNED:
            self.close()
            return
        (self.pid,) = struct.unpack_from("<I", reply, 5)
        try:  # its parent is the agent now (the middle child was reaped): it may watch it
            self.sock.sendall(b"r")
        except OSError:
            self.close()
            self.pid = None

    def take(self, frame_bytes, fds):
        """Hands the Spawn frame and its descriptors to the standby: the reply frame, or None
        when the standby is gone (the caller forks the worker then)."""
        try:
            sent = socket.send_fds(self.sock, [frame_bytes], fds)
            if sent < len(frame_bytes):  # not sendall(b""): a send to a closed peer fails
                self.sock.sendall(frame_bytes[sent:])
            said = self.sock.recv(1 << 16)
        except OSError:  # it answered nothing: it is gone, or going (it runs no worker)
            said = b""
        self.close()
        if said[:1] not in (b"P", b"E"):
            return None
        for fd in fds:  # the standby holds them now
            os.close(fd)
        if said[:1] == b"P":
            return frame(SPAWNED, struct.pack("<I", self.pid))
        return text_frame(FAILED, said[1:].decode(errors="replace"))

    def close(self):
        if self.sock is not None:
            _FORKS_CLOSE.remove(self.sock)
            self.sock.close()
            self.sock = None


def stand_by(sock, agent):
    """In a standby: waits for its Spawn frame, then becomes that worker. Never returns; ends
    with the zygote (its socket's end) or, once reparented, with the agent."""
    try:
        if sock.recv(1) == b"r":
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != agent:
            os._exit(0)
        body, fds = receive(sock)
        if body is None or body[0] != SPAWN or len(fds) != 4:
            os._exit(0)
        request = Spawn(body[1:])
        problem = set_cpus(request.cpus)
        sock.sendall(b"E" + problem.encode(errors="replace") if problem else b"P")
        if problem:
            os._exit(0)
        sock.close()
    except BaseException:  # the zygote went away mid-way: there is no worker to become
        os._exit(0)
    become_worker(request, fds)


def control_socket():
    """The agent's socket, moved off stdin (which becomes /dev/null)."""
    ctl = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return ctl


def main():
    import time

    ctl = control_socket()
    modules = [m for m in sys.argv[1].split(",") if m] if len(sys.argv) > 1 else []
    wanted = int(sys.argv[2])
    began = time.monotonic()
    problem = preload(modules)
    if problem:
        ctl.sendall(text_frame(REFUSED, problem))
        return 0
    import gc

    gc.collect()
    gc.freeze()  # the forks' collections then leave the shared pages alone
    version = ".".join(map(str, sys.version_info[:3]))
    ctl.sendall(
        text_frame(
            READY,
            f"Python {version} (pid {os.getpid()}) ready, "
            f"{', '.join(modules) or 'no module'} imported in "
            f"{time.monotonic() - began:.2f} s",
        )
    )
    _FORKS_CLOSE.append(ctl)
    # One for each of the node's workers: a restart of them all (a whole-group restart, a
    # lost node's ranks on a spare) forks none. Each after a quiet second of its own.
    standbys = []
    while True:
        if len(standbys) < wanted and not select.select([ctl], [], [], STANDBY_IDLE_S)[0]:
            standby = Standby()
            if standby.pid is not None:
                standbys.append(standby)
            continue
        body, fds = receive(ctl)
        if body is None:
            return 0  # the agent is gone
        if body[0] != SPAWN or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a frame of kind {body[0]} with {len(fds)} descriptors")
        reply = None
        while reply is None and standbys:  # one gone meanwhile: the next, else a fork
            reply = standbys.pop(0).take(struct.pack("<I", len(body)) + body, fds)
        ctl.sendall(reply or spawn(Spawn(body[1:]), fds))


if __name__ == "__main__":
    sys.exit(main())
