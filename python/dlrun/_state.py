"""The training state the survivors of dlrun.recovery's loop hand to the ranks that lack it
after a recovery: readied by the senders before the new group forms, then sent in that
group."""

import math
import pickle

from dlrun._tree import fill, hollow


def by_dtype(layout):
    """The indices of a state's tensors (`layout`: their (dtype, shape)s), a list per dtype, in
    an order every rank derives alike."""
    dtypes = sorted({dtype for dtype, _ in layout}, key=str)
    return [[i for i, (d, _) in enumerate(layout) if d == dtype] for dtype in dtypes]


def ready(store, keys, whole, extra, device, publish):
    """A sender's part before the new group forms: what of `whole` (a tree of tensors and
    values) is not a tensor, with `extra` (picklable), pickled into the store under `keys`
    (small) where it is to `publish` it (one sender does); the tensors in one flat buffer per
    dtype on `device` (no pickling of the weights, one message per dtype), returned, to be sent
    once the group is made."""
    import torch

    tensors = []
    skeleton = hollow(whole, tensors)
    layout = [(t.dtype, tuple(t.shape)) for t in tensors]
    if publish:
        store.set(f"{keys}/state", pickle.dumps((extra, skeleton, layout)))
    return [
        torch.cat([tensors[i].detach().reshape(-1).to(device) for i in ids])
        for ids in by_dtype(layout)
    ]


def take(store, keys, plan, flats, device, left, broadcast):
    """The state sent in the new group, as bytes (gloo knows only some dtypes: torch 1.13's
    neither bool nor bfloat16), one message per dtype. `plan`: {each rank that lacks the state:
    the rank that sends it to it}, several senders sharing the receivers where they hold the
    same state. Sent over the group's own connections, or where `broadcast`, by a broadcast
    from the one sender in which every rank takes part (NCCL: a send would make a communicator
    for each pair, and the step needs the group's anyway). `flats`: what ready() made, on a
    sender; None on every other rank. Returns (extra, whole) as ready() had them on a receiver,
    else None. `left()`: the time left to wait for the published part (a lost sender: the
    deadline)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    if flats is not None:
        if broadcast:
            for flat in flats:
                dist.broadcast(flat.view(torch.uint8), src=rank)
        else:
            targets = [r for r, sender in plan.items() if sender == rank]
            sends = [dist.isend(f.view(torch.uint8), dst=r) for f in flats for r in targets]
            for send in sends:
                send.wait()
        return None
    keep = rank in plan
    if not (keep or broadcast):
        return None
    source = plan[rank] if keep else next(iter(plan.values()))
    store.wait([f"{keys}/state"], left())
    extra, skeleton, layout = pickle.loads(store.get(f"{keys}/state"))
    received = [None] * len(layout)
    for ids in by_dtype(layout):
        sizes = [math.prod(layout[i][1]) for i in ids]
        flat = torch.empty(sum(sizes), dtype=layout[ids[0]][0], device=device)
        if broadcast:
            dist.broadcast(flat.view(torch.uint8), src=source)
        else:
            dist.recv(flat.view(torch.uint8), src=source)
        if keep:
            for i, piece in zip(ids, flat.split(sizes)):
                received[i] = piece.view(layout[i][1])
    return (extra, fill(skeleton, received)) if keep else None
