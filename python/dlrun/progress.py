"""Progress reports from a worker to its dlrun agent (docs/guides/progress.md).

    import dlrun.progress as progress

    for n, (x, y) in enumerate(loader, 1):
        loss = train_step(x, y)
        progress.step(n, loss=loss.item(), samples=n * len(x), lr=scheduler.get_last_lr()[0])

The agent gives each worker DLRUN_PROGRESS_FILE, the node's progress board
(common/progress_board.h), a file both map: one 64-byte slot per local worker, at 64 * LOCAL_RANK.
A step() is a few stores into the worker's slot and no system call; the agent reads the slots when
it looks (--metrics-port's page and metrics, --hang-timeout's watch). Other named numbers go to a
small JSON file beside the board, at most once a second.

Outside dlrun (DLRUN_PROGRESS_FILE unset or empty) every call returns at once. A board that cannot
be used is named once on stderr, and then nothing is reported: a training run never dies of its
progress reports. A process forked from a worker (a DataLoader worker) reports nothing: the slot
is its parent's, nor does a worker dlrun started ahead before it takes its place.

LightningCallback and HuggingFaceCallback report for PyTorch Lightning's and Hugging Face's
trainers; they are made on first use, so importing this module imports neither library. Where
dlrun holds checkpoint memory for the job (dlrun.checkpoint.active()), they also stop the job at
one step on every rank when dlrun is stopping it (dlrun.checkpoint.should_stop()): a SIGTERM
makes the trainer save that step and return (Lightning: last.ckpt in its checkpoint folder;
Hugging Face: checkpoint-STEP in output_dir), for the next launch to resume from.
"""

import atexit
import json
import math
import mmap
import os
import struct
import sys
import time
from collections.abc import Mapping

__all__ = ["step", "active"]  # the callbacks are left out: `import *` would import their library

# The slot (common/progress_board.h, little-endian): beats u64 at 0, then from offset 8 step i64,
# epoch i64, phase u32, results u32, loss f64, accuracy f64, samples i64.
_SLOT_BYTES = 64
_BEATS = struct.Struct("<Q")
_FIELDS = struct.Struct("<qqIIddq")
_FIELDS_AT = 8
_COMPUTING = 0  # ProgressPhase::Computing: a step report leaves any collective
_REPORTED_LOSS = 1
_REPORTED_ACCURACY = 2

METRICS_EVERY_S = 1.0  # the agent reads the metrics file about once a second
MAX_METRICS = 8
MAX_METRIC_NAME = 32

_UNOPENED = object()
_board = _UNOPENED  # a _Board, None when reports go nowhere, or _UNOPENED before the first call
# The (DLRUN_PROGRESS_FILE, LOCAL_RANK) a forked child inherited: its parent's slot, not its own.
_inherited = None
_bad_call_warned = False


def step(n, *, loss=None, accuracy=None, samples=None, epoch=None, **metrics):
    """Reports that step `n` (an int) is done. `loss` and `accuracy` (numbers; accuracy from 0 to
    1) and `samples` (examples this worker trained on so far) are shown by the agent; `epoch`
    keeps its last value when not given, as do the others. Any other named number (lr=0.1) goes
    to the metrics file: at most 8 names of up to 32 characters, finite values only."""
    board = _board
    if board is None:
        return
    if board is _UNOPENED:
        board = _open()
        if board is None:
            return
    try:
        board.report(n, loss, accuracy, samples, epoch)
        if metrics:
            board.note_metrics(metrics)
    except Exception as e:  # a bad argument: warned once, the report dropped, training goes on
        global _bad_call_warned
        if not _bad_call_warned:
            _bad_call_warned = True
            _warn(f"a step() report was dropped ({type(e).__name__}: {e})")


def active():
    """Whether reports go to a dlrun agent."""
    board = _board
    if board is _UNOPENED:
        board = _open()
    return board is not None


