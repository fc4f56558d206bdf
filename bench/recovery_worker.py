"""The training job of bench/recovery_bench.py: torch DDP over gloo on CPU, an MLP of about
1.2 M parameters (784-1024-384-10, 4.8 MB; --widths makes another), SGD, a checkpoint every
step. With --backend nccl, on CUDA through NCCL (each rank's device: worker_util.device_for).

Usage: recovery_worker.py --out DIR [--widths 784,1024,384,10] [--step-seconds S] [--max-seconds T]
                          [--backend gloo|nccl]
Runs under a launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...) or started by hand with
that environment (the benchmark's floor). Files in DIR:
- procs/<incarnation>.json: this process (rank, host, pid and start time), written at its start
  (a spare's worker started ahead, dlrun --ready-spares: once its loop placed it), so the
  benchmark can find the worker or the host to kill.
- checkpoint.pt: written by rank 0 after every step, to a temporary name and renamed (a crash
  leaves the previous one whole); loaded at the start by every rank, so a restart resumes.
- steps.jsonl: rank 0 appends one line when it starts ({"kind": "resume", "step": the
  checkpoint's step, whether it read the checkpoint, and the times of its start-up phases}) and
  one per step, after that step's checkpoint is in place ({"kind": "step", "step": N, "time":
  time.time()}). A step line thus means "checkpointed": a later resume from an older step
  would take a step twice. The wall clock, not a monotonic one: the benchmark compares these
  times with its own across network namespaces (one kernel, one clock). Under dlrun
  --recovery=in-process the loop is dlrun.recovery's: a replacement reads no checkpoint (its
  state comes from a survivor), and rank 0 writes a resume line after each recovery too, with
  the recovery's phases, as a new incarnation.
- stop: the benchmark's request to end; every rank sees the same answer each step (a one-element
  all-reduce), so all leave together and exit 0.
Each line carries the process's incarnation (a random id): the benchmark tells the restarted
job's first step from a step the old one was finishing when the fault came. Under dlrun every
step is reported through dlrun.progress, which --hang-timeout watches.
"""

import time

PROCESS_START = time.time()  # before the imports: they are part of a worker's start

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from datetime import timedelta  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "workers"))
from worker_util import device_for, exit_past_torch_teardown, write_json  # noqa: E402

WIDTHS = "784,1024,384,10"  # the layers' widths: the input, the hidden ones, the classes
BATCH = 64
# Collectives give up after this long: a peer lost for good fails the step (and the worker),
# which is how a launcher that does not notice the loss still gets a failure to act on.
PG_TIMEOUT_S = 60


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--widths",
        default=WIDTHS,
        type=lambda text: [int(w) for w in text.split(",")],
        help="the MLP's layer widths, comma-separated (a bigger model: more "
        "state to send, to load and to build)",
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.1,
        help="the least time between steps (a step that takes longer goes on "
        "at once): leaves the shared cores to the launchers' restarts",
    )
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=600,
        help="exit 3 after this long: a worker whose launcher and benchmark "
        "are gone (torchrun's workers do not die with their agent) ends anyway",
    )
    return parser.parse_args()


def start_ticks():
    """This process's start time in clock ticks (/proc/self/stat): with the PID, it names the
    process even where its command line is another's (dlrun --warm-start forks the workers from
    a Python that started as its own program)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def append_line(path, record):
    """One write(2) of the whole line on an O_APPEND descriptor: a kill leaves no half line
    between two whole ones."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def save_atomic(torch, state, path):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


class Stop(Exception):
    """Every rank saw the stop file: the loop ends (not a peer's failure: dlrun.recovery lets
    it through)."""


