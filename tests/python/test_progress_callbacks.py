"""dlrun.progress's trainer callbacks under dlrun (torch 2.13's environment, where scripts/setup.sh
--tests installs lightning, transformers and accelerate): a tiny classifier trained by each
trainer, DDP on CPU over gloo, 2 workers, 30 steps over 2 epochs, with a validation on the way.

- LightningCallback: each worker's slot holds trainer.global_step, the epoch, the loss, the
  validation accuracy (val_acc) and the samples it trained on; local rank 0's steps and loss reach
  the agent's /api/state curve; Lightning's callback metrics are in the metrics file.
- HuggingFaceCallback: the same from Trainer's state and logs (eval_accuracy as the accuracy, the
  other logs, learning_rate among them, in the metrics file). No download: offline, a local
  nn.Module.
- Preemption, with either: SIGTERM to dlrun after step 10 stops both ranks at one step, the
  trainer's checkpoint of it saved (Lightning's last.ckpt, Trainer's checkpoint-STEP), dlrun
  exits 143, and a new launch resumes at that step and trains to the end.
"""

import math
import os
import unittest

from dlrun_fixture import PYTHON, Dlrun, main, read_json, temp_dir, worker
from test_progress_module import REPORTED_ACCURACY, REPORTED_LOSS, ProgressJob, job_env, read_slot

TRAINERS = worker("progress_trainers.py")
MAX_STEPS, BATCH, STEPS_PER_EPOCH = 30, 4, 16  # as progress_trainers.py trains
TRAIN_TIMEOUT_S = 100  # importing and training on a loaded 2-core machine
PREEMPT_STEPS, SIGTERM_AT = 400, 10  # as progress_trainers.py trains


class CallbacksTest(unittest.TestCase):
    def check_trainer(self, mode, accuracy_key, metric_names):
        out = temp_dir(self)
        env = job_env(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            HF_HOME=temp_dir(self),
            TOKENIZERS_PARALLELISM="false",
        )
        job = ProgressJob(
            self, out, [PYTHON, TRAINERS, mode, out], env=env, timeout=TRAIN_TIMEOUT_S
        )
        for local_rank, record in enumerate(job.records):
            self.assertEqual(record["global_step"], MAX_STEPS, record)
            slot = read_slot(record["board"], local_rank)
            self.assertEqual(
                (slot["step"], slot["epoch"], slot["phase"], slot["samples"]),
                (MAX_STEPS, MAX_STEPS // STEPS_PER_EPOCH, 0, MAX_STEPS * BATCH),
                slot,
            )
            self.assertEqual(slot["results"], REPORTED_LOSS | REPORTED_ACCURACY, slot)
            self.assertGreaterEqual(slot["beats"], MAX_STEPS, slot)
            self.assertTrue(0 < slot["loss"] < 5, slot)
            self.assertAlmostEqual(slot["accuracy"], record[accuracy_key], msg=slot)
            metrics = read_json(record["metrics_file"])
            self.assertLessEqual(len(metrics), 8, metrics)
            self.assertTrue(set(metric_names) <= set(metrics), metrics)
            self.assertTrue(all(math.isfinite(v) for v in metrics.values()), metrics)

        point = job.wait_for_curve(MAX_STEPS)
        self.assertIsNotNone(point[3], point)  # the loss
        self.assertAlmostEqual(point[4], job.records[0][accuracy_key])
        result = job.release()
        self.assertNotIn("dlrun.progress:", result.stderr, result)  # no report was dropped

    def check_preemption(self, trainer):
        out = temp_dir(self)
        env = job_env(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            HF_HOME=temp_dir(self),
            TOKENIZERS_PARALLELISM="false",
        )

        def launch(mode):
            return Dlrun(
                self,
                ["--standalone", "--nproc-per-node=2", PYTHON, TRAINERS, trainer, out, mode],
                env=env,
            ).wait(TRAIN_TIMEOUT_S)

        first = launch("preempt")
        self.assertEqual(first.returncode, 143, first)
        stopped = [read_json(os.path.join(out, f"stopped_{r}.json")) for r in (0, 1)]
        self.assertEqual(stopped[0], stopped[1], first)
        step = stopped[0]["global_step"]
        self.assertTrue(SIGTERM_AT < step < PREEMPT_STEPS, stopped)
        second = launch("resume")
        self.assertEqual(second.returncode, 0, second)
        self.assertEqual(
            [read_json(os.path.join(out, f"resumed_{r}.json")) for r in (0, 1)],
            [{"began": step, "global_step": PREEMPT_STEPS}] * 2,
            second,
        )

    def test_lightning_callback_stops_a_preempted_job_at_one_step(self):
        self.check_preemption("lightning")

    def test_hugging_face_callback_stops_a_preempted_job_at_one_step(self):
        self.check_preemption("huggingface")

    def test_lightning_callback(self):
        self.check_trainer("lightning", "val_acc", ["train_loss", "val_acc"])

    def test_hugging_face_callback(self):
        self.check_trainer("huggingface", "eval_accuracy", ["learning_rate", "eval_loss"])


if __name__ == "__main__":
    main()
