"""TensorFlow MultiWorkerMirroredStrategy that resumes from its checkpoint after a restart.

Usage: mwms_recovery.py OUT_DIR STEPS VICTIM_RANK [ATTEMPT:STEP ...]

MWMS has no elastic recovery of its own: a worker lost mid-step leaves the others in a
collective. Under dlrun the whole group restarts (a new TF_CONFIG, new ports) and every worker
restores the newest checkpoint. The model: a small float64 MLP on synthetic data (the batch of
each step and worker is the same in every attempt), its variables made under the strategy's
scope; each step every worker computes the gradient of its slice, the strategy sums them, and
every worker applies the same SGD-with-momentum update.

Checkpoints (tf.train.Checkpoint, as TensorFlow's multi-worker guide has it): every worker saves
after every step, the chief (task 0) to OUT_DIR/checkpoint, the others to a directory of their
own; the checkpoint holds the variables, the momentum, `history` (history[s] = the attempt that
completed step s, else -1) and `step` (the last step completed). The chief appends
`ATTEMPT STEP` to OUT_DIR/begun.log as it begins each step. In each ATTEMPT:STEP of the command
line, VICTIM_RANK writes its pid to OUT_DIR/victim_<ATTEMPT>.pid once the chief's checkpoint of
STEP is the newest, then waits for the test's SIGKILL.

At the end every worker writes OUT_DIR/done_<RANK>.json: its attempt, the step it began at, a
checksum of its weights; the chief adds the history (as [step, attempt] pairs) and how far its
weights are from a replay of all STEPS steps in one process (no strategy), and from a replay
one step short.
"""

import hashlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worker_util import wait_to_be_stopped, write_atomic, write_json  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

BATCH = 16  # each worker's part of a step
LEARNING_RATE, MOMENTUM = 0.05, 0.9
SEED = 1234
CHECKPOINT_WAIT_S = 30  # the victim's wait for the chief's checkpoint


def initial_values():
    rng = np.random.default_rng(SEED)
    return [rng.normal(0, 0.3, (8, 16)), np.zeros(16), rng.normal(0, 0.3, (16, 1)), np.zeros(1)]


def batch(step, rank):
    x = np.random.default_rng(step * 1000 + rank).normal(size=(BATCH, 8))
    return x, x.sum(axis=1, keepdims=True)


def loss_of(params, x, y, scale):
    w1, b1, w2, b2 = params
    prediction = tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2
    return tf.reduce_mean(tf.square(prediction - y)) * scale


def apply(params, momenta, gradients):
    for p, m, g in zip(params, momenta, gradients):
        m.assign(MOMENTUM * m + g)
        p.assign_sub(LEARNING_RATE * m)


def replay(steps, workers):
    """The weights after `steps` steps without a strategy, and after steps - 1."""
    params = [tf.Variable(v) for v in initial_values()]
    momenta = [tf.Variable(tf.zeros_like(v)) for v in params]
    one_short = None
    for step in range(steps):
        if step == steps - 1:
            one_short = [p.numpy().copy() for p in params]
        data = [batch(step, rank) for rank in range(workers)]
        x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
        with tf.GradientTape() as tape:
            loss = loss_of(params, x, y, 1.0)
        apply(params, momenta, tape.gradient(loss, params))
    return [p.numpy() for p in params], one_short


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def wait_for_checkpoint(directory, step):
    """Until the chief's newest checkpoint is that of `step` (a file written whole, then
    renamed, by TensorFlow); exits 5 past CHECKPOINT_WAIT_S."""
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    while (tf.train.latest_checkpoint(directory) or "").rsplit("-", 1)[-1] != str(step):
        if time.monotonic() >= deadline:
            os._exit(5)
        time.sleep(0.05)


def main():
    out_dir, steps, victim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    kills = {int(a): int(s) for a, s in (item.split(":") for item in sys.argv[4:])}
    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        params = [tf.Variable(v) for v in initial_values()]
        momenta = [tf.Variable(tf.zeros_like(v)) for v in initial_values()]
        history = tf.Variable(tf.fill([steps], tf.constant(-1, tf.int64)))
        last = tf.Variable(tf.constant(-1, tf.int64))
    state = tf.train.Checkpoint(params=params, momenta=momenta, history=history, step=last)
    chief_dir = os.path.join(out_dir, "checkpoint")
    own_dir = chief_dir if resolver.task_id == 0 else os.path.join(out_dir, f"scratch_{rank}")
    manager = tf.train.CheckpointManager(state, own_dir, max_to_keep=1)
    newest = tf.train.latest_checkpoint(chief_dir)
    if newest:
        state.restore(newest).assert_consumed()
    start = int(last.numpy()) + 1

    def replica_gradients(x, y):
        with tf.GradientTape() as tape:
            # Each worker's share of the global batch's mean: the sum over workers is its loss.
            loss = loss_of(params, x, y, 1.0 / workers)
        return tape.gradient(loss, params)

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(replica_gradients, args=(x, y))
        apply(params, momenta, [strategy.reduce("SUM", g, axis=None) for g in per_replica])

    begun = os.open(os.path.join(out_dir, "begun.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for step in range(start, steps):
        if resolver.task_id == 0:
            os.write(begun, f"{attempt} {step}\n".encode())
        train_step(*map(tf.constant, batch(step, rank)))
        history.assign(tf.tensor_scatter_nd_update(history, [[step]], [attempt]))
        last.assign(step)
        manager.save(checkpoint_number=step)
        if rank == victim and kills.get(attempt) == step:
            wait_for_checkpoint(chief_dir, step)
            write_atomic(os.path.join(out_dir, f"victim_{attempt}.pid"), str(os.getpid()))
            wait_to_be_stopped()
    os.close(begun)

    weights = [p.numpy() for p in params]
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights))
    record = {
        "rank": rank,
        "world": workers,
        "attempt": attempt,
        "start": start,
        "checksum": digest.hexdigest(),
    }
    if resolver.task_id == 0:
        expected, one_short = replay(steps, workers)
        # recovery_fixture's form: [step, attempt] per step completed.
        record["history"] = [[s, int(a)] for s, a in enumerate(history.numpy()) if a >= 0]
        record["replay_diff"] = max_diff(weights, expected)
        record["one_short_diff"] = max_diff(weights, one_short)
    write_json(os.path.join(out_dir, f"done_{rank}.json"), record)
    sys.stdout.flush()
    # The workers' gRPC servers outlive main(); a worker that finished must not wait for the
    # others' (TensorFlow's teardown would).
    os._exit(0)


if __name__ == "__main__":
    main()
