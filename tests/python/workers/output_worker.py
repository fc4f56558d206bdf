"""Writes known lines to stdout and stderr for the output tests, then exits 0.

stdout: "out 1 of rank R", "out 2 of rank R", "run id <TORCHELASTIC_RUN_ID>", and the
unterminated "tail of rank R"; stderr: "err 1 of rank R".
"""

import os
import sys

r = os.environ["RANK"]
sys.stdout.write(f"out 1 of rank {r}\nout 2 of rank {r}\n")
sys.stdout.write(f"run id {os.environ['TORCHELASTIC_RUN_ID']}\n")
sys.stdout.write(f"tail of rank {r}")
sys.stdout.flush()
sys.stderr.write(f"err 1 of rank {r}\n")
sys.stderr.flush()
