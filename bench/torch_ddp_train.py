"""dlrun-train's job in PyTorch DDP, for train_bench.sh: the same model, data, optimizer,
schedule and data-order semantics, so the two can be timed against each other.

- Model (--model): an MLP 784-256-128-10 (--hidden), ReLU; or dlrun-train's CNN, the same
  layers (Conv2d(1,16,3,padding=1), ReLU, MaxPool2d(2), Conv2d(16,32,3,padding=1), ReLU,
  MaxPool2d(2), Flatten, Linear(1568,128), ReLU, Linear(128,10)) after an Unflatten of the
  784 pixels; softmax cross-entropy. Weights He-normal (std sqrt(2 / fan_in)) and biases zero,
  as dlrun-train initialises them (not torch's default), so both start from equally good (not
  identical) weights.
- Data: Fashion-MNIST read from the IDX gz files in --data with gzip + numpy, scaled to [0, 1].
- Order: DistributedSampler(shuffle=True, seed=--seed, drop_last=False) with set_epoch, so each
  rank sees every WORLD_SIZE-th index of a permutation seeded by seed + epoch, padded as
  dlrun-train pads (dlrun-train draws its permutation with its own generator, so the orders
  follow the same rules but are not the same permutations).
- Batches: --batch-size per rank, gathered by indexing the in-memory tensors with the
  sampler's indices (no DataLoader workers, no per-sample collation: the fastest way to feed
  PyTorch from memory, as dlrun-train copies rows into a batch buffer).
- Optimizer: torch.optim.SGD(lr, momentum, weight_decay) on every parameter, biases included,
  as dlrun-train's Sgd; DDP averages gradients over the ranks, as dlrun-train does. The learning
  rate is set before every step to lr * 0.5 * (1 + cos(pi * (epoch + step / steps) / epochs)),
  dlrun-train's cosine schedule by epoch progress (--lr-schedule constant: lr throughout).
- Evaluation after each epoch: each rank scores a contiguous slice of the test set in chunks of
  1000 and the counts are summed with all_reduce, as dlrun-train does.

Runs under torchrun (or anything that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); with
WORLD_SIZE unset it runs alone. Rank 0 prints dlrun-train's lines:
  epoch E/EPOCHS: train loss L, test accuracy A, R samples/s, S s
(R: training samples per second of that epoch, evaluation excluded; S: seconds since training
started), then one JSON line with dlrun-train's summary keys (samples_per_sec is the last
epoch's, as there) plus train_samples_per_sec (over all epochs, evaluation excluded) and
setup_seconds (process start to the first step: imports, data, process group).
"""

import time

PROCESS_START = time.monotonic()

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def read_idx(path, dims):
    """One IDX file (gzip or plain) as a uint8 array of `dims` dimensions."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic != 0x800 + dims:
        raise SystemExit(
            f"torch_ddp_train.py: {path}: magic {magic:#x}, expected {0x800 + dims:#x}"
        )
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    payload = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if payload.size != math.prod(shape):
        raise SystemExit(
            f"torch_ddp_train.py: {path}: {payload.size} bytes, expected {math.prod(shape)}"
        )
    return payload.reshape(shape)


def load_split(directory, prefix):
    def path(name):
        gz = os.path.join(directory, name + ".gz")
        return gz if os.path.exists(gz) else os.path.join(directory, name)

    images = read_idx(path(f"{prefix}-images-idx3-ubyte"), 3)
    labels = read_idx(path(f"{prefix}-labels-idx1-ubyte"), 1)
    x = torch.from_numpy(images.reshape(images.shape[0], -1).astype(np.float32) / 255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class IndexOnly(torch.utils.data.Dataset):
    """What DistributedSampler needs of a dataset: its length."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        return i


def he(layer):
    nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
    nn.init.zeros_(layer.bias)
    return layer


