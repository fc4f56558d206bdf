"""torchrun from Debian's torch 1.13, made to run on Python 3.11.

torch 1.13's Std.from_str (torch/distributed/elastic/multiprocessing/api.py) turns "0".."3"
into a Std by iterating the IntFlag; from Python 3.11 on that iteration yields only the
single-bit members (OUT, ERR), so "0" (the default of --redirects and --tee) and "3" come back
as None and every launch fails in to_map. This replaces the method before torchrun parses its
arguments, then runs torchrun's own main with this script's arguments.

Usage: /usr/bin/python3 bench/torchrun_py311.py [torchrun flags] ENTRYPOINT [args...]
(torch 1.13 knows only the underscore spellings: --nproc_per_node, --no_python, ...)
"""

import re
import sys
from typing import Union

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm: str) -> Union["api.Std", dict[int, "api.Std"]]:
    """ "0".."3" -> Std; "0:3,1:0" -> {0: Std.ALL, 1: Std.NONE}; anything else is refused."""
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        mapping: dict[int, api.Std] = {}
        for item in vm.split(","):
            rank, value = item.split(":")
            mapping[int(rank)] = cls(int(value))
        return mapping
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.argv[0] = "torchrun"
    sys.exit(main())
