"""Fashion-MNIST with TensorFlow's MultiWorkerMirroredStrategy, from the TF_CONFIG dlrun sets.

    export PYTHON_EXEC=~/.cache/dlrun/venv/bin/python  # a Python with TensorFlow
    dlrun --standalone --nproc-per-node=2 examples/tensorflow/mwms_fashion_mnist.py --epochs 2
    # two nodes (run on each; the first one's address is the endpoint):
    dlrun --nnodes=2 --nproc-per-node=2 --rdzv-endpoint=10.0.0.1:29400 --rdzv-id=tf \\
          examples/tensorflow/mwms_fashion_mnist.py --epochs 2

Every worker trains the same small Keras model in lockstep: each step takes the next global batch
of --batch-size examples (the same order on every worker, from --seed), each worker computes the
gradient of its slice, and the strategy all-reduces them. So every worker ends with the same
weights, and N workers learn what one worker learns from the same global batches. Each worker
then prints its accuracy on the test set; --report-dir writes it, the checksum of the final
weights and what TensorFlow read from TF_CONFIG to DIR/rank_<RANK>.json.
"""

import argparse

import fashion_mnist as fm
import numpy as np


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fm.add_training_args(parser)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--steps-per-epoch",
        type=int,
        default=0,
        help="global batches per epoch (default: the training set once)",
    )
    return parser.parse_args()


def training_order(size, args):
    """The examples of every global batch, in order: each epoch a permutation from --seed."""
    rng = np.random.default_rng(args.seed)
    steps = args.epochs * (args.steps_per_epoch or size // args.batch_size)
    epochs = -(-steps * args.batch_size // size)  # whole permutations enough for every step
    order = np.concatenate([rng.permutation(size) for _ in range(epochs)])
    return order[: steps * args.batch_size].reshape(steps, args.batch_size)


def main():
    args = parse_args()
    tf = fm.import_tensorflow(args.threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    workers = strategy.num_replicas_in_sync
    if args.batch_size % workers:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of {workers} workers")
    images, labels = fm.load("train", args.train_size)
    order = training_order(len(images), args)
    steps = len(order)

    def dataset(context):
        # Every pipeline reads the same global batches and keeps its own slice of each.
        per = context.get_per_replica_batch_size(args.batch_size)
        start = context.input_pipeline_id * per
        data = tf.data.Dataset.from_tensor_slices(order[:, start : start + per])
        return data.map(lambda batch: (tf.gather(images, batch), tf.gather(labels, batch)))

    batches = iter(strategy.distribute_datasets_from_function(dataset))
    with strategy.scope():
        model, optimizer = fm.make_model(args)
    # The optimizer sums the workers' gradients (an all-reduce) before it applies them.
    replica_step = fm.replica_step(tf, model, optimizer, args.batch_size)

    @tf.function
    def train_step(iterator):
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce("SUM", losses, axis=None)

    for number in range(steps):
        loss = train_step(batches)
        if (number + 1) % max(1, steps // 5) == 0:
            print(f"step {number + 1}/{steps} loss {float(loss):.4f}", flush=True)
    accuracy = fm.test_accuracy(model, args.test_size)
    print(f"test accuracy {accuracy:.4f} ({workers} workers, {steps} steps)", flush=True)
    fm.write_report(
        args.report_dir,
        resolver,
        accuracy=accuracy,
        checksum=fm.weights_checksum(model),
        steps=steps,
        workers=workers,
    )


if __name__ == "__main__":
    main()
