"""Hosts torch's own TCPStore servers for the store differential test, in one process.

Usage: store_servers.py BACKEND... where each BACKEND is "libuv" or "legacy" (torch 1.x has only
its one server: pass "legacy"). Prints one JSON line {"ports": [...]}, one port per BACKEND in
order, then serves until stdin closes (the test closes it, or dies: PR_SET_PDEATHSIG too).
"""

import json
import sys
from datetime import timedelta

import torch.distributed as dist


def serve(backend):
    options = (
        {}
        if backend == "legacy" and not hasattr(dist.TCPStore, "libuvBackend")
        else {"use_libuv": backend == "libuv"}
    )
    store = dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False, **options
    )
    if hasattr(store, "libuvBackend") and store.libuvBackend != (backend == "libuv"):
        raise RuntimeError(f"asked for the {backend} server, torch started another")
    return store


def main():
    backends = sys.argv[1:]
    if not backends or any(b not in ("libuv", "legacy") for b in backends):
        sys.exit(__doc__)
    stores = [serve(b) for b in backends]
    print(json.dumps({"ports": [s.port for s in stores]}), flush=True)
    sys.stdin.read()  # until the test closes the pipe


if __name__ == "__main__":
    main()
