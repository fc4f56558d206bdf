"""A worker that fails every attempt, for tests/python/test_crash_loop.py.

Usage: crash_worker.py OUT_DIR PLAN
PLAN: the step each attempt reports through dlrun.progress before it exits 1, by attempt
(TORCHELASTIC_RESTART_COUNT), comma-separated, the last one for every later attempt; "-" reports
nothing. Writes OUT_DIR/attempt_<N> at its start.
"""

import os
import sys

import dlrun.progress as progress  # dlrun puts its package on PYTHONPATH


def main():
    out, plan = sys.argv[1], sys.argv[2].split(",")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    open(os.path.join(out, f"attempt_{attempt}"), "w").close()
    step = plan[min(attempt, len(plan) - 1)]
    if step != "-":
        for n in range(1, int(step) + 1):
            progress.step(n)
    print(f"attempt {attempt} fails", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
