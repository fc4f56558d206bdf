"""Trains a tiny classifier with PyTorch Lightning or Hugging Face's Trainer, DDP on CPU over gloo,
with dlrun.progress's callback, then holds until the test has looked.

Usage: progress_trainers.py lightning|huggingface OUT_DIR
Both trainers read torchrun's environment, which dlrun gives. Nothing is downloaded: the model is
a local nn.Module and the data random (seeded). Writes OUT_DIR/ready_<LOCAL_RANK>.json (the
board's path, the metrics file's, what the trainer counted) and waits for OUT_DIR/release (up to
worker_util.MAX_WAIT_S), then exits past torch's teardown.
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrun.progress  # noqa: E402
from worker_util import exit_past_torch_teardown, wait_for_release, write_json  # noqa: E402

MAX_STEPS = 30
BATCH = 4
PER_RANK = 64  # examples each rank trains on per epoch: 16 steps, so 30 steps cross an epoch
FEATURES = 4


def examples(count, seed):
    """`count` points labelled by the sign of their sum."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, FEATURES, generator=generator)
    return x, (x.sum(dim=1) > 0).long()


def train_lightning():
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

    world = int(os.environ["WORLD_SIZE"])
    train = DataLoader(TensorDataset(*examples(PER_RANK * world, 1)), batch_size=BATCH)
    val = DataLoader(TensorDataset(*examples(32 * world, 2)), batch_size=BATCH)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=MAX_STEPS,
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, num_sanity_val_steps=0,
                         callbacks=[dlrun.progress.LightningCallback()])
    trainer.fit(Classifier(), train, val)
    return {"global_step": trainer.global_step, "epoch": trainer.current_epoch,
            "val_acc": float(trainer.callback_metrics["val_acc"])}


def train_huggingface():
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

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
        return {"accuracy": float((prediction.predictions.argmax(-1) ==
                                   prediction.label_ids).mean())}

    world = int(os.environ["WORLD_SIZE"])
    output = tempfile.mkdtemp(prefix="hf-output-")
    args = TrainingArguments(output_dir=output, report_to=[], use_cpu=True, max_steps=MAX_STEPS,
                             per_device_train_batch_size=BATCH, logging_steps=5,
                             eval_strategy="steps", eval_steps=15, save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0, seed=1)
    trainer = Trainer(model=Classifier(), args=args, train_dataset=Points(PER_RANK * world, 1),
                      eval_dataset=Points(32 * world, 2), compute_metrics=accuracy,
                      callbacks=[dlrun.progress.HuggingFaceCallback()])
    trainer.train()
    evaluations = [log["eval_accuracy"] for log in trainer.state.log_history
                   if "eval_accuracy" in log]
    return {"global_step": trainer.state.global_step, "epoch": int(trainer.state.epoch),
            "eval_accuracy": evaluations[-1]}


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    local_rank = int(os.environ["LOCAL_RANK"])
    record = {"lightning": train_lightning, "huggingface": train_huggingface}[mode]()
    board = os.environ["DLRUN_PROGRESS_FILE"]
    record.update(pid=os.getpid(), board=board, metrics_file=f"{board}.metrics.{local_rank}")
    write_json(os.path.join(out_dir, f"ready_{local_rank}.json"), record)
    return wait_for_release(out_dir)


if __name__ == "__main__":
    exit_past_torch_teardown(main())
