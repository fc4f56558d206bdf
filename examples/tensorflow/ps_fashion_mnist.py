"""Fashion-MNIST with TensorFlow's ParameterServerStrategy, the cluster from dlrun's roles.

    export PYTHON_EXEC=~/.cache/dlrun/venv/bin/python  # a Python with TensorFlow
    dlrun --standalone --roles chief:1,ps:1:service,worker:2:service \\
          examples/tensorflow/ps_fashion_mnist.py --steps 2000

dlrun's TF_CONFIG lists one task type per role. Parameter servers and workers (`service` roles)
run a tf.distribute.Server until dlrun stops them, then exit 0. The chief is the coordinator: it
creates the variables on the parameter servers, has a ClusterCoordinator schedule --steps training
steps on the workers (each step one batch of one worker, applied asynchronously), prints the test
accuracy and exits 0, which ends the job; dlrun then stops the services. --report-dir writes
what TensorFlow read from TF_CONFIG (and the chief's accuracy) to DIR/rank_<RANK>.json.
"""

import argparse
import os
import signal
import sys

import fashion_mnist as fm

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fm.add_training_args(parser)
    parser.add_argument(
        "--steps", type=int, default=2000, help="training steps, one batch of --batch-size each"
    )
    return parser.parse_args()


def serve(tf, resolver, args):
    """A parameter server or worker: serves until SIGTERM or SIGINT, then exits 0."""
    # TensorFlow's threads may take the signal, and the main thread blocked in C would not run a
    # Python handler: the wakeup pipe gets it from whichever thread does.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    for number in STOP_SIGNALS:
        signal.signal(number, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    fm.write_report(args.report_dir, resolver)
    print(f"{resolver.task_type} {resolver.task_id} serving", flush=True)
    number = os.read(wake_read, 1)[0]
    print(
        f"{resolver.task_type} {resolver.task_id} stopped by {signal.Signals(number).name}",
        flush=True,
    )
    # A gRPC tf.distribute.Server cannot be stopped (Server.stop is unimplemented) and its
    # threads would keep the interpreter from exiting: end here, nothing is left to save.
    sys.stderr.flush()
    os._exit(0)


def train(tf, resolver, args):
    """The chief: variables on the parameter servers, steps scheduled on the workers."""
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    images, labels = fm.load("train", args.train_size)

    def dataset(context):
        batch = context.get_per_replica_batch_size(args.batch_size)
        data = tf.data.Dataset.from_tensor_slices((images, labels))
        return data.shuffle(len(images)).repeat().batch(batch)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset)
    )
    with strategy.scope():
        model, optimizer = fm.make_model(args)
    replica_step = fm.replica_step(tf, model, optimizer, args.batch_size)

    @tf.function
    def step(iterator):
        return strategy.run(replica_step, args=next(iterator))

    iterator = iter(per_worker)
    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps)]
    coordinator.join()
    print(f"last loss {float(losses[-1].fetch()):.4f}", flush=True)
    accuracy = fm.test_accuracy(model, args.test_size)
    workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    print(f"test accuracy {accuracy:.4f} ({args.steps} steps on {workers} workers)", flush=True)
    fm.write_report(args.report_dir, resolver, accuracy=accuracy, steps=args.steps)


def main():
    args = parse_args()
    tf = fm.import_tensorflow(args.threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        serve(tf, resolver, args)
    elif resolver.task_type == "chief":
        train(tf, resolver, args)
    else:
        raise SystemExit(
            f"TF_CONFIG's task type is {resolver.task_type!r}: run under dlrun "
            "--roles chief:1,ps:N:service,worker:M:service"
        )


if __name__ == "__main__":
    main()
