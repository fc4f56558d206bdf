"""A worker for `dlrun logs` tests: prints a line every rank shares, one of its own and one on
stderr; at attempt 0 rank 3 then fails (a restart follows). Afterwards it writes
printed-ATTEMPT-RANK in DIR and waits: it prints "more RANK" once DIR/more-RANK exists, and exits 0
once DIR/done does."""

import os
import sys
import time

directory = sys.argv[1]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print("same line on every rank", flush=True)
print(f"attempt {attempt} rank {rank}", flush=True)
print(f"stderr of rank {rank}", file=sys.stderr, flush=True)
if attempt == 0 and rank == 3 and "--fail" in sys.argv:
    sys.exit(1)
open(os.path.join(directory, f"printed-{attempt}-{rank}"), "w").close()
said = False
while not os.path.exists(os.path.join(directory, "done")):
    if not said and os.path.exists(os.path.join(directory, f"more-{rank}")):
        print(f"more {rank}", flush=True)
        said = True
    time.sleep(0.05)
