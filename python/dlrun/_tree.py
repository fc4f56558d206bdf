"""A state (dicts, lists and tuples of tensors and other values) apart from its tensors: what
dlrun.recovery sends and dlrun.checkpoint saves. hollow() keeps the structure with a slot where
each tensor was, small enough to pickle; fill() puts tensors back in the slots."""


class _Slot:
    """Where a tensor was in a state sent or saved without its tensors."""

    def __init__(self, index):
        self.index = index


def _leaves(value, leaf):
    """`value`, its dicts, lists and tuples rebuilt with `leaf` applied to everything else (a
    module's state dict keeps its `_metadata`, the versions load_state_dict reads)."""
    if isinstance(value, dict):
        rebuilt = type(value)((k, _leaves(v, leaf)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            rebuilt._metadata = value._metadata
        return rebuilt
    if type(value) in (list, tuple):
        return type(value)(_leaves(v, leaf) for v in value)
    return leaf(value)


def hollow(value, tensors):
    """`value` with each tensor replaced by a _Slot, the tensors appended to `tensors`."""
    import torch

    def slot(v):
        if not isinstance(v, torch.Tensor):
            return v
        tensors.append(v)
        return _Slot(len(tensors) - 1)

    return _leaves(value, slot)


def fill(value, tensors):
    """hollow's inverse."""
    return _leaves(value, lambda v: tensors[v.index] if isinstance(v, _Slot) else v)
