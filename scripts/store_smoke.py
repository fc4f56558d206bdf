"""Starts dlrund on a free port and has four PyTorch (Gloo) workers meet through it and
all-reduce a tensor, as torchrun-launched workers would. Usage: store_smoke.py DLRUND."""
import os
import signal
import subprocess
import sys

WORLD = 4


def worker():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    expected = WORLD * (WORLD + 1) / 2
    print(f"rank {rank}: all_reduce -> {t.tolist()} (expected {expected})", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if bool((t == expected).all()) else 1)


def main(dlrund):
    workers = []
    daemon = subprocess.Popen([dlrund, "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = daemon.stdout.readline().strip()
        print(line, flush=True)
        if not line.startswith("dlrund listening on "):
            sys.exit("dlrund did not start")
        port = line.rsplit(":", 1)[1]
        for rank in range(WORLD):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                       WORLD_SIZE=str(WORLD), TORCHELASTIC_USE_AGENT_STORE="True",
                       TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1")
            workers.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
        codes = [w.wait(timeout=120) for w in workers]
        print("workers exited with", codes, flush=True)
        sys.exit(0 if not any(codes) else 1)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main(sys.argv[1])
