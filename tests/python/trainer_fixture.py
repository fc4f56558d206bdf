"""Runs the bundled trainer (dlrun-train) for its acceptance tests, through dlrun or alone.

The binaries come from the DLRUN and DLRUN_TRAIN environment variables (ctest sets both), and
the CUDA runtime dlrun-train was built with from DLRUN_CUDART (empty: built without CUDA).
Every run has a deadline. Every process a test starts is stopped by PID in a cleanup, also when
the test fails: dlrun itself, then each trainer process it had started (found under dlrun in
/proc before dlrun is killed, and only killed while /proc says it still runs dlrun-train, or
dlrun in a child that has not yet exec'd).
"""

import ctypes
import json
import os
import signal
import subprocess
from array import array

from dlrun_fixture import (
    Dlrun,
    Result,
    binary_from_env,
    clean_env,
    die_with_parent,
    dlrun_binary,
    is_running,
    temp_dir,
    wait_until,
)

DATA_DIR = "/usr/share/datasets/fashion-mnist"
DATA_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
TRAIN_TIMEOUT_S = 120  # the longest one training run may take before the test fails
SINGLE_TIMEOUT_S = 30  # one dlrun-train --single run that fails at start or runs a few steps
GONE_WITHIN_S = 5  # a killed trainer process is gone


def train_binary():
    return binary_from_env("DLRUN_TRAIN", "dlrun-train")


def cuda_devices():
    """(how many CUDA devices dlrun-train can use, why there is none), asked of the CUDA runtime
    it was built with."""
    path = os.environ.get("DLRUN_CUDART")
    if not path:
        return 0, "dlrun-train was built without CUDA"
    try:
        runtime = ctypes.CDLL(path)
    except OSError as e:
        return 0, f"cannot load {path}: {e}"
    count = ctypes.c_int(0)
    status = runtime.cudaGetDeviceCount(ctypes.byref(count))
    if status != 0:
        runtime.cudaGetErrorString.restype = ctypes.c_char_p
        return 0, f"cudaGetDeviceCount: {runtime.cudaGetErrorString(status).decode()}"
    return count.value, "" if count.value else "cudaGetDeviceCount found none"


def require_data(test):
    if not all(os.path.exists(os.path.join(DATA_DIR, f)) for f in DATA_FILES):
        test.skipTest(f"Fashion-MNIST is not installed in {DATA_DIR} (dataset-fashion-mnist)")


