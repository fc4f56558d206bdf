"""The real torch TCPStore client (the era of the interpreter running the test) against dlrund."""

import os
import sys
import threading
import time
import unittest
from datetime import timedelta

import torch.distributed as dist

from dlrund_fixture import main, start_dlrund

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
from worker_util import client_options  # noqa: E402


class TorchStoreTest(unittest.TestCase):
    def setUp(self):
        self.daemon = start_dlrund(self)
        self.store = self.client()

    def client(self):
        # use_libuv=False on a torch without libuv (Debian 13's), which refuses any other.
        return dist.TCPStore(
            "127.0.0.1",
            self.daemon.port,
            is_master=False,
            timeout=timedelta(seconds=10),
            **client_options(),
        )

    def test_set_get(self):
        self.store.set("text", "hello")
        self.store.set("binary", b"\x00a\x00\xff\x00")
        self.store.set("empty", b"")
        big = bytes(range(256)) * 4096  # 1 MiB: spans many reads and writes
        self.store.set("big", big)
        self.assertEqual(self.store.get("text"), b"hello")
        self.assertEqual(self.store.get("binary"), b"\x00a\x00\xff\x00")
        self.assertEqual(self.store.get("empty"), b"")
        self.assertEqual(self.store.get("big"), big)
        self.store.set("text", "replaced")
        self.assertEqual(self.store.get("text"), b"replaced")
        self.assertEqual(self.client().get("binary"), b"\x00a\x00\xff\x00")

    def test_add(self):
        self.assertEqual(self.store.add("counter", 5), 5)
        self.assertEqual(self.store.add("counter", 2), 7)
        self.assertEqual(self.store.get("counter"), b"7")
        self.assertEqual(self.client().add("counter", -10), -3)
        self.assertEqual(self.store.get("counter"), b"-3")
        self.assertEqual(self.store.add("counter", 0), -3)

    def test_compare_set(self):
        self.store.set("present", "old")
        self.assertEqual(self.store.compare_set("present", "old", "new"), b"new")
        self.assertEqual(self.store.get("present"), b"new")

        self.assertEqual(self.store.compare_set("created", "", "first"), b"first")
        self.assertEqual(self.store.get("created"), b"first")

        keys_before = self.store.num_keys()
        self.assertEqual(self.store.compare_set("absent", "expected", "desired"), b"expected")
        self.assertEqual(self.store.num_keys(), keys_before, "compare_set created 'absent'")

        self.assertEqual(self.store.compare_set("present", "wrong", "other"), b"new")
        self.assertEqual(self.store.get("present"), b"new")

    def test_num_keys_and_delete_key(self):
        before = self.store.num_keys()
        self.store.set("a", "1")
        self.store.set("b", "2")
        self.store.set("a", "3")  # overwriting does not add a key
        self.store.add("c", 1)
        self.assertEqual(self.store.num_keys(), before + 3)
        self.assertTrue(self.store.delete_key("a"))
        self.assertFalse(self.store.delete_key("a"))
        self.assertFalse(self.store.delete_key("never-set"))
        self.assertEqual(self.store.num_keys(), before + 2)
        self.store.set("a", "again")
        self.assertEqual(self.store.get("a"), b"again")

    def test_wait_completed_by_another_client(self):
        setter = self.client()
        result = {}

        def wait():
            start = time.monotonic()
            try:
                self.store.wait(["ready"], timedelta(seconds=10))
                result["elapsed"] = time.monotonic() - start
            except Exception as e:  # reported by the assertions below
                result["error"] = e

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        # Not synchronisation: the wait must still be blocked while the key is missing.
        waiter.join(0.2)
        self.assertTrue(waiter.is_alive(), f"wait returned before the key was set: {result}")
        setter.set("ready", "1")
        waiter.join(5)
        self.assertFalse(waiter.is_alive(), "wait did not return within 5 s of the set")
        self.assertNotIn("error", result)
        self.assertLess(result["elapsed"], 5)
        self.assertEqual(self.store.get("ready"), b"1")

    def test_wait_timeout_then_client_still_usable(self):
        start = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "(?i)timeout"):
            self.store.wait(["never"], timedelta(milliseconds=300))
        self.assertLess(time.monotonic() - start, 5)
        self.store.set("after", b"x\x00y")
        self.assertEqual(self.store.get("after"), b"x\x00y")
        self.assertEqual(self.store.add("n", 4), 4)
        self.assertEqual(self.store.add("n", 1), 5)
        self.assertEqual(self.client().get("after"), b"x\x00y")


if __name__ == "__main__":
    main()
