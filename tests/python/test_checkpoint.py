"""In-memory checkpoints (issue 56): dlrun.checkpoint under dlrun keeps each rank's copy in the
agent's shared memory, and after a restart every rank loads the job's newest complete step. The
job is workers/checkpoint_job.py (a state of several dtypes a step and rank, saved every step).

- A worker SIGKILLed once step 5 is complete everywhere: the whole group restarts and every rank
  loads step 5 from its node's memory, bit-equal to what was saved, and saves on to the end;
  the tensors it loaded stay as loaded through the later saves.
- Tensors loaded in the middle of a job (the process saved into that slot before) stay as
  loaded while later saves reuse the slot.
- A copy corrupted on purpose (rank 1's step 5, as the job fails before any rank saves step 6):
  refused by its checksum, and every rank loads step 4, which they all still hold.
- A rank killed while its copy of step 5 is being written: step 4 stays the job's.
- No shared memory is left after the job, whether it succeeds or fails; a SIGKILLed agent's is
  removed by the next agent that starts on the node.
- Preemption: SIGTERM to dlrun stops both ranks at one step (should_stop()), dlrun writes it to
  --checkpoint-dir as it ends, and a new launch loads it from there, bit-equal, and goes on;
  where rank 0's torch serves the store, rank 0 stays until the last rank had its answer.
- With --checkpoint-write-every the agent writes the step the ranks name while the job runs:
  dlrun SIGKILLed, a new launch loads the newest step every rank has in the directory.
- A rank renumbered in process (rank 0 of 1 after being rank 1 of 2) saves and loads in its new
  world; a replacement joining its survivors in process loads nothing (its state comes from them).
- Outside dlrun, save and load are torch.save and torch.load in DLRUN_CHECKPOINT_DIR; without a
  directory, a one-line error.
- save(..., overlap=True) (workers/overlap_job.py: DDP, a BatchNorm, SGD): a worker SIGKILLed
  once step 5 is complete everywhere, every rank loads step 5 bit-equal to the state it had as
  it saved it. A copy held back until the next step's optimizer.step(): the optimizer waits for
  it, and it counts. A parameter changed in place after save() returned and before its copy was made
  (torch 2): that copy is not counted, no rank waits for it, and the job resumes from step 4
  (torch 1.13 copies in save(): the change comes after, and step 5 counts).
"""

import glob
import os
import signal
import subprocess
import unittest

from dlrun_fixture import PYTHON, Dlrun, clean_env, main, read_json, temp_dir, wait_until, worker
from test_progress_module import package_env

JOB = worker("checkpoint_job.py")
OVERLAP_JOB = worker("overlap_job.py")
STEPS = 8
WORLD = 2
TIMEOUT_S = 120


def memory_dirs(agent_pid=None):
    """This user's dlrun checkpoint directories in /dev/shm (of one agent, if given)."""
    pattern = f"dlrun-checkpoints.{os.getuid()}.{agent_pid if agent_pid else '*'}.*"
    return glob.glob(os.path.join("/dev/shm", pattern))


def written(directory, world=WORLD):
    """The steps every rank has whole in `directory` (DIR/rank-R/step-S/step, as dlrun writes)."""
    held = [
        {
            int(os.path.basename(os.path.dirname(mark)).split("-")[1])
            for mark in glob.glob(os.path.join(directory, f"rank-{r}", "step-*", "step"))
        }
        for r in range(world)
    ]
    return set.intersection(*held)


