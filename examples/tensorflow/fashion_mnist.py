"""What the TensorFlow examples share: Fashion-MNIST from Debian's dataset-fashion-mnist package
(the idx files, read with gzip and numpy: nothing is downloaded), the model, its training step,
the test accuracy and the --report-dir record."""

import gzip
import hashlib
import json
import os

import numpy as np

DATA_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_MAGIC, LABEL_MAGIC = 0x803, 0x801  # idx: unsigned bytes, 3 dimensions / 1 dimension


def _read_idx(path, magic, limit):
    with gzip.open(path, "rb") as f:
        header = np.frombuffer(f.read(4), dtype=">u4")[0]
        if header != magic:
            raise ValueError(f"{path}: idx magic {header:#x}, expected {magic:#x}")
        dims = np.frombuffer(f.read(4 * (magic & 0xFF)), dtype=">u4").astype(int)
        count = dims[0] if limit is None else min(limit, dims[0])
        item = int(np.prod(dims[1:]))
        data = np.frombuffer(f.read(count * item), dtype=np.uint8)
    return data.reshape(count, item) if item > 1 else data


def load(split, limit=None):
    """(images, labels) of `split` ("train" or "t10k"), the first `limit` examples: images
    float32 in [0, 1] of shape (n, 784), labels int32 of shape (n,)."""
    prefix = os.path.join(DATA_DIR, split)
    images = _read_idx(f"{prefix}-images-idx3-ubyte.gz", IMAGE_MAGIC, limit)
    labels = _read_idx(f"{prefix}-labels-idx1-ubyte.gz", LABEL_MAGIC, limit)
    return images.astype(np.float32) / 255.0, labels.astype(np.int32)


def add_training_args(parser):
    parser.add_argument(
        "--train-size", type=int, default=60000, help="train on the first N training examples"
    )
    parser.add_argument(
        "--test-size", type=int, default=10000, help="test on the first N test examples"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow's intra- and inter-op threads (0: its own choice)",
    )
    parser.add_argument(
        "--report-dir", help="write DIR/rank_<RANK>.json: the task TF_CONFIG names, and results"
    )


def import_tensorflow(threads):
    """TensorFlow, quiet unless told otherwise (TF_CPP_MIN_LOG_LEVEL) and on `threads`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


def make_model(args):
    """A small Keras classifier and its SGD optimizer; the initial weights follow --seed. Call
    it inside the strategy's scope."""
    import keras

    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    return model, keras.optimizers.SGD(args.learning_rate)


def replica_step(tf, model, optimizer, global_batch):
    """One replica's training step on (images, labels); returns its loss. The loss is its
    examples' cross-entropy over the global batch, so the replicas' gradients sum to the global
    batch's, which is what the optimizer applies under a strategy."""

    def step(images, labels):
        with tf.GradientTape() as tape:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, model(images, training=True)
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return step


def test_accuracy(model, size):
    images, labels = load("t10k", size)
    return float(np.mean(np.argmax(model(images), axis=1) == labels))


def weights_checksum(model):
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def write_report(directory, resolver, **results):
    """DIR/rank_<RANK>.json (written whole, then renamed): this process's dlrun variables, what
    TFConfigClusterResolver read from TF_CONFIG, and `results`."""
    if not directory:
        return
    env = os.environ
    record = {
        "pid": os.getpid(),
        "rank": int(env.get("RANK", 0)),
        "role": env.get("ROLE_NAME"),
        "role_rank": env.get("ROLE_RANK"),
        "task_type": resolver.task_type,
        "task_id": resolver.task_id,
        "cluster": resolver.cluster_spec().as_dict(),
        **results,
    }
    path = os.path.join(directory, f"rank_{record['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
