"""A save's copy made by dlrun's module (agents/checkpoint_copy.h, DLRUN_CHECKPOINT_COPY) is the
copy torch makes, in both eras (python/dlrun/_copies.py):

- Tensors of several dtypes, an odd byte count, a transposed and a conjugate view, an empty and a
  zero-dimensional tensor: the module's copy holds the bytes torch's copy holds, and zeros where
  the slot held other bytes before; the tensors read back are bit-equal to those saved.
- The checksum from the copy's block sums is the one read from the copy, by the module and by
  torch; a changed word changes it.
- Without the module (or with one that cannot be opened, said once) the copy is torch's and the
  checksum the same.
- A copy made in 1 MiB chunks (save(..., overlap=True): by the idle copier, the chunks left by
  the thread that cannot wait) holds the bytes and block sums of the copy made at once, for
  tensors across chunks' edges, and says whether a tensor held as it was changed meanwhile.
- A slot's mark (the process keeps what it wrote) is the file's: another reader sees each mark and
  unmark. Unmarking removes the requests a former process left, and waits for a reader that holds
  the slot's lock (the agent carrying the copy) before the mark goes.
"""

import fcntl
import mmap
import os
import pickle
import sys
import tempfile
import threading
import unittest

import torch

sys.path.insert(0, os.environ["DLRUN_PYTHONDIR"])
from dlrun import _copies, _overlap  # noqa: E402
from dlrun._tree import hollow  # noqa: E402

MODULE = os.path.join(os.path.dirname(os.environ["DLRUN"]), "dlrun-checkpoint-copy.so")


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
    return (tensors, *_copies.lay_out(tensors))


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


class ChunkedCopyTest(unittest.TestCase):
    def setUp(self):
        with_module(MODULE)

    def tearDown(self):
        with_module(None)

    def big_state(self):
        tensors, _, _ = state()
        g = torch.Generator().manual_seed(5)
        tensors += [
            torch.randn(300_001, generator=g),  # 1.2 MB: across a chunk's edge, an odd count
            torch.randn(7, generator=g).half(),  # a partial last word
            torch.randint(0, 2**31, (700_000,), generator=g, dtype=torch.int32),
        ]
        return (tensors, *_copies.lay_out(tensors))

    def test_a_chunked_copy_is_the_copy_made_at_once(self):
        tensors, layout, size = self.big_state()
        self.assertGreater(size, 3 * _overlap.CHUNK)
        at_once = mapped(size, 0)
        sums = _copies.copy_in(at_once, tensors, layout)
        chunked = mapped(size, 0xAB)  # what a slot held before: zeroed between the tensors
        pending = _overlap.Pending(tensors)
        chunk_sums = _overlap.copy(pending, chunked, layout)
        _overlap.check()
        self.assertFalse(pending.torn)
        self.assertEqual(chunked[:], at_once[:])
        self.assertTrue(torch.equal(chunk_sums, sums))

    def test_chunks_left_are_made_by_whoever_hurries(self):
        tensors, layout, size = self.big_state()
        data = mapped(size, 0)
        chunked = _overlap._Chunked(_copies._native(), data, tensors, layout)
        chunked.work()  # no copier: this thread makes every chunk
        chunked.wait()
        at_once = mapped(size, 0)
        self.assertTrue(torch.equal(chunked.sums, _copies.copy_in(at_once, tensors, layout)))
        self.assertEqual(data[:], at_once[:])

    def test_an_optimizers_tensor_changed_before_the_check_makes_the_copy_torn(self):
        tensors, layout, size = self.big_state()
        weights = torch.nn.Parameter(tensors[-3].float())
        optimizer = torch.optim.SGD([weights], lr=0.1)
        _overlap._seen.add(optimizer)  # as if it had stepped
        tensors[-3] = weights.detach()
        pending = _overlap.Pending(tensors)
        self.assertIs(pending.tensors[-3], tensors[-3])  # its own: not cloned
        self.assertIsNot(pending.tensors[0], tensors[0])  # no optimizer's: cloned
        _overlap.copy(pending, mapped(size, 0), layout)
        with torch.no_grad():
            weights.add_(1)  # in place, torch's way: its version counter moves
        _overlap.check()
        _overlap._off = False  # the torn copy turned this process's later ones off
        self.assertTrue(pending.torn)


class SlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "slot-0")
        self.slot = _copies.Slot(self.path)

    def tearDown(self):
        self.slot.close()
        self.dir.cleanup()

    def test_a_mark_and_its_removal_are_what_another_reader_sees(self):
        self.assertIsNone(self.slot.marked())
        self.slot.mark(7, "abc")
        self.assertEqual(self.slot.marked(), (7, "abc"))
        self.assertEqual(_copies.Slot(self.path).marked(), (7, "abc"))
        self.slot.unmark()
        self.assertIsNone(self.slot.marked())
        self.assertIsNone(_copies.Slot(self.path).marked())
        self.slot.mark(9, "def")  # a mark after an unmark is written again
        self.assertEqual(_copies.Slot(self.path).marked(), (9, "def"))

    def test_requests_a_former_process_left_are_removed_with_the_mark(self):
        former = _copies.Slot(self.path)
        former.mark(3, "abc")
        for request in _copies.REQUESTS:
            with open(os.path.join(self.path, request), "w") as f:
                f.write("3 x\n")
        # Taken by no agent: unmark waits WRITE_WAIT_S for it, then removes it.
        _copies.WRITE_WAIT_S, wait = 0, _copies.WRITE_WAIT_S
        try:
            self.slot.unmark()
        finally:
            _copies.WRITE_WAIT_S = wait
        self.assertEqual(sorted(os.listdir(self.path)), ["lock"])

    def test_the_mark_stays_while_a_reader_holds_the_lock(self):
        self.slot.mark(5, "abc")
        reader = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(reader, fcntl.LOCK_SH)
        unmarking = threading.Thread(target=self.slot.unmark)
        unmarking.start()
        unmarking.join(0.2)
        self.assertTrue(unmarking.is_alive())
        self.assertEqual(_copies.Slot(self.path).marked(), (5, "abc"))
        os.close(reader)  # the reader done
        unmarking.join(30)
        self.assertFalse(unmarking.is_alive())
        self.assertIsNone(_copies.Slot(self.path).marked())


def pickle_meta(tensors, layout):
    """The structure as checkpoint.py pickles it: a list of the tensors."""
    skeleton = hollow(tensors, [])
    return pickle.dumps({"step": 0, "skeleton": skeleton, "layout": layout})


if __name__ == "__main__":
    unittest.main()