def make_model(torch, widths):
    torch.manual_seed(0)
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def load_checkpoint(torch, path, model, optimizer, device):
    """The step of the checkpoint at `path` loaded into model and optimizer, 0 if none."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def dlrun_progress():
    """dlrun.progress under dlrun (its hang watch sees each step), else None."""
    try:
        import dlrun.progress
    except ImportError:
        return None
    return dlrun.progress


def main():
    args = parse_args()
    incarnation = os.urandom(6).hex()

    def note_process():
        write_json(
            os.path.join(args.out, "procs", f"{incarnation}.json"),
            {
                "rank": int(os.environ["RANK"]),
                "world": int(os.environ["WORLD_SIZE"]),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ticks": start_ticks(),
                "inc": incarnation,
                "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            },
        )

    os.makedirs(os.path.join(args.out, "procs"), exist_ok=True)
    # dlrun --ready-spares: a worker started ahead on a spare has no rank until dlrun.recovery's
    # loop gives it one; the benchmark finds it once it has.
    reserve = bool(os.environ.get("DLRUN_RECOVERY_RESERVE"))
    started = PROCESS_START
    if not reserve:
        note_process()
    # The safety net of --max-seconds: a daemon timer, so no step waits for it.
    timer = threading.Timer(args.max_seconds, os._exit, (3,))
    timer.daemon = True
    timer.start()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    imported = time.time()
    torch.set_num_threads(1)
    timeout = timedelta(seconds=PG_TIMEOUT_S)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    steps_file = os.path.join(args.out, "steps.jsonl")
    # Under dlrun --recovery=in-process the loop is dlrun.recovery's: a replacement gets its
    # state from a survivor and reads no checkpoint.
    in_process = reserve or bool(os.environ.get("DLRUN_RECOVERY_DIR"))
    reads_checkpoint = os.environ.get("DLRUN_RECOVERY_JOIN") != "1"
    device = device_for(args.backend)
    if not in_process:
        dist.init_process_group(args.backend, init_method="env://", timeout=timeout)
    joined = time.time()
    model = make_model(torch, args.widths).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = load_checkpoint(torch, checkpoint, model, optimizer, device) if reads_checkpoint else 0
    if in_process:
        import dlrun.recovery

        def warmup(model):
            """A worker started ahead (--ready-spares) takes a pass of its own first: its first
            step in the job runs warm, as the survivors' do."""
            x = torch.randn(BATCH, args.widths[0], device=device)
            y = torch.zeros(BATCH, dtype=torch.long, device=device)
            torch.nn.functional.cross_entropy(model(x), y).backward()

        loop = dlrun.recovery.Loop(
            model, optimizer, backend=args.backend, timeout=timeout, warmup=warmup
        )
        if reserve:  # its start, for the benchmark: when it was placed (its recovery began)
            placed = loop.last_recovery["total"] if loop.last_recovery else 0.0
            started = time.time() - placed
            note_process()
        if reads_checkpoint:
            loop.step = step
        joined = time.time()
    else:
        loop = None
        ddp = DistributedDataParallel(model)
    rank = int(os.environ["RANK"])
    seen = {"generation": loop.generation if loop else 0, "failed": None}

    def rank0():
        """Whether this process is rank 0 now: a round that kept the survivors of a lost node
        without a spare gives them new ranks in process (loop.rank)."""
        return (loop.rank if loop else rank) == 0

    def resume(start, recovery=None):
        """Rank 0's resume line: at its start, and after each recovery in process (`start`:
        when its failed step raised), with the recovery's phases."""
        append_line(
            steps_file,
            {
                "kind": "resume",
                "step": loop.step if loop else step,
                "inc": inc(),
                "world": dist.get_world_size(),
                "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                "checkpoint": reads_checkpoint and not recovery,
                "recovery": recovery,
                "start": start,
                "imported": imported,
                "joined": joined,
                "loaded": time.time(),
            },
        )

    def inc():
        """A generation after a recovery in process is an incarnation of its own."""
        return incarnation + (f".{seen['generation']}" if seen["generation"] else "")

    if rank0():
        resume(started, loop.last_recovery if loop else None)
    stop_path = os.path.join(args.out, "stop")
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step(done, ddp):
        """Step `done + 1`: its batch depends on the step and rank only, so a resumed job sees
        the same data."""
        if loop and loop.generation != seen["generation"]:
            seen["generation"] = loop.generation
            if rank0():
                resume(seen["failed"] or started, loop.last_recovery)
        began = time.monotonic()
        number = done + 1
        try:
            generator = torch.Generator().manual_seed(number * 1000 + rank)
            x = torch.randn(BATCH, args.widths[0], generator=generator).to(device)
            y = torch.randint(0, args.widths[-1], (BATCH,), generator=generator).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            if rank0():
                save_atomic(
                    torch,
                    {
                        "step": number,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    checkpoint,
                )
                append_line(
                    steps_file,
                    {
                        "kind": "step",
                        "step": number,
                        "time": time.time(),
                        "inc": inc(),
                        "world": dist.get_world_size(),
                    },
                )
            stop = torch.tensor([1 if os.path.exists(stop_path) else 0], device=device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        except Exception:
            seen["failed"] = time.time()
            raise
        if stop.item():
            raise Stop()
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))

    try:
        if loop:
            loop.run(train_step, steps=sys.maxsize)  # it reports each step to dlrun.progress
        else:
            progress = dlrun_progress()
            while True:
                train_step(step, ddp)
                step += 1
                if progress:
                    progress.step(step)
    except Stop:
        pass
    # No destroy_process_group(): on torch 2.13 it deadlocks now and then (ProcessGroupGloo's
    # destructor, run as DDP's reducer is freed with the GIL held, joins a thread of its own
    # waiting for the GIL), which left the stopped job running in some trials. Every rank agreed
    # to stop in the last all-reduce; the process ends past the teardown.
    return 0


if __name__ == "__main__":
    exit_past_torch_teardown(main())