class _Board:
    """This worker's slot on the mapped board, and the values it last wrote there (only the
    worker writes its slot, so they need not be read back)."""

    def __init__(self, path, local_rank):
        try:
            rank = int(local_rank)
        except (TypeError, ValueError):
            rank = -1
        if local_rank is None:
            raise _Unusable("DLRUN_PROGRESS_FILE is set but LOCAL_RANK is not")
        if rank < 0:
            raise _Unusable(
                f"DLRUN_PROGRESS_FILE is set but LOCAL_RANK={local_rank} is not a local rank"
            )
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise _Unusable(f"DLRUN_PROGRESS_FILE={path}: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < _SLOT_BYTES * (rank + 1):
                raise _Unusable(f"DLRUN_PROGRESS_FILE={path} has no slot for LOCAL_RANK {rank}")
            self.map = mmap.mmap(fd, size)  # shared, read and write
        except (OSError, ValueError) as e:
            raise _Unusable(f"DLRUN_PROGRESS_FILE={path}: {getattr(e, 'strerror', e)}") from None
        finally:
            os.close(fd)
        self.at = _SLOT_BYTES * rank
        # Carry on from what the slot holds (zeros on a new board).
        (self.beats,) = _BEATS.unpack_from(self.map, self.at)
        (_, self.epoch, _, self.results, self.loss, self.accuracy, self.samples) = (
            _FIELDS.unpack_from(self.map, self.at + _FIELDS_AT)
        )
        self.metrics_path = f"{path}.metrics.{rank}"
        self.metrics = {}  # name -> latest value, converted when written; None: writing failed
        self.metrics_due = 0.0
        self.metrics_unwritten = False

    def report(self, n, loss, accuracy, samples, epoch):
        # New values are checked by packing them before any is kept, so a bad one spoils nothing.
        results = self.results
        if loss is None:
            loss = self.loss
        else:
            loss = float(loss)
            results |= _REPORTED_LOSS
        if accuracy is None:
            accuracy = self.accuracy
        else:
            accuracy = float(accuracy)
            results |= _REPORTED_ACCURACY
        if samples is None:
            samples = self.samples
        if epoch is None:
            epoch = self.epoch
        # The fields first, the beat last (x86-64 keeps stores in order): a reader that sees the
        # beat sees the fields, as ProgressReporter::step's release store promises.
        _FIELDS.pack_into(
            self.map, self.at + _FIELDS_AT, n, epoch, _COMPUTING, results, loss, accuracy, samples
        )
        self.beats += 1
        _BEATS.pack_into(self.map, self.at, self.beats)
        self.results, self.loss, self.accuracy, self.samples, self.epoch = (
            results,
            loss,
            accuracy,
            samples,
            epoch,
        )

    def note_metrics(self, metrics):
        pending = self.metrics
        if pending is None:
            return
        for name, value in metrics.items():
            if name in pending or (len(pending) < MAX_METRICS and 0 < len(name) <= MAX_METRIC_NAME):
                pending[name] = value  # converted only when written: a tensor costs nothing here
        self.metrics_unwritten = True
        now = time.monotonic()
        if now >= self.metrics_due:
            self.metrics_due = now + METRICS_EVERY_S
            self.write_metrics()

    def write_metrics(self):
        self.metrics_unwritten = False
        values = {}
        for name, value in list(self.metrics.items()):
            number = _number(value)
            if number is None:
                del self.metrics[name]  # frees its place among the 8
            else:
                values[name] = number
        # Replaced whole, so the agent never reads a file half written.
        temporary = f"{self.metrics_path}.tmp"
        try:
            with open(temporary, "w") as f:
                json.dump(values, f)
            os.replace(temporary, self.metrics_path)
        except OSError as e:
            self.metrics = None
            _warn(f"cannot write {self.metrics_path}: {e.strerror}; named metrics are not reported")


class _Unusable(Exception):
    pass


def _number(value):
    """`value` as a finite float, or None (text, a bool, a tensor of several elements...)."""
    if isinstance(value, (str, bytes, bool)):
        return None
    try:
        number = float(value)
    except Exception:
        return None
    return number if math.isfinite(number) else None


def _open():
    global _board
    board = None
    path = os.environ.get("DLRUN_PROGRESS_FILE", "")
    if path:
        from dlrun._reserve import reserved  # under dlrun only: outside it nothing more

        local_rank = os.environ.get("LOCAL_RANK")
        # A worker started ahead holds the environment of the worker it may replace, whose slot
        # is live: it reports once it took that place.
        if not reserved() and (path, local_rank) != _inherited:
            try:
                board = _Board(path, local_rank)
            except _Unusable as e:
                _warn(f"{e}; progress is not reported")
    _board = board
    return board


def _flush_metrics():
    """Writes the named metrics held back by the once-a-second limit: at the end of training,
    when no step() may come to write them."""
    board = _board
    if isinstance(board, _Board) and board.metrics is not None and board.metrics_unwritten:
        board.write_metrics()


def _warn(message):
    try:
        sys.stderr.write(f"dlrun.progress: {message}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr is no reason to stop training
        pass


def _after_fork_in_child():
    # A child with its parent's environment would write its parent's slot: it reports nothing. A
    # child given another worker's environment (dlrun's warm-start zygote forks the workers and
    # then sets theirs) reports to its own slot.
    global _board, _inherited
    _inherited = (os.environ.get("DLRUN_PROGRESS_FILE", ""), os.environ.get("LOCAL_RANK"))
    if isinstance(_board, _Board):
        _board.map.close()  # unmaps the child's copy only
    _board = _UNOPENED


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_metrics)


# The trainers' callbacks, made on first use (PEP 562), so that importing this module never
# imports PyTorch Lightning or transformers.

LOSS_EVERY_S = 0.1  # a loss on a GPU is read no more often: reading it waits for the GPU


def __getattr__(name):
    makers = {
        "LightningCallback": _lightning_callback,
        "HuggingFaceCallback": _hugging_face_callback,
    }
    if name not in makers:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = makers[name]()
    cls.__module__, cls.__qualname__ = __name__, name  # so that pickle finds it here
    globals()[name] = cls
    return cls


def __dir__():
    return sorted(list(globals()) + ["LightningCallback", "HuggingFaceCallback"])


def _batch_size(batch):
    """The length of the batch's first tensor (the batch itself, or the first one in a list,
    tuple or dict); 0 when there is none."""
    if isinstance(batch, Mapping):  # a dict, or transformers' BatchEncoding
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        batch = next((item for item in batch if getattr(item, "shape", None)), None)
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 0


def _is_accuracy(name):
    words = name.lower().replace("/", "_").replace(".", "_").split("_")
    return "acc" in words or "accuracy" in words


def _accuracy(metrics):
    """The accuracy among Lightning's callback metrics (val_acc, val/accuracy, accuracy...), a
    validation one first; None when there is none."""
    names = sorted(
        (name for name in metrics if _is_accuracy(name)),
        key=lambda name: not name.lower().startswith("val"),
    )
    return _number(metrics[names[0]]) if names else None


def _stopping(global_step):
    """Whether the job stops after this step, the same on every rank (dlrun.checkpoint)."""
    from dlrun import checkpoint

    return checkpoint.active() and checkpoint.should_stop(global_step)


def _lightning_callback():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # the package's older name

    class LightningCallback(Callback):
        """Reports each training batch (trainer.global_step, its loss, the epoch and the samples
        seen so far) and each validation's accuracy (a callback metric named val_acc, accuracy
        or alike); Lightning's other callback metrics go to the metrics file."""

        def __init__(self):
            super().__init__()
            self._samples = 0
            self._loss_due = 0.0
            self._metrics_due = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if _stopping(trainer.global_step):
                trainer.should_stop = True
                trainer.save_checkpoint(self._last(trainer))  # every rank calls it
            if not active():
                return
            self._samples += _batch_size(batch)
            metrics = {}
            now = time.monotonic()
            if now >= self._metrics_due:  # building the dict every batch would cost more
                self._metrics_due = now + METRICS_EVERY_S
                metrics = {str(k): v for k, v in trainer.callback_metrics.items()}
            step(
                trainer.global_step,
                loss=self._loss(outputs, now),
                samples=self._samples,
                epoch=trainer.current_epoch,
                **metrics,
            )

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking or not active():
                return
            metrics = {str(k): v for k, v in trainer.callback_metrics.items()}
            step(
                trainer.global_step,
                accuracy=_accuracy(metrics),
                epoch=trainer.current_epoch,
                **metrics,
            )

        def on_train_end(self, trainer, pl_module):
            _flush_metrics()

        @staticmethod
        def _last(trainer):
            """last.ckpt in the trainer's checkpoint folder (fit(ckpt_path="last") finds it),
            else in its root folder."""
            folder = getattr(trainer.checkpoint_callback, "dirpath", None)
            return os.path.join(folder or trainer.default_root_dir, "last.ckpt")

        def _loss(self, outputs, now):
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if loss is None:
                return None
            device = getattr(loss, "device", None)
            if device is not None and device.type != "cpu":
                if now < self._loss_due:
                    return None
                self._loss_due = now + LOSS_EVERY_S
            return _number(loss)

    return LightningCallback


def _hugging_face_callback():
    from transformers import TrainerCallback

    class HuggingFaceCallback(TrainerCallback):
        """Reports each step (state.global_step, the epoch, the samples this worker trained on,
        counted from the batch size), and each log: its loss, eval_accuracy as the accuracy,
        its other numbers (learning_rate, grad_norm, eval_loss...) to the metrics file."""

        def on_step_end(self, args, state, control, **kwargs):
            if _stopping(state.global_step):
                control.should_save = control.should_training_stop = True
            if not active():
                return
            samples = (
                state.global_step
                * args.per_device_train_batch_size
                * args.gradient_accumulation_steps
            )
            step(state.global_step, epoch=int(state.epoch or 0), samples=samples)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not active() or not logs:
                return
            metrics = {
                str(k): v for k, v in logs.items() if k not in ("loss", "eval_accuracy", "epoch")
            }
            step(
                state.global_step,
                loss=_number(logs.get("loss")),
                accuracy=_number(logs.get("eval_accuracy")),
                epoch=int(state.epoch or 0),
                **metrics,
            )

        def on_train_end(self, args, state, control, **kwargs):
            _flush_metrics()

    return HuggingFaceCallback
