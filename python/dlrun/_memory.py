"""What a recovery of dlrun.recovery's loop allocates again (the new DistributedDataParallel's
buckets, the state sent, a newcomer's first gradients) takes pages the process holds already,
not new ones the kernel must zero at their first touch. On a CPU job such faults were some 1,500
a survivor and 5,000 a newcomer in the step after a recovery (a model of 4.8 MB), a fifth of a
newcomer's time then.

glibc's malloc gives a block larger than its threshold (128 kB at first) back to the kernel as it
is freed, and trims its heap's free top; a block freed inside the heap is soon split by small
ones. prepare() serves blocks up to 32 MB from the heap and keeps its free top (keep_freed); the
loop then touches twice the model's state of heap beyond its high-water mark once (touch_heap: a
worker started ahead after its warmup pass, any other after its first step), which the
recovery's allocations take. The cost: that much memory more, up to TOUCH_MAX. Elsewhere than on
glibc (or where it refuses), nothing changes."""

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
HEAP_BLOCK = 32 << 20  # glibc's largest mmap threshold: larger blocks are mapped afresh anyway
KEEP = (1 << 31) - 1  # the heap's free top is trimmed beyond this only
TOUCH_MAX = 512 << 20


def prepare(module):
    """Freed memory kept (keep_freed); returns the bytes of heap to touch once past a step:
    twice `module`'s state, at most TOUCH_MAX (0 where the allocator refused)."""
    return min(2 * state_bytes(module), TOUCH_MAX) if keep_freed() else 0


def keep_freed():
    """Freed memory stays with the process (glibc): whether the allocator took it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))


def touch_heap(nbytes):
    """Faults `nbytes` of the heap in and frees them again (kept, keep_freed), in blocks under
    the mmap threshold."""
    import torch

    blocks = []
    while nbytes > 0:
        size = min(nbytes, HEAP_BLOCK - (1 << 20))
        blocks.append(torch.ones(size, dtype=torch.uint8))  # written: every page in
        nbytes -= size
    blocks.clear()


def state_bytes(module):
    """The bytes of `module`'s parameters and buffers: what its state, its gradients and its
    buckets each take."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == "cpu")
