"""PyTorch's own TCPStore server, the baseline for dlrun-store-bench.

Binds 127.0.0.1 on a free port, prints the port as its first line, and serves until stdin
closes or SIGTERM arrives (SIGTERM's default action ends the process; the store's daemon is a
thread in it). Tested with torch 1.13, whose TCPStore exposes the bound port as `.port`.
"""

import sys

import torch.distributed as dist


def main() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    while sys.stdin.buffer.read(4096):
        pass


if __name__ == "__main__":
    main()
