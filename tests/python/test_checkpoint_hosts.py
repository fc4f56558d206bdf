"""In-memory checkpoints (issue 56) across a host loss: two simulated hosts (network namespaces;
needs root) of 2 workers each, through a dlrund, and a third agent waiting as a spare. The host
of rank 2 is killed whole (agent and workers) once step 5 is complete everywhere: the spare
takes its place, the whole group restarts, and every rank loads the same step, bit-equal to what
was saved. The job then saves to its last step, and the two agents left exit 0.
- From the peer: each agent keeps the copies of the other host's ranks in its memory, and a step
  counts once its copies are there; the host is killed as soon as step 5 is complete, and no
  step is lost: the lost host's ranks load step 5 from the survivor's agent (whichever ranks the
  spare and the survivor get). With that copy
  of rank 2's changed first, it is refused, never loaded.
- From a --checkpoint-dir that every host sees (the machine's file system), a step written
  there at almost every save (--checkpoint-write-every): the survivors load from their memory or
  the directory, the lost host's ranks from the directory.

Runs under torch 2.13's interpreter (ctest: python_checkpoint_hosts) and as root.
"""

import glob
import os
import unittest

from dlrun_fixture import PYTHON, binary_from_env, clean_env, read_json, temp_dir, wait_until
from launcher_fixture import Launcher, dlrund_in
from netns_fixture import Hosts, main
from test_checkpoint import JOB, STEPS, TIMEOUT_S, written
from test_inprocess_recovery_hosts import RDZV_PORT, Output

WORLD = 4
LOST_RANK = 2
AT_STEP = 5


def held_by_a_peer(rank, step):
    """Whether an agent holds a copy of `step` of `rank` that another host's agent sent it (the
    hosts share the machine's /dev/shm)."""
    return bool(glob.glob(f"/dev/shm/dlrun-checkpoints.*/peer/rank-{rank}/step-{step}/step"))


def corrupt_peer_copy(rank, step):
    """A byte of the copy of `step` of `rank` that another host's agent holds, changed."""
    [path] = glob.glob(f"/dev/shm/dlrun-checkpoints.*/peer/rank-{rank}/step-{step}/tensors")
    with open(path, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))


class CheckpointsAcrossAHostLossTest(unittest.TestCase):
    def test_a_lost_hosts_ranks_load_their_newest_step_from_the_peers_copy(self):
        out, logs = temp_dir(self), temp_dir(self)
        # Killed as soon as step 5 is complete: a step counts once its copy is on the peer.
        codes, agents, lost, _ = self.lose_a_host(out, logs, [])
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost], [0, 0], result)
        loaded = [read_json(os.path.join(out, f"loaded_{r}_1.json")) for r in range(WORLD)]
        self.assertEqual([x["step"] for x in loaded], [AT_STEP] * WORLD, loaded)  # none lost
        self.assertTrue(all(x["equal"] for x in loaded), loaded)
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), (rank, result))

    def test_a_peers_copy_found_corrupt_is_refused(self):
        # Rank 2's step 5, as the survivor's agent holds it, changed before the host is lost:
        # the rank that loads it finds it does not match its checksum, and no rank loads 5. No
        # other step is common (the survivors went on to save 6 and dropped 4): the job starts
        # again from its first step, and runs to its end.
        out, logs = temp_dir(self), temp_dir(self)
        lost_ranks = (LOST_RANK, LOST_RANK + 1)
        codes, agents, lost, _ = self.lose_a_host(
            out,
            logs,
            [],
            ready=lambda: all(held_by_a_peer(rank, AT_STEP) for rank in lost_ranks),
            at_kill=lambda: corrupt_peer_copy(LOST_RANK, AT_STEP),
        )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost], [0, 0], result)
        loaded = [read_json(os.path.join(out, f"loaded_{r}_1.json")) for r in range(WORLD)]
        self.assertEqual([x["step"] for x in loaded], [None] * WORLD, (loaded, result))
        self.assertIn(f"step {AT_STEP}'s copy does not match its checksum; not loaded", str(result))
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), (rank, result))

    def lose_a_host(self, out, logs, flags, ready=lambda: True, at_kill=lambda: None):
        """Runs the job, kills the host of LOST_RANK once it stopped itself and `ready()`, and
        returns the agents' exit codes (hosts 1 to 3), the agents, the host lost and what
        `at_kill()` said just before the kill."""
        env = clean_env(PYTHON_EXEC=PYTHON, TMPDIR=logs, GLOO_SOCKET_IFNAME="eth0")
        with Hosts(4) as hosts:
            dlrund_in(self, hosts, env, logs)
            flags = [
                "--nnodes=2",
                "--nproc-per-node=2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={hosts.address(0)}:{RDZV_PORT}",
                "--rdzv-id=ckpt",
                "--max-restarts=1",
                *flags,
            ]
            agents = [
                Launcher(
                    self,
                    f"dlrun{host}",
                    [
                        binary_from_env("DLRUN", "dlrun"),
                        *flags,
                        PYTHON,
                        JOB,
                        out,
                        str(STEPS),
                        f"host:{LOST_RANK}:{AT_STEP}",
                    ],
                    env,
                    logs,
                    hosts=hosts,
                    host=host,
                )
                for host in (1, 2, 3)
            ]
            wait_until(
                lambda: os.path.exists(os.path.join(out, f"lose_host_{LOST_RANK}")) and ready(),
                TIMEOUT_S,
                f"rank {LOST_RANK} to stop itself",
                on_timeout=lambda: Output(agents),
            )
            said = at_kill()
            pid = read_json(os.path.join(out, f"pid_{LOST_RANK}"))
            lost = next(h for h in (1, 2, 3) if pid in hosts.pids(h))
            hosts.kill_host(lost)
            return [agent.wait(TIMEOUT_S) for agent in agents], agents, lost, said

    def test_a_lost_hosts_ranks_load_the_step_every_rank_loads_from_the_directory(self):
        out, directory, logs = temp_dir(self), temp_dir(self), temp_dir(self)
        codes, agents, lost, before = self.lose_a_host(
            out,
            logs,
            [f"--checkpoint-dir={directory}", "--checkpoint-write-every=0.001"],
            at_kill=lambda: written(directory, WORLD),
        )
        result = Output(agents)
        self.assertEqual([c for h, c in zip((1, 2, 3), codes) if h != lost], [0, 0], result)
        self.assertTrue(before, f"no step written before the host was lost\n{result}")
        loaded = [read_json(os.path.join(out, f"loaded_{r}_1.json")) for r in range(WORLD)]
        self.assertEqual(len({x["step"] for x in loaded}), 1, loaded)
        self.assertTrue(all(x["equal"] for x in loaded), loaded)
        self.assertGreaterEqual(loaded[0]["step"], max(before), loaded)  # the newest written
        self.assertLessEqual(loaded[0]["step"], AT_STEP, loaded)
        for rank in range(WORLD):
            self.assertTrue(os.path.exists(os.path.join(out, f"done_{rank}")), (rank, result))
        self.assertEqual(glob.glob(os.path.join(directory, "rank-*", ".step-*")), [])


if __name__ == "__main__":
    main()
