"""TensorFlow's MultiWorkerMirroredStrategy after a worker is killed (workers/mwms_recovery.py,
under the set-up's environment with tensorflow-cpu).

MWMS has no elastic recovery of its own: when a worker dies mid-training the others wait in
their next collective. dlrun sees the worker's death, stops the others and starts the whole
group again (a new TF_CONFIG with fresh ports); each worker builds the strategy anew and restores
the chief's newest tf.train.Checkpoint. Two workers, --max-restarts=3, a worker SIGKILLed
mid-training in attempts 0, 1 and 2: the job exits 0, both workers end with the same weights,
and every step was taken once (recovery_fixture.RecoveryCase.assert_recovered: the checkpoint's
history, begun.log, and the weights equal a replay of every step in one process).
"""

from dlrun_fixture import PYTHON, main, worker
from recovery_fixture import MAX_RESTARTS, STEPS, RecoveryCase, dlrun_argv, kill_args
from test_tf_strategies import tf_env

MWMS_RECOVERY = worker("mwms_recovery.py")
NPROC = 2


class MwmsRecoveryTest(RecoveryCase):
    def test_three_killed_workers_the_job_comes_back_from_its_checkpoint(self):
        out = self.out_dir()
        agent = self.launch(
            "dlrun",
            dlrun_argv(
                "--standalone",
                f"--nproc-per-node={NPROC}",
                f"--max-restarts={MAX_RESTARTS}",
                PYTHON,
                MWMS_RECOVERY,
                out,
                str(STEPS),
                str(NPROC - 1),
                *kill_args(),
            ),
            tf_env(TMPDIR=self.logs),
        )
        self.run_killed_job([agent], out)
        self.assert_recovered(out, NPROC)


if __name__ == "__main__":
    main()
