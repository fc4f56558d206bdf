"""A save's copy made by dlrun's module (agents/checkpoint_copy.h, DLRUN_CHECKPOINT_COPY) is the
copy torch makes, in both eras (python/dlrun/_copies.py):

- Tensors of several dtypes, an odd byte count, a transposed and a conjugate view, an empty and a
  zero-dimensional tensor: the module's copy holds the bytes torch's copy holds, and zeros where
  the slot held other bytes before; the tensors read back are bit-equal to those saved.
- The checksum from the copy's block sums is the one read from the copy, by the module and by
  torch; a changed word changes it.
- Without the module (or with one that cannot be opened, said once) the copy is torch's and the
  checksum the same.
"""

import mmap
import os
import pickle
import sys
import unittest

import torch

sys.path.insert(0, os.environ["DLRUN_PYTHONDIR"])
from dlrun import _copies  # noqa: E402
from dlrun._tree import hollow  # noqa: E402

MODULE = os.path.join(os.path.dirname(os.environ["DLRUN"]), "dlrun-checkpoint-copy.so")
ALIGN = 64  # checkpoint.py's


def state():
    g = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(1000, generator=g),
        torch.randn(7, generator=g).half(),  # 14 bytes: a partial last word
        torch.randint(0, 2, (33,), generator=g).bool(),
        torch.randint(-(2**40), 2**40, (5, 9), generator=g),
        torch.randn(64, 48, generator=g).t(),  # not contiguous
        torch.randn(12, generator=g, dtype=torch.complex64).conj(),  # a conjugate view
        torch.empty(0),
        torch.tensor(2.5, dtype=torch.float64),
        torch.randn(3000, generator=g),  # across a 4 KiB block's end
    ]
    layout, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        layout.append((str(t.dtype).replace("torch.", ""), tuple(t.shape), size, nbytes))
        size += -(-nbytes // ALIGN) * ALIGN
    return tensors, layout, max(-(-size // _copies.BLOCK) * _copies.BLOCK, _copies.BLOCK)


def mapped(size, fill):
    data = mmap.mmap(-1, size)
    data.write(bytes([fill]) * size)
    return data


def with_module(path):
    """_copies with DLRUN_CHECKPOINT_COPY set to `path` (None: unset), opened anew."""
    if path is None:
        os.environ.pop("DLRUN_CHECKPOINT_COPY", None)
    else:
        os.environ["DLRUN_CHECKPOINT_COPY"] = path
    _copies._opened = None


class CheckpointCopiesTest(unittest.TestCase):
    def tearDown(self):
        with_module(None)

    def test_the_modules_copy_is_torchs_and_zeroes_what_the_slot_held(self):
        self.assertTrue(os.path.isfile(MODULE), MODULE)
        tensors, layout, size = state()
        with_module(None)
        by_torch = mapped(size, 0)
        self.assertIsNone(_copies.copy_in(by_torch, tensors, layout))
        with_module(MODULE)
        by_module = mapped(size, 0xA5)  # a slot's earlier bytes, which must not stay
        blocks = _copies.copy_in(by_module, tensors, layout)
        self.assertIsNotNone(blocks)
        self.assertEqual(by_module[:], by_torch[:])
        back = _copies.read_state(by_module, pickle_meta(tensors, layout))
        for saved, loaded in zip(tensors, back):
            self.assertEqual(saved.dtype, loaded.dtype)
            self.assertEqual(saved.shape, loaded.shape)
            self.assertTrue(torch.equal(saved.resolve_conj(), loaded), saved.dtype)

    def test_the_checksum_from_block_sums_is_the_one_read_from_the_copy(self):
        tensors, layout, size = state()
        meta = pickle_meta(tensors, layout)
        with_module(MODULE)
        data = mapped(size, 0)
        blocks = _copies.copy_in(data, tensors, layout)
        from_sums = _copies.checksum(data, meta, blocks)
        self.assertEqual(_copies.checksum(data, meta), from_sums)  # the module's read
        with_module(None)
        self.assertEqual(_copies.checksum(data, meta), from_sums)  # torch's read
        data[5000] ^= 1
        self.assertNotEqual(_copies.checksum(data, meta), from_sums)

    def test_a_module_that_cannot_be_opened_leaves_the_copy_to_torch(self):
        tensors, layout, size = state()
        with_module(os.path.join(os.path.dirname(MODULE), "no-such-module.so"))
        data = mapped(size, 0)
        self.assertIsNone(_copies.copy_in(data, tensors, layout))
        self.assertIsNone(_copies._native())  # tried once
        with_module(MODULE)
        again = mapped(size, 0)
        _copies.copy_in(again, tensors, layout)
        self.assertEqual(again[:], data[:])


def pickle_meta(tensors, layout):
    """The structure as checkpoint.py pickles it: a list of the tensors."""
    skeleton = hollow(tensors, [])
    return pickle.dumps({"step": 0, "skeleton": skeleton, "layout": layout})


if __name__ == "__main__":
    unittest.main()
