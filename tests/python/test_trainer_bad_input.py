"""Bad input stops the trainer at once with one line on stderr naming the problem and a non-zero
exit, and leaves no checkpoint behind: a missing dataset file, a truncated one (a short payload,
a torn gzip stream), a wrong IDX magic number, and a checkpoint directory that cannot be written.
Each runs as `dlrun-train --single`; two also run through dlrun, which then fails as well (and
at once: a rank waiting for a failed peer must not hold the job until dlrun's stop timeout).

--device cuda where no CUDA device is usable (or in a build without CUDA) fails the same way.

Broken datasets are copies of the real directory (symlinks to the good files) with one file
replaced, passed with --data."""

import gzip
import os
import time
import unittest

from dlrun_fixture import main, temp_dir
from trainer_fixture import DATA_DIR, DATA_FILES, TrainJob, cuda_devices, require_data, run_single

IDX3_MAGIC = b"\x00\x00\x08\x03"
STOP_TIMEOUT_S = 30  # dlrun's default --stop-timeout
GIVE_UP_AFTER_S = 15  # a job with a bad input ends well before the stop timeout would pass


def be32(value):
    return value.to_bytes(4, "big")


class TrainerBadInputTest(unittest.TestCase):
    def setUp(self):
        require_data(self)

    def broken_data(self, name, contents):
        """A dataset directory whose file `name` holds `contents` (None: the file is missing)."""
        directory = temp_dir(self)
        for good in DATA_FILES:
            if good != name:
                os.symlink(os.path.join(DATA_DIR, good), os.path.join(directory, good))
        if contents is not None:
            with open(os.path.join(directory, name), "wb") as f:
                f.write(contents)
        return directory

    def gunzipped(self, name):
        with gzip.open(os.path.join(DATA_DIR, name)) as f:
            return f.read()

    def cases(self):
        """(what, data dir, file the error names, words the error holds)."""
        labels = self.gunzipped("t10k-labels-idx1-ubyte.gz")
        with open(os.path.join(DATA_DIR, "t10k-images-idx3-ubyte.gz"), "rb") as f:
            images_gz = f.read()
        bad_magic = b"\x00\x00\x0d\x03" + be32(60000) + be32(28) + be32(28) + bytes(28 * 28)
        return [
            (
                "missing file",
                self.broken_data("train-labels-idx1-ubyte.gz", None),
                "train-labels-idx1-ubyte",
                "no such file",
            ),
            (
                "truncated payload",
                self.broken_data("t10k-labels-idx1-ubyte.gz", gzip.compress(labels[:5008])),
                "t10k-labels-idx1-ubyte.gz",
                "truncated",
            ),
            (
                "torn gzip stream",
                self.broken_data("t10k-images-idx3-ubyte.gz", images_gz[: len(images_gz) // 2]),
                "t10k-images-idx3-ubyte.gz",
                "truncated",
            ),
            (
                "truncated header",
                self.broken_data("train-images-idx3-ubyte.gz", gzip.compress(IDX3_MAGIC + be32(9))),
                "train-images-idx3-ubyte.gz",
                "truncated",
            ),
            (
                "wrong magic",
                self.broken_data("train-images-idx3-ubyte.gz", gzip.compress(bad_magic)),
                "train-images-idx3-ubyte.gz",
                "magic",
            ),
        ]

    def assert_one_line_error(self, result, *words):
        self.assertGreater(result.returncode, 0, result)  # an exit code, not a signal
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, result)
        self.assertTrue(lines[0].startswith("dlrun-train: error: "), result)
        for word in words:
            self.assertIn(word, lines[0], result)

    def assert_no_checkpoint(self, directory):
        left = os.listdir(directory) if os.path.exists(directory) else []
        self.assertEqual(left, [], f"left in {directory}")

    def test_bad_datasets_alone(self):
        for what, data, file, words in self.cases():
            with self.subTest(what):
                checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
                result = run_single(self, ["--data", data, "--checkpoint-dir", checkpoint_dir])
                self.assert_one_line_error(result, os.path.join(data, file), words)
                self.assertEqual(result.stdout, "", result)
                self.assert_no_checkpoint(checkpoint_dir)

    def unwritable_checkpoint_dir(self):
        """A checkpoint directory under a regular file: it can never be created."""
        parent = temp_dir(self)
        regular = os.path.join(parent, "a-file")
        with open(regular, "w") as f:
            f.write("not a directory\n")
        return parent, regular, os.path.join(regular, "checkpoints")

    def assert_untouched(self, parent, regular):
        self.assertEqual(os.listdir(parent), ["a-file"])
        with open(regular) as f:
            self.assertEqual(f.read(), "not a directory\n")

    def test_unwritable_checkpoint_directory_alone(self):
        parent, regular, target = self.unwritable_checkpoint_dir()
        result = run_single(self, ["--checkpoint-dir", target, "--max-steps", "5"])
        self.assert_one_line_error(result, "cannot write checkpoints", target)
        self.assert_untouched(parent, regular)

    def test_device_cuda_without_a_device(self):
        count, _ = cuda_devices()
        if count > 0:
            self.skipTest("a CUDA device is usable here (tests/python/test_trainer_gpu.py)")
        result = run_single(self, ["--device", "cuda", "--max-steps", "5"])
        self.assertEqual(result.returncode, 2, result)
        self.assert_one_line_error(result, "--device cuda: ", "use --device cpu")
        self.assertEqual(result.stdout, "", result)

    def run_job(self, trainer_args):
        start = time.monotonic()
        result = TrainJob(self, trainer_args, 2).wait(GIVE_UP_AFTER_S + 10)
        elapsed = time.monotonic() - start
        self.assertGreater(result.returncode, 0, result)
        self.assertLess(elapsed, GIVE_UP_AFTER_S, f"took {elapsed:.1f}s\n{result}")
        self.assertTrue(
            any(line.startswith("dlrun: worker failed") for line in result.dlrun_lines()), result
        )
        return result

    def test_wrong_magic_through_dlrun(self):
        what, data, file, words = self.cases()[-1]
        checkpoint_dir = os.path.join(temp_dir(self), "checkpoints")
        result = self.run_job(["--data", data, "--checkpoint-dir", checkpoint_dir])
        # Both ranks read the data; whichever fails first ends the job (the other may be stopped
        # before it gets there). The failed rank's line is on the console and in dlrun's report.
        line = f"dlrun-train: error: {os.path.join(data, file)}: wrong magic"
        self.assertRegex(result.stderr, rf"(?m)^\[[01]\]:{line}", result)
        self.assertTrue(any(line in report for report in result.dlrun_lines()), result)
        self.assert_no_checkpoint(checkpoint_dir)

    def test_unwritable_checkpoint_directory_through_dlrun(self):
        # Only rank 0 checks the directory; rank 1 is then waiting to connect to it and must
        # end on dlrun's SIGTERM, not after the stop timeout's SIGKILL.
        parent, regular, target = self.unwritable_checkpoint_dir()
        result = self.run_job(["--checkpoint-dir", target])
        self.assertIn(
            f"[0]:dlrun-train: error: cannot write checkpoints to {target}", result.stderr, result
        )
        self.assertNotIn("SIGKILL", result.stderr, result)
        self.assert_untouched(parent, regular)


if __name__ == "__main__":
    main()
