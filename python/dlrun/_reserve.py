"""A worker started ahead (agents/agent_spares.cpp: --ready-spares on a spare node,
--ready-replacements on a running one) runs its program until it makes dlrun.recovery.Loop,
which waits here for its place: the environment, working directory, CPUs and standard streams
of the worker the agent starts once the node takes a lost node's ranks or replaces a failed
worker, sent over the socket the variable names (the zygote's go socket, agents/warm_start.h)
as a start's request to the zygote is. Without the variable: nothing."""

import os
import socket
import sys

VARIABLE = "DLRUN_RECOVERY_RESERVE"  # agents/recovery.h


def reserved():
    """Whether this worker was started ahead and waits for its place."""
    return bool(os.environ.get(VARIABLE))


def take_place():
    """Waits for this worker's place and takes it on; ends the process quietly where the agent
    is gone first (one stopped unused is killed)."""
    fd = os.environ.get(VARIABLE)
    if not fd:
        return
    # The zygote's codec: every worker forked from it imported it already (it is not on the
    # workers' path).
    from dlrun_warm_start_wire import SPAWN, Spawn, receive, set_cpus, take_on

    with socket.socket(fileno=int(fd)) as sock:
        try:
            body, fds = receive(sock)
        except (OSError, ValueError):
            body, fds = None, []
    if body is None or body[0] != SPAWN or len(fds) != 3:
        os._exit(0)
    place = Spawn(body[1:])
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        take_on(place, fds)
        problem = set_cpus(place.cpus)
    except OSError as e:  # its working directory gone, say
        problem = f"cannot take its place: {e}"
    if problem:
        print(f"dlrun warm start: {problem}", file=sys.stderr, flush=True)
        os._exit(127)
    # A progress report made before its place found no board: the next one looks again.
    from dlrun import progress

    progress._board = progress._UNOPENED
