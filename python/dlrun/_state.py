"""The training state one rank of dlrun.recovery's loop hands to those that lack it after a
recovery: readied by the sender before the new group forms, then broadcast in that group."""

import math
import pickle

from dlrun._tree import fill, hollow


def by_dtype(layout):
    """The indices of a state's tensors (`layout`: their (dtype, shape)s), a list per dtype, in
    an order every rank derives alike."""
    dtypes = sorted({dtype for dtype, _ in layout}, key=str)
    return [[i for i, (d, _) in enumerate(layout) if d == dtype] for dtype in dtypes]


def ready(store, keys, whole, extra, device):
    """The sender's part before the new group forms: what of `whole` (a tree of tensors and
    values) is not a tensor, with `extra` (picklable), pickled into the store under `keys`
    (small); the tensors in one flat buffer per dtype on `device` (no pickling of the weights,
    one message per dtype), returned, to be sent once the group is made."""
    import torch

    tensors = []
    skeleton = hollow(whole, tensors)
    layout = [(t.dtype, tuple(t.shape)) for t in tensors]
    store.set(f"{keys}/state", pickle.dumps((extra, skeleton, layout)))
    return [
        torch.cat([tensors[i].detach().reshape(-1).to(device) for i in ids])
        for ids in by_dtype(layout)
    ]


def take(store, keys, source, flats, device, left, keep):
    """The state of rank `source` broadcast in the new group: one collective per dtype on the
    group's own communicator (a send would make NCCL a communicator for each pair; the step needs
    the group's anyway), as bytes (gloo's broadcast knows only some dtypes: torch 1.13's neither
    bool nor bfloat16). `flats`: what ready() made, on the source; None on every other rank.
    Every rank of the group takes part; where `keep`, returns (extra, whole) as ready() had
    them, else None. `left()`: the time left to wait for the sender's part (a lost sender: the
    deadline)."""
    import torch
    import torch.distributed as dist

    if flats is not None:
        for flat in flats:
            dist.broadcast(flat.view(torch.uint8), src=source)
        return None
    store.wait([f"{keys}/state"], left())
    extra, skeleton, layout = pickle.loads(store.get(f"{keys}/state"))
    received = [None] * len(layout)
    for ids in by_dtype(layout):
        sizes = [math.prod(layout[i][1]) for i in ids]
        flat = torch.empty(sum(sizes), dtype=layout[ids[0]][0], device=device)
        dist.broadcast(flat.view(torch.uint8), src=source)
        if keep:
            for i, piece in zip(ids, flat.split(sizes)):
                received[i] = piece.view(layout[i][1])
    return (extra, fill(skeleton, received)) if keep else None
