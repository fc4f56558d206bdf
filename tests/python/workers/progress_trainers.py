"""Trains a tiny classifier with PyTorch Lightning or Hugging Face's Trainer, DDP on CPU over gloo,
with dlrun.progress's callback, then holds until the test has looked.

Usage: progress_trainers.py lightning|huggingface OUT_DIR [preempt|resume]
Both trainers read torchrun's environment, which dlrun gives. Nothing is downloaded: the model is
a local nn.Module and the data random (seeded). Writes OUT_DIR/ready_<LOCAL_RANK>.json (the
board's path, the metrics file's, what the trainer counted) and waits for OUT_DIR/release (up to
worker_util.MAX_WAIT_S), then exits past torch's teardown.

`preempt`: PREEMPT_STEPS steps, the trainer's checkpoints under OUT_DIR; rank 0 sends SIGTERM to
its dlrun after step SIGTERM_AT, and the callback stops every rank at one step and saves it: each
rank writes OUT_DIR/stopped_<RANK>.json (the trainer's global step) and ends. `resume`: the same
training resumed from that checkpoint; each rank writes OUT_DIR/resumed_<RANK>.json (the step it
resumed at, the last one) and ends.
"""

import os
import signal
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.progress  # noqa: E402
from worker_util import exit_past_torch_teardown, wait_for_release, write_json  # noqa: E402

MAX_STEPS = 30
PREEMPT_STEPS = 400  # far more than a SIGTERM after SIGTERM_AT takes to stop the job
SIGTERM_AT = 10
BATCH = 4
PER_RANK = 64  # examples each rank trains on per epoch: 16 steps, so 30 steps cross an epoch
FEATURES = 4


def examples(count, seed):
    """`count` points labelled by the sign of their sum."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, FEATURES, generator=generator)
    return x, (x.sum(dim=1) > 0).long()


def train_lightning(out_dir, mode):
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            accuracy = (self.layer(x).argmax(dim=1) == y).float().mean()
            self.log("val_acc", accuracy, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Preempting(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            preempt_at(trainer.global_step)

        def on_train_start(self, trainer, pl_module):
            began["step"] = trainer.global_step

    world = int(os.environ["WORLD_SIZE"])
    train = DataLoader(TensorDataset(*examples(PER_RANK * world, 1)), batch_size=BATCH)
    val = DataLoader(TensorDataset(*examples(32 * world, 2)), batch_size=BATCH)
    began = {}
    root = os.path.join(out_dir, "lightning")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        max_steps=PREEMPT_STEPS if mode else MAX_STEPS,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[dlrun.progress.LightningCallback(), Preempting()],
    )
    trainer.fit(
        Classifier(),
        train,
        val,
        ckpt_path=os.path.join(root, "last.ckpt") if mode == "resume" else None,
    )
    return {
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "began": began,
        "val_acc": float(trainer.callback_metrics.get("val_acc", -1)),
    }


def train_huggingface(out_dir, mode):
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Points(Dataset):
        def __init__(self, count, seed):
            self.x, self.labels = examples(count, seed)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "labels": self.labels[i]}

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, 2)

        def forward(self, x, labels=None):
            logits = self.layer(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    def accuracy(prediction):
        return {
            "accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())
        }

    class Preempting(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            preempt_at(state.global_step)

        def on_train_begin(self, args, state, control, **kwargs):
            began["step"] = state.global_step

    world = int(os.environ["WORLD_SIZE"])
    began = {}
    output = os.path.join(out_dir, "hf") if mode else tempfile.mkdtemp(prefix="hf-output-")
    args = TrainingArguments(
        output_dir=output,
        report_to=[],
        use_cpu=True,
        max_steps=PREEMPT_STEPS if mode else MAX_STEPS,
        per_device_train_batch_size=BATCH,
        logging_steps=5,
        eval_strategy="steps",
        eval_steps=15,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=1,
    )
    trainer = Trainer(
        model=Classifier(),
        args=args,
        train_dataset=Points(PER_RANK * world, 1),
        eval_dataset=Points(32 * world, 2),
        compute_metrics=accuracy,
        callbacks=[dlrun.progress.HuggingFaceCallback(), Preempting()],
    )
    # Resumed at its newest checkpoint-STEP.
    trainer.train(resume_from_checkpoint=mode == "resume")
    evaluations = [
        log["eval_accuracy"] for log in trainer.state.log_history if "eval_accuracy" in log
    ]
    return {
        "global_step": trainer.state.global_step,
        "epoch": int(trainer.state.epoch),
        "began": began,
        "eval_accuracy": evaluations[-1] if evaluations else -1,
    }


def preempt_at(global_step):
    """Rank 0, in the first run of `preempt`: SIGTERM to its dlrun once past SIGTERM_AT."""
    if sys.argv[3:] == ["preempt"] and global_step == SIGTERM_AT and os.environ["RANK"] == "0":
        os.kill(os.getppid(), signal.SIGTERM)


def main():
    trainer, out_dir = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else None
    local_rank = int(os.environ["LOCAL_RANK"])
    train = {"lightning": train_lightning, "huggingface": train_huggingface}[trainer]
    record = train(out_dir, mode)
    if mode:
        name = {"preempt": "stopped", "resume": "resumed"}[mode]
        write_json(
            os.path.join(out_dir, f"{name}_{os.environ['RANK']}.json"),
            {"began": record["began"]["step"], "global_step": record["global_step"]},
        )
        return 0
    board = os.environ["DLRUN_PROGRESS_FILE"]
    record.update(pid=os.getpid(), board=board, metrics_file=f"{board}.metrics.{local_rank}")
    write_json(os.path.join(out_dir, f"ready_{local_rank}.json"), record)
    return wait_for_release(out_dir)


if __name__ == "__main__":
    exit_past_torch_teardown(main())
