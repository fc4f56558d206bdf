"""A script written for torch.distributed.launch: it takes its local rank from an argument, as
such scripts do with argparse, and records it beside LOCAL_RANK.

Usage: local_rank_worker.py OUT_DIR dash|underscore --local-rank=N (or --local_rank=N)
The dash style declares --local-rank (PyTorch 2.0 on), the underscore style --local_rank (the
scripts of before); argparse refuses any other argument. Writes OUT_DIR/local_rank_<RANK>.json.
"""

import argparse
import os
import sys

from worker_util import write_json


def main():
    style = sys.argv[2]
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("style", choices=("dash", "underscore"))
    parser.add_argument(
        "--local-rank" if style == "dash" else "--local_rank", type=int, required=True
    )
    args = parser.parse_args()
    write_json(
        os.path.join(args.out_dir, f"local_rank_{os.environ['RANK']}.json"),
        {"arg": args.local_rank, "env": int(os.environ["LOCAL_RANK"])},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