def descendants(pid):
    """Every living process under `pid`, from /proc/<pid>/task/*/children."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            queue.extend(children)
    return found


def runs_trainer(pid):
    """Whether `pid` still runs dlrun-train, or dlrun in a child not yet past its exec (guards
    against a reused PID)."""
    try:
        exe = os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return False
    return exe in (os.path.realpath(train_binary()), os.path.realpath(dlrun_binary()))


def kill_if_trainer(pid):
    if is_running(pid) and runs_trainer(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class TrainJob(Dlrun):
    """`dlrun [launcher flags] train [trainer flags]`; output goes to files."""

    def __init__(self, test, trainer_args, nproc, launcher_flags=(), env=None):
        super().__init__(
            test,
            ["--standalone", f"--nproc-per-node={nproc}", *launcher_flags, "train", *trainer_args],
            env=env,
        )

    def kill(self):
        trainers = descendants(self.proc.pid) if self.proc.poll() is None else []
        super().kill()
        for pid in trainers:
            kill_if_trainer(pid)
        # SIGKILL takes effect a moment later: the next test should not share the CPUs with them.
        wait_until(
            lambda: not any(is_running(pid) for pid in trainers),
            GONE_WITHIN_S,
            f"killed trainers {trainers} to be gone",
        )

    def wait(self, timeout=TRAIN_TIMEOUT_S):
        return super().wait(timeout)


def dumped_weights(test, trainer_args, nproc, launcher_flags=(), env=None):
    """Runs `train` with --dump-weights, to exit 0: (its final parameters' bytes, the result,
    the job)."""
    path = os.path.join(temp_dir(test), "weights")
    job = TrainJob(test, [*trainer_args, "--dump-weights", path], nproc, launcher_flags, env)
    result = job.wait()
    test.assertEqual(result.returncode, 0, result)
    with open(path, "rb") as f:
        return f.read(), result, job


def run_train(test, trainer_args, nproc, launcher_flags=(), timeout=TRAIN_TIMEOUT_S):
    """Runs a dlrun training job to completion; returns its Result."""
    return TrainJob(test, trainer_args, nproc, launcher_flags).wait(timeout)


def run_single(test, trainer_args, timeout=SINGLE_TIMEOUT_S):
    """Runs `dlrun-train --single ...` to completion (killed at the deadline); returns a Result."""
    env = clean_env(TMPDIR=temp_dir(test))
    try:
        done = subprocess.run(
            [train_binary(), "--single", *trainer_args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed and reaped it
        raise AssertionError(f"dlrun-train still running after {timeout}s: {e.stderr!r}") from None
    return Result(
        done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    )


def rank0_lines(result):
    """Rank 0's stdout lines without the `[0]:` prefix (a --single run's lines as they are)."""
    lines = result.stdout.splitlines()
    if any(line.startswith("[0]:") for line in lines):
        return [line[len("[0]:") :] for line in lines if line.startswith("[0]:")]
    return lines


def summary(test, result):
    """The final JSON summary line of rank 0 (the last line that is a JSON object)."""
    for line in reversed(rank0_lines(result)):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    test.fail(f"no JSON summary from rank 0\n{result}")


def chief_summary(test, result):
    """The summary of the process that scores the model (with --strategy ps: the chief worker,
    not rank 0, a parameter server): the last JSON line with a test accuracy."""
    for line in reversed(result.stdout.splitlines()):
        text = line.split(":", 1)[1] if line.startswith("[") else line
        if text.startswith("{") and '"test_accuracy"' in text:
            return json.loads(text)
    test.fail(f"no summary from the chief\n{result}")


def read_floats(path):
    values = array("f")
    with open(path, "rb") as f:
        values.frombytes(f.read())
    return values


def max_abs_difference(a, b):
    if len(a) != len(b):
        raise AssertionError(f"{len(a)} parameters vs {len(b)}")
    return max(abs(x - y) for x, y in zip(a, b))


DATA_PARALLEL_STEPS = 50
DATA_PARALLEL_TOLERANCE = 1e-4


def data_parallel_weights(
    test, device, nproc, batch_size, path, flags=(), steps=DATA_PARALLEL_STEPS
):
    """The weights after `steps` steps on Fashion-MNIST at a fixed seed and a constant learning
    rate, from `nproc` workers (1: dlrun-train --single) at `batch_size` each, with more trainer
    `flags`."""
    args = [
        "--device",
        device,
        "--epochs",
        "1",
        "--max-steps",
        str(steps),
        "--lr-schedule",
        "constant",
        "--seed",
        "7",
        "--batch-size",
        str(batch_size),
        "--dump-weights",
        path,
        *flags,
    ]
    result = run_single(test, args) if nproc == 1 else run_train(test, args, nproc)
    test.assertEqual(result.returncode, 0, result)
    report = summary(test, result)
    test.assertEqual(report["steps"], steps, result)
    test.assertEqual(report["device"], device, result)
    weights = read_floats(path)
    test.assertGreater(len(weights), 0)
    return weights


def assert_data_parallel_exact(test, device, flags=(), steps=DATA_PARALLEL_STEPS):
    """4 workers at --batch-size 16 end with the same weights as 1 worker at --batch-size 64 (the
    same global batch), up to float summation order; a control run at another global batch shows
    the comparison can tell runs apart. All with more trainer `flags`. Returns the single
    worker's weights."""
    out = temp_dir(test)
    one, four, control = (os.path.join(out, name) for name in ("one", "four", "control"))
    alone = data_parallel_weights(test, device, 1, 64, one, flags, steps)
    parallel = data_parallel_weights(test, device, 4, 16, four, flags, steps)
    test.assertLessEqual(max_abs_difference(alone, parallel), DATA_PARALLEL_TOLERANCE)
    # The same data at another global batch (16) ends elsewhere: the check has teeth.
    other = data_parallel_weights(test, device, 1, 16, control, flags, steps)
    test.assertGreater(max_abs_difference(alone, other), 100 * DATA_PARALLEL_TOLERANCE)
    return alone


def checkpoints(directory):
    """{global step: file name} of the checkpoint-<step>.bin files in `directory`."""
    found = {}
    for name in os.listdir(directory):
        if name.startswith("checkpoint-") and name.endswith(".bin"):
            found[int(name[len("checkpoint-") : -len(".bin")])] = name
    return found
