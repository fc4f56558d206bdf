"""A worker of the multi-node tests: records its start, then does what the flags say.

Usage: elastic_worker.py OUT_DIR [--allreduce] [--fail-rank R --fail-rounds N [--fail-code C]]
                         [--fail-host NAME] [--wait]
                         [--until-file PATH [--hold-ranks R,R...]] [--exec COMMAND...]
Writes OUT_DIR/start_<restart count>_<rank>_<pid>.json with the time, its pid and the
variables dlrun set. --allreduce runs a torch gloo all-reduce over the whole world (env://,
dlrun's store) and records the sum. --fail-rank exits 3 (or C) on that rank while
TORCHELASTIC_RESTART_COUNT < N (N = -1: always); --fail-host exits 3 (or C) on the host of that
name, every attempt. --wait blocks until a signal stops it;
--until-file exits 0 once PATH exists (or 4 after worker_util.MAX_WAIT_S); with --hold-ranks
only those ranks wait for it, the others exit 0 at once. --exec (last) replaces the worker by
COMMAND once the start is recorded (a real trainer whose start the tests can see).
"""

import argparse
import os
import socket
import sys
import time

from worker_util import MAX_WAIT_S, wait_to_be_stopped, write_json

VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CONFIG",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def allreduce(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    return tensor.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--allreduce", action="store_true")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-code", type=int, default=3)
    parser.add_argument("--fail-rounds", type=int, default=0)
    parser.add_argument("--fail-host")
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--until-file")
    parser.add_argument("--hold-ranks")
    parser.add_argument("--exec", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    record = {
        "time": time.time(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": socket.gethostname(),
        "env": {k: os.environ.get(k) for k in VARIABLES},
    }
    if args.allreduce:
        record["sum"] = allreduce(rank)
    write_json(os.path.join(args.out_dir, f"start_{attempt}_{rank}_{os.getpid()}.json"), record)
    if args.exec:
        sys.stdout.flush()
        os.execv(args.exec[0], args.exec)
    if (
        rank == args.fail_rank
        and (args.fail_rounds < 0 or attempt < args.fail_rounds)
        or record["host"] == args.fail_host
    ):
        print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
        return args.fail_code
    if args.wait:
        wait_to_be_stopped()
    held = args.hold_ranks is None or str(rank) in args.hold_ranks.split(",")
    if args.until_file and held:
        deadline = time.monotonic() + MAX_WAIT_S
        while not os.path.exists(args.until_file):
            if time.monotonic() >= deadline:
                return 4
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
