"""A torch job comes back after a worker is killed, on one node, in both eras (ctest runs this file
under torch 1.13's and torch 2.13's interpreters; the workers run under the test's).

- Standalone: `dlrun --standalone --max-restarts=3` runs a checkpointed DDP job over gloo
  (workers/recovery_train.py); a worker is SIGKILLed mid-training in attempts 0, 1 and 2. The job
  exits 0 and took every step once (recovery_fixture.RecoveryCase.assert_recovered). torch 2.x
  workers share one TCPStore across attempts (TORCHELASTIC_USE_AGENT_STORE) and, unlike 1.13,
  do not prefix their keys by attempt: a restarted attempt that read the dead one's keys would
  dial its gloo addresses and fail.
- Key isolation and a flat store: 21 attempts (--max-restarts=20, each attempt but the last
  exiting 1) of workers/store_isolation.py, torch's own TCPStore client on the MASTER_ADDR and
  MASTER_PORT of its attempt. No attempt reads a key an earlier attempt wrote, num_keys() is the
  same in every attempt, and so is the key count of the store dlrun serves (its /api/state,
  --metrics-port; the control plane off, whose event log is kept as keys): an attempt's keys go
  when the next attempt opens.
"""

from dlrun_fixture import PYTHON, free_port, main, temp_dir, worker
from recovery_fixture import MAX_RESTARTS, RecoveryCase, dlrun_argv, train_argv

STORE_ISOLATION = worker("store_isolation.py")
NPROC = 2
RESTARTS = 20  # key isolation: 21 attempts
ISOLATION_TIMEOUT_S = 200  # 21 starts of 2 torch workers on 2 loaded cores


class StandaloneRecoveryTest(RecoveryCase):
    def test_three_killed_workers_the_job_comes_back_and_takes_every_step_once(self):
        out = self.out_dir()
        agent = self.launch(
            "dlrun",
            dlrun_argv(
                "--standalone",
                f"--nproc-per-node={NPROC}",
                f"--max-restarts={MAX_RESTARTS}",
                *train_argv(out, victim=NPROC - 1),
            ),
            self.env(),
        )
        self.run_killed_job([agent], out)
        done = self.assert_recovered(out, NPROC)
        self.assertEqual({d["master"].rsplit(":", 1)[0] for d in done}, {"127.0.0.1"})


class KeyIsolationTest(RecoveryCase):
    def test_no_attempt_sees_an_earlier_attempts_keys_and_the_store_stays_flat(self):
        out = temp_dir(self)
        port = free_port()
        agent = self.launch(
            "dlrun",
            dlrun_argv(
                "--standalone",
                f"--nproc-per-node={NPROC}",
                f"--max-restarts={RESTARTS}",
                # The control plane keeps the job's events in the store (ctl/ev/N, a log that grows
                # by design, a few keys a round): without it the store holds what the spaces hold.
                "--no-control-plane",
                f"--metrics-port={port}",
                PYTHON,
                STORE_ISOLATION,
                out,
                str(RESTARTS),
                f"http://127.0.0.1:{port}/api/state",
            ),
            self.env(),
        )
        code = agent.wait(ISOLATION_TIMEOUT_S)
        records = self.isolation_records(out, RESTARTS, NPROC, code)
        counts = [rs[0]["num_keys"] for rs in records.values()]
        self.assertEqual(set(counts), {counts[0]}, f"num_keys by attempt: {counts}")
        self.assertLessEqual(counts[0], 2 * NPROC + 2, counts)  # this attempt's keys, no more
        # Each attempt's opening freed the last one's keys: the store as a whole holds as many
        # keys in every attempt.
        server = [rs[0]["server_keys"] for rs in records.values()]
        print(f"num_keys by attempt: {counts}; the store's keys: {server}")
        self.assertEqual(set(server), {server[0]}, f"the store's keys by attempt: {server}")


if __name__ == "__main__":
    main()
