"""`python -m dlrun ARGS`: runs the dlrun program that came with this package, as `dlrun ARGS`.

The program is found beside the package in an installed tree (PREFIX/share/dlrun/python/dlrun
and PREFIX/bin/dlrun, the build tree alike), else among the files pip installed with the wheel
(its RECORD: the environment's bin/, or ~/.local/bin for --user), else in the environment's
scripts directory. It replaces this interpreter (exec): signals, exit code and PID are dlrun's.
"""

import os
import sys
import sysconfig
from importlib import metadata


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, os.pardir, os.pardir, os.pardir, "bin", "dlrun")
    try:
        for path in metadata.distribution("dlrun").files or ():
            if path.name == "dlrun" and path.parent.name == "bin":
                yield str(path.locate())
    except metadata.PackageNotFoundError:
        pass
    yield os.path.join(sysconfig.get_path("scripts"), "dlrun")


def program():
    """The dlrun program's path, or None."""
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.realpath(path)
    return None


def main():
    path = program()
    if path is None:
        sys.exit(
            "dlrun: python -m dlrun found no dlrun program beside its package, among the"
            " wheel's files or in "
            + sysconfig.get_path("scripts")
            + ": install dlrun's wheel (pip install dlrun) or its Debian package"
        )
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
