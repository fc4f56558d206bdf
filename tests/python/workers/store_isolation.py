"""What one attempt sees of the store that earlier attempts wrote, for the recovery tests.

Usage: store_isolation.py OUT_DIR LAST_ATTEMPT [STATE_URL]

In attempt A (TORCHELASTIC_RESTART_COUNT) each rank opens torch's own TCPStore client on
MASTER_ADDR:MASTER_PORT (as read in this attempt), looks for every key that any rank of attempts
0..A-1 wrote (attempt_<a>_rank_<r>; check(), or delete_key() under torch 1.13), then writes
attempt_<A>_rank_<RANK>. Rank 0 waits for all ranks' keys of this attempt and reads num_keys()
while the other ranks wait for it (so the count is taken at the same point in every attempt),
and, given STATE_URL (an /api/state page of dlrun or dlrund), the store server's own key count.
Every rank writes OUT_DIR/attempt_<A>_<RANK>.json and waits for the others' records; then all
exit 1 to force a restart, or 0 in LAST_ATTEMPT.
"""

import json
import os
import sys
import urllib.request
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import launcher_store, write_json  # noqa: E402

TIMEOUT = timedelta(seconds=30)


def readable(store, key):
    """Whether `key` is in the store. torch 1.13's binding has no check(): there delete_key
    says whether it was there (a key of an earlier attempt has no business being kept)."""
    if hasattr(store, "check"):
        return store.check([key])
    return store.delete_key(key)


def server_keys(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())["store"]["keys"]


def main():
    out_dir, last = sys.argv[1], int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else None
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = launcher_store(TIMEOUT)
    earlier = [f"attempt_{a}_rank_{r}" for a in range(attempt) for r in range(world)]
    seen = [key for key in earlier if readable(store, key)]
    store.set(f"attempt_{attempt}_rank_{rank}", str(os.getpid()))
    record = {"attempt": attempt, "rank": rank, "master": f"{host}:{port}", "seen": seen}
    if rank == 0:
        store.wait([f"attempt_{attempt}_rank_{r}" for r in range(world)], TIMEOUT)
        record["num_keys"] = store.num_keys()
        if url:
            record["server_keys"] = server_keys(url)
        store.set(f"counted_{attempt}", "1")
    else:
        store.wait([f"counted_{attempt}"], TIMEOUT)
    write_json(os.path.join(out_dir, f"attempt_{attempt}_{rank}.json"), record)
    # No rank exits (and has the others stopped) before every record is written. The keys that
    # order the ranks are the attempt's own, so a store that kept an earlier attempt's keys
    # still gets every record written (and the test says what was seen).
    store.set(f"recorded_{attempt}_{rank}", "1")
    store.wait([f"recorded_{attempt}_{r}" for r in range(world)], TIMEOUT)
    # Rank 0 may serve the store (a torch without libuv): it leaves last, once every other
    # rank's wait has returned (its exit would cut a wait still being answered).
    store.set(f"left_{attempt}_{rank}", "1")
    if rank == 0:
        store.wait([f"left_{attempt}_{r}" for r in range(world)], TIMEOUT)
    return 0 if attempt >= last else 1


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