def make_cnn():
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        he(nn.Conv2d(1, 16, 3, padding=1)),
        nn.ReLU(),
        nn.MaxPool2d(2),
        he(nn.Conv2d(16, 32, 3, padding=1)),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        he(nn.Linear(32 * 7 * 7, 128)),
        nn.ReLU(),
        he(nn.Linear(128, 10)),
    )


def make_model(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(he(nn.Linear(widths[i], widths[i + 1])))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for the global batch")
    parser.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads per worker (1, as OMP_NUM_THREADS=1)",
    )
    parser.add_argument("--progress-every", type=int, default=100)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "WORLD_SIZE" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "0")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", init_method="env://")
    speaks = rank == 0

    def say(text):
        if speaks:
            print(text, flush=True)

    train_x, train_y = load_split(args.data, "train")
    test_x, test_y = load_split(args.data, "t10k")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = make_cnn() if args.model == "cnn" else make_model([train_x.shape[1], *args.hidden, 10])
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    sampler = DistributedSampler(
        IndexOnly(train_x.shape[0]),
        num_replicas=world,
        rank=rank,
        shuffle=True,
        seed=args.seed,
        drop_last=False,
    )

    per = (test_x.shape[0] + world - 1) // world
    test_begin = min(test_x.shape[0], rank * per)
    test_end = min(test_x.shape[0], test_begin + per)

    def test_accuracy():
        counts = torch.zeros(2, dtype=torch.float64)
        counts[1] = test_end - test_begin
        with torch.no_grad():
            for i in range(test_begin, test_end, 1000):
                j = min(i + 1000, test_end)
                counts[0] += (model(test_x[i:j]).argmax(dim=1) == test_y[i:j]).sum().item()
        dist.all_reduce(counts)
        return (counts[0] / counts[1]).item() if counts[1] > 0 else 0.0

    started = time.monotonic()
    setup_seconds = started - PROCESS_START
    step = 0
    train_seconds = 0.0
    train_samples = 0
    last = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        shard = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        steps = (len(shard) + args.batch_size - 1) // args.batch_size
        epoch_start = time.monotonic()
        loss_sum = 0.0
        samples = 0
        model.train()
        for s in range(steps):
            index = shard[s * args.batch_size : (s + 1) * args.batch_size]
            x, y = train_x[index], train_y[index]
            if args.lr_schedule == "cosine":
                progress = (epoch + s / steps) / args.epochs
                lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
                for group in optimizer.param_groups:
                    group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            # The mean loss over the ranks, as dlrun-train reports it (it all-reduces the loss
            # with the gradients; here it is a rank-local value, read without another
            # collective so that the step costs what a plain DDP step costs).
            loss_sum += loss.item()
            samples += len(index) * world
            step += 1
            if (s + 1) % args.progress_every == 0:
                say(f"epoch {epoch + 1}/{args.epochs} step {s + 1}/{steps} loss {loss.item():.4f}")
        now = time.monotonic()
        epoch_seconds = now - epoch_start
        train_seconds += epoch_seconds
        train_samples += samples
        model.eval()
        accuracy = test_accuracy()
        last = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / max(steps, 1),
            "test_accuracy": accuracy,
            "samples_per_sec": samples / epoch_seconds if epoch_seconds > 0 else 0.0,
            "seconds": now - started,
        }
        say(
            f"epoch {epoch + 1}/{args.epochs}: train loss {last['train_loss']:.4f}, "
            f"test accuracy {accuracy:.4f}, {last['samples_per_sec']:.0f} samples/s, "
            f"{last['seconds']:.1f} s"
        )
    if last is not None:
        say(
            json.dumps(
                {
                    "epochs": last["epoch"],
                    "steps": step,
                    "world_size": world,
                    "train_loss": round(last["train_loss"], 6),
                    "test_accuracy": round(last["test_accuracy"], 6),
                    "samples_per_sec": round(last["samples_per_sec"], 1),
                    "seconds": round(last["seconds"], 3),
                    "train_samples_per_sec": round(train_samples / train_seconds, 1),
                    "setup_seconds": round(setup_seconds, 3),
                }
            )
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
