"""A worker for test_dlrun_warm_start: records what it can see of how it was started, then acts.

Usage: warm_probe.py OUT_DIR [ACTION [ARG]]   (or python -m warm_probe OUT_DIR ...)
Writes OUT_DIR/probe_<TORCHELASTIC_RESTART_COUNT>_<RANK>.json first: the preloaded modules it
found (torch, numpy), its environment as os.environ and as a child process inherits it, sys.argv
and sys.orig_argv, the __main__ module's attributes, sys.path, cwd, pid, parent, process group,
session, parent-death signal, stdio (kinds of descriptors, buffering, encodings), signal
dispositions and mask, sitecustomize, sys.flags, umask, the descriptor limit, CPU affinity, its
threads and /proc/self/cmdline. Then ACTION (on every attempt unless said):
  exit CODE       exits CODE
  kill SIGNAL     kills itself with SIGNAL (core dumps off)
  raise           raises RuntimeError("probe raised")
  wait-fail CODE  attempt 0: waits for OUT_DIR/go, then exits CODE; later attempts exit 0
  ddp             a DistributedDataParallel step over gloo (env://), recorded in
                  OUT_DIR/ddp_<attempt>_<rank>.json; attempt 0 then waits to be stopped, later
                  attempts exit 0
  (none)          exits 0
"""

import sys

PRELOADED = sorted(m for m in ("torch", "numpy") if m in sys.modules)
PATH = list(sys.path)  # before this file's own insert below

import ctypes  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import (  # noqa: E402
    MAX_WAIT_S,
    exit_past_torch_teardown,
    wait_to_be_stopped,
    write_json,
)


def fd_kind(fd):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return target.split(":")[0] if ":[" in target else target


def stream(s):
    if s is None:
        return None
    return {
        "type": type(s).__name__,
        "name": s.name,
        "mode": getattr(s, "mode", None),
        "encoding": s.encoding,
        "errors": s.errors,
        "line_buffering": s.line_buffering,
        "write_through": s.write_through,
        "buffer": type(s.buffer).__name__,
    }


def main_module():
    main = sys.modules["__main__"]
    return {
        "keys": [k for k in vars(main) if k.startswith("__")],
        "__name__": main.__name__,
        "__file__": getattr(main, "__file__", None),
        "__spec__": None if main.__spec__ is None else [main.__spec__.name, main.__spec__.origin],
        "__package__": main.__package__,
        "__cached__": getattr(main, "__cached__", None),
        "__loader__": type(main.__loader__).__name__,
        "__doc__": main.__doc__[:40],
        "__builtins__": type(main.__builtins__).__name__,
    }


def child_environment():
    """The environment a child process inherits: the C library's, not os.environ's copy."""
    out = subprocess.run(["/usr/bin/env", "-0"], env=None, capture_output=True, check=True).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if item)


def parent_death_signal():
    value = ctypes.c_int(-1)
    ctypes.CDLL(None).prctl(2, ctypes.byref(value))  # PR_GET_PDEATHSIG
    return value.value


def record():
    umask = os.umask(0o22)
    os.umask(umask)
    site = sys.modules.get("sitecustomize")
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0") if a]
    return {
        "preloaded": PRELOADED,
        "env": dict(os.environ),
        "child_env": child_environment(),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "executable": sys.executable,
        "main": main_module(),
        "path": PATH,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "pdeathsig": parent_death_signal(),
        "fds": [fd_kind(fd) for fd in (0, 1, 2)],
        "stdio": [stream(s) for s in (sys.stdin, sys.stdout, sys.stderr)],
        "signals": {
            signal.Signals(s).name if s in signal.Signals._value2member_map_ else str(s): repr(
                signal.getsignal(s)
            )
            for s in sorted(signal.valid_signals())
            if s not in (signal.SIGKILL, signal.SIGSTOP)
        },
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ())),
        "sitecustomize": getattr(site, "__file__", None),
        "flags": repr(sys.flags),
        "umask": umask,
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads": len(os.listdir("/proc/self/task")),
        "cmdline": cmdline,
    }


def ddp_step(out_dir, attempt, rank):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    model(torch.randn(8, 4)).sum().backward()
    grad = model.module.weight.grad.clone()
    grads = [torch.zeros_like(grad) for _ in range(dist.get_world_size())]
    dist.all_gather(grads, grad)
    write_json(
        os.path.join(out_dir, f"ddp_{attempt}_{rank}.json"),
        {
            "pid": os.getpid(),
            "world": dist.get_world_size(),
            "preloaded": PRELOADED,
            "replicas_agree": all(torch.equal(g, grad) for g in grads),
        },
    )
    if attempt == 0:
        wait_to_be_stopped()
    dist.destroy_process_group()
    exit_past_torch_teardown(0)


def main():
    out_dir = sys.argv[1]
    action = sys.argv[2] if len(sys.argv) > 2 else ""
    arg = sys.argv[3] if len(sys.argv) > 3 else ""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    write_json(os.path.join(out_dir, f"probe_{attempt}_{rank}.json"), record())
    if action == "exit":
        return int(arg)
    if action == "kill":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), getattr(signal, arg))
        time.sleep(MAX_WAIT_S)
        return 5
    if action == "raise":
        raise RuntimeError("probe raised")
    if action == "wait-fail":
        if attempt > 0:
            return 0
        go = os.path.join(out_dir, "go")
        deadline = time.monotonic() + MAX_WAIT_S
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        return int(arg)
    if action == "ddp":
        ddp_step(out_dir, attempt, rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