class CheckpointTest(unittest.TestCase):
    def job(self, *faults, max_restarts=1, expect=0, program=JOB):
        out = temp_dir(self)
        launch = Dlrun(
            self,
            [
                "--standalone",
                f"--nproc-per-node={WORLD}",
                f"--max-restarts={max_restarts}",
                PYTHON,
                program,
                out,
                str(STEPS),
                *faults,
            ],
            env=clean_env(),
        )
        result = launch.wait(TIMEOUT_S)
        self.assertEqual(result.returncode, expect, result)
        self.assertEqual(memory_dirs(launch.pid), [], "shared memory left after the job")
        return out, result

    def loaded(self, out, attempt):
        return [read_json(os.path.join(out, f"loaded_{r}_{attempt}.json")) for r in range(WORLD)]

    def test_a_restarted_job_loads_the_newest_complete_step_from_memory(self):
        out, result = self.job("kill:1:5")
        self.assertEqual(self.loaded(out, 0), [{"step": None, "equal": False}] * WORLD)
        self.assertEqual(self.loaded(out, 1), [{"step": 5, "equal": True}] * WORLD, result)
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), rank)
            # Steps 6 and 7 saved since: the second into the slot step 5 was loaded from.
            self.assertEqual(
                read_json(os.path.join(out, f"kept_{rank}_1.json")), {"equal": True}, rank
            )

    def test_tensors_loaded_mid_job_stay_as_loaded_through_later_saves(self):
        # Every rank loads step 3 again in the process that saved it, then saves 4 to 7: step
        # 5 goes into the slot step 3 was loaded from.
        out, result = self.job("reload:3")
        for rank in range(WORLD):
            self.assertEqual(read_json(os.path.join(out, f"reloaded_{rank}.json")), {"step": 3})
            self.assertEqual(
                read_json(os.path.join(out, f"kept_{rank}_0.json")), {"equal": True}, rank
            )

    def test_a_corrupt_copy_is_refused_and_the_previous_step_loaded(self):
        out, result = self.job("corrupt:1:5")
        self.assertEqual(self.loaded(out, 1), [{"step": 4, "equal": True}] * WORLD, result)
        self.assertIn(
            "rank 1: step 5's copy does not match its checksum; not loaded", result.stderr
        )

    def test_a_rank_killed_mid_save_leaves_the_previous_step_the_jobs(self):
        out, result = self.job("midsave:0:5")
        self.assertEqual(self.loaded(out, 1), [{"step": 4, "equal": True}] * WORLD, result)

    def test_an_overlapped_save_is_loaded_as_the_state_was_at_save(self):
        out, result = self.job("kill:1:5", program=OVERLAP_JOB)
        self.assertEqual([r["step"] for r in self.loaded(out, 0)], [None] * WORLD)
        self.assertEqual([(r["step"], r["equal"]) for r in self.loaded(out, 1)], [(5, True)] * 2)
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), rank)

    def test_the_next_optimizer_step_waits_for_an_overlapped_copy(self):
        out, result = self.job("late:1:5", program=OVERLAP_JOB)
        self.assertNotIn("changed in place", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "early_1")), "stepped before the copy")
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), rank)

    def test_an_overlapped_copy_changed_in_place_is_not_counted(self):
        out, result = self.job("poke:1:5", "kill:0:5", program=OVERLAP_JOB)
        loaded = self.loaded(out, 1)
        step = 4 if loaded[0]["overlap"] else 5
        self.assertEqual([(r["step"], r["equal"]) for r in loaded], [(step, True)] * WORLD, result)
        if loaded[0]["overlap"]:
            self.assertIn(
                "rank 1: step 5's state changed in place while it was copied", result.stderr
            )
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), rank)

    def test_a_failed_job_leaves_no_shared_memory(self):
        self.job("kill:0:2", max_restarts=0, expect=137)

    def test_a_killed_agents_memory_is_removed_by_the_next_agent(self):
        out = temp_dir(self)
        launch = Dlrun(
            self,
            ["--standalone", f"--nproc-per-node={WORLD}", PYTHON, JOB, out, "2", "hold"],
            env=clean_env(),
        )
        wait_until(
            lambda: all(os.path.exists(os.path.join(out, f"held_{r}")) for r in range(WORLD)),
            TIMEOUT_S,
            "both ranks' steps saved",
            proc=launch.proc,
            on_timeout=launch.describe,
        )
        launch.signal(signal.SIGKILL)
        launch.proc.wait()
        self.assertEqual(len(memory_dirs(launch.pid)), 1)  # nothing ran to remove it
        open(os.path.join(out, "release"), "w").close()  # the orphaned workers end
        self.job()
        self.assertEqual(memory_dirs(launch.pid), [])

    def test_preemption_stops_every_rank_at_one_step_and_a_new_launch_resumes_there(self):
        # SIGTERM to dlrun as rank 0 waits after step 3 and rank 1 is in step 4: both stop at
        # step 5 (rank 0 names it as it sees its SIGTERM, two ahead: rank 1 learns of it from
        # what its save of step 5 saw), dlrun writes it to --checkpoint-dir as it ends, and a
        # new launch loads it, bit-equal, and trains on from step 6.
        self.preempt()

    def test_preemption_where_rank_0_serves_the_store_waits_for_the_last_rank_to_ask(self):
        # As above with the store rank 0's torch serves (as on a torch without libuv): rank 1
        # asks should_stop() at step 5 only once rank 0 has its answer; rank 0 stays until rank
        # 1 has its own (the store would end with rank 0's process), and both stop at step 5.
        self.preempt("--worker-store=rank0", "late:1:5")

    def preempt(self, *args):
        directory, out, after = temp_dir(self), temp_dir(self), temp_dir(self)
        flags = ["--standalone", f"--nproc-per-node={WORLD}", f"--checkpoint-dir={directory}"]
        flags += [a for a in args if a.startswith("--")]
        job = [a for a in args if not a.startswith("--")]
        launch = Dlrun(self, [*flags, PYTHON, JOB, out, "1000", "preempt:3", *job], env=clean_env())
        wait_until(
            lambda: os.path.exists(os.path.join(out, "preempt_3")),
            TIMEOUT_S,
            "rank 0 at step 3",
            proc=launch.proc,
            on_timeout=launch.describe,
        )
        launch.signal(signal.SIGTERM)
        result = launch.wait(TIMEOUT_S)
        self.assertEqual(result.returncode, 128 + signal.SIGTERM, result)
        self.assertEqual(
            [read_json(os.path.join(out, f"stopped_{r}.json")) for r in range(WORLD)],
            [{"step": 5}] * WORLD,
            result,
        )
        self.assertIn(f"checkpoints: step 5 of rank(s) 0, 1 written to {directory}", result.stderr)
        self.assertEqual(memory_dirs(launch.pid), [], "shared memory left after the job")
        resumed = Dlrun(self, [*flags, PYTHON, JOB, after, str(STEPS)], env=clean_env())
        result = resumed.wait(TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(self.loaded(after, 0), [{"step": 5, "equal": True}] * WORLD, result)
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(after, f"done_{rank}")), rank)
            # The newest step both ranks hold stays in the directory, the older ones go.
            self.assertEqual(
                sorted(os.listdir(os.path.join(directory, f"rank-{rank}"))),
                [f"step-{STEPS - 1}"],
                result,
            )

    def test_steps_written_while_the_job_runs_outlive_a_killed_dlrun(self):
        # --checkpoint-write-every: the agent writes the steps the ranks name while they run, the
        # same step for both. dlrun SIGKILLed (nothing written as it ends): a new launch loads
        # the newest step both ranks have in the directory, bit-equal.
        directory, out, after = temp_dir(self), temp_dir(self), temp_dir(self)
        flags = ["--standalone", f"--nproc-per-node={WORLD}", f"--checkpoint-dir={directory}"]
        launch = Dlrun(
            self,
            [*flags, "--checkpoint-write-every=0.001", PYTHON, JOB, out, str(STEPS), "hold"],
            env=clean_env(),
        )
        wait_until(
            lambda: (
                all(os.path.exists(os.path.join(out, f"held_{r}")) for r in range(WORLD))
                and written(directory)
            ),
            TIMEOUT_S,
            "both ranks' steps saved and one written",
            proc=launch.proc,
            on_timeout=launch.describe,
        )
        launch.signal(signal.SIGKILL)
        # Killed by the test, so the step was written while the job ran, not as dlrun ended.
        self.assertEqual(launch.proc.wait(), -signal.SIGKILL)
        open(os.path.join(out, "release"), "w").close()  # the orphaned workers end
        step = max(written(directory))
        resumed = Dlrun(self, [*flags, PYTHON, JOB, after, str(STEPS)], env=clean_env())
        result = resumed.wait(TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(self.loaded(after, 0), [{"step": step, "equal": True}] * WORLD, result)

    def test_a_rank_renumbered_in_process_saves_and_loads_in_its_new_world(self):
        # As the survivors of a lost node without a spare: rank 1 goes on as rank 0 of 1 after
        # step 3 (rank 0 ends). Its saves count in the world of 1 (none waits for rank 0), and
        # its load finds its own last step.
        out, result = self.job("alone:1:3")
        self.assertEqual(
            read_json(os.path.join(out, "alone.json")), {"step": STEPS - 1, "equal": True}, result
        )

    def test_a_checkpoint_dir_that_cannot_be_made_is_one_line(self):
        blocker = os.path.join(temp_dir(self), "file")
        open(blocker, "w").close()
        launch = Dlrun(
            self,
            ["--standalone", f"--checkpoint-dir={blocker}/dir", PYTHON, "-c", "pass"],
            env=clean_env(),
        )
        result = launch.wait(TIMEOUT_S)
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(
            result.stderr.strip().splitlines()[-1],
            f"dlrun: error: --checkpoint-dir: cannot make {blocker}/dir: Not a directory",
            result,
        )

    def test_a_replacement_joining_its_survivors_loads_nothing(self):
        # Under --recovery=in-process its state comes from the survivors, who do not load again:
        # load() meets nobody (no store is reached: none is named here) and returns None.
        env = package_env(DLRUN_CHECKPOINT_SHM=temp_dir(self), DLRUN_RECOVERY_JOIN="1")
        done = subprocess.run(
            [PYTHON, "-c", "import dlrun.checkpoint as c; print(c.load())"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        self.assertEqual((done.returncode, done.stdout), (0, "None\n"), done.stderr)

    def test_outside_dlrun_save_and_load_are_files(self):
        code = (
            "import sys, torch, dlrun.checkpoint as c\n"
            "c.save({'w': torch.arange(4)}, 3)\n"
            "c.save({'w': torch.arange(5)}, 4)\n"
            "step, state = c.load()\n"
            "print(step, state['w'].tolist())\n"
        )
        directory = temp_dir(self)
        env = package_env(DLRUN_CHECKPOINT_DIR=directory)
        done = subprocess.run(
            [PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        self.assertEqual(done.stdout, "4 [0, 1, 2, 3, 4]\n", done.stderr)
        self.assertEqual(sorted(os.listdir(directory)), ["step-3-rank-0.pt", "step-4-rank-0.pt"])
        del env["DLRUN_CHECKPOINT_DIR"]
        done = subprocess.run(
            [PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        self.assertNotEqual(done.returncode, 0)
        self.assertEqual(
            done.stderr.strip().splitlines()[-1],
            "dlrun.checkpoint.CheckpointError: dlrun.checkpoint: outside dlrun, "
            "give a directory (directory= or DLRUN_CHECKPOINT_DIR) to save and "
            "load checkpoints in",
        )


if __name__ == "__main__":
    main()
