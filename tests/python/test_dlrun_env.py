"""The environment dlrun gives every worker (ARCHITECTURE.md section 2), and where --nproc-per-node
comes from: the flag with dashes or underscores, or PET_NPROC_PER_NODE, the flag winning."""

import json
import os
import re
import signal
import sys
import unittest

from dlrun_fixture import (
    PYTHON,
    RUN_TIMEOUT_S,
    WORKERS,
    clean_env,
    main,
    read_json,
    run_dlrun,
    temp_dir,
    worker,
)

sys.path.insert(0, WORKERS)
from worker_util import lacks_libuv  # noqa: E402

ENV_DUMP = worker("env_dump.py")
LOCAL_RANK_WORKER = worker("local_rank_worker.py")
EVERY_VARIABLE = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_ASYNC_ERROR_HANDLING",
    "TF_CONFIG",
)
OMP_NOTICE = "OMP_NUM_THREADS"
STORE_TIMEOUT_S = 90


class DlrunEnvTest(unittest.TestCase):
    def dump(self, args, env=None, store=False):
        """Runs env_dump.py under dlrun; returns (result, {rank: record}) for every file."""
        out = temp_dir(self)
        extra = ["--store"] if store else []
        # With the store, every worker imports torch: some seconds each on 2 loaded cores.
        result = run_dlrun(
            self,
            [*args, PYTHON, ENV_DUMP, out, *extra],
            env=env,
            timeout=STORE_TIMEOUT_S if store else RUN_TIMEOUT_S,
        )
        self.assertEqual(result.returncode, 0, result)
        records = {}
        for name in os.listdir(out):
            self.assertRegex(name, r"^env_\d+\.json$")
            records[int(name[4:-5])] = read_json(os.path.join(out, name))
        return result, records

    def test_local_rank_argument(self):
        # torch.distributed.launch's scripts run unmodified: --local-rank=N (PyTorch 2.0's
        # spelling), or --local_rank=N for the scripts written before.
        for flags, style, local in (
            (["--use-local-rank-arg"], "dash", (0, 1)),
            (["--no-use-env"], "dash", (0, 1)),
            (["--use_local_rank_arg", "--local-rank-arg-style=underscore"], "underscore", (0, 1)),
            # Each worker's only device is its device 0.
            (["--use-local-rank-arg", "--virtual-local-rank"], "dash", (0, 0)),
        ):
            with self.subTest(flags=flags):
                out = temp_dir(self)
                result = run_dlrun(
                    self, ["--nproc-per-node=2", *flags, PYTHON, LOCAL_RANK_WORKER, out, style]
                )
                self.assertEqual(result.returncode, 0, result)
                records = [
                    read_json(os.path.join(out, f"local_rank_{rank}.json")) for rank in (0, 1)
                ]
                self.assertEqual(records, [{"arg": n, "env": n} for n in local])
        # Without the flag, the script gets no argument it does not know (argparse refuses one).
        result = run_dlrun(
            self, ["--nproc-per-node=1", PYTHON, LOCAL_RANK_WORKER, temp_dir(self), "dash"]
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertIn("--local-rank", result.stderr)

    def test_every_variable_for_four_workers(self):
        result, records = self.dump(["--nproc-per-node=4", "--max-restarts=2"], store=True)
        self.assertEqual(sorted(records), [0, 1, 2, 3], result)
        envs = {rank: rec["env"] for rank, rec in records.items()}
        for rank, env in envs.items():
            with self.subTest(rank=rank):
                missing = [v for v in EVERY_VARIABLE if v not in env]
                self.assertEqual(missing, [])
                self.assertEqual(env["RANK"], str(rank))
                self.assertEqual(env["LOCAL_RANK"], str(rank))
                self.assertEqual(env["WORLD_SIZE"], "4")
                self.assertEqual(env["LOCAL_WORLD_SIZE"], "4")
                self.assertEqual(env["GROUP_RANK"], "0")
                self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
                self.assertEqual(env["ROLE_NAME"], "default")
                self.assertEqual(env["ROLE_RANK"], str(rank))
                self.assertEqual(env["ROLE_WORLD_SIZE"], "4")
                self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
                self.assertTrue(0 < int(env["MASTER_PORT"]) < 65536)
                # A torch without libuv meets at a store its rank 0 serves (test_torch_libuv.py).
                self.assertEqual(
                    env["TORCHELASTIC_USE_AGENT_STORE"], "False" if lacks_libuv() else "True"
                )
                self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
                self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "2")
                self.assertNotEqual(env["TORCHELASTIC_RUN_ID"], "")
                self.assertTrue(os.path.isabs(env["TORCHELASTIC_ERROR_FILE"]))
                self.assertTrue(
                    records[rank]["error_file_dir_writable"], env["TORCHELASTIC_ERROR_FILE"]
                )
                self.assertEqual(env["OMP_NUM_THREADS"], "1")
                self.assertEqual(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
                self.assertEqual(env["NCCL_ASYNC_ERROR_HANDLING"], "1")
        # Each worker leads its own process group and dies with dlrun.
        for rank, rec in records.items():
            self.assertEqual(rec["pgid"], rec["pid"], f"rank {rank}'s process group")
            self.assertEqual(rec["pdeathsig"], signal.SIGKILL, f"rank {rank}'s PDEATHSIG")
        # Shared by all ranks: one store, one run; distinct per rank: the error file.
        for name in ("MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            self.assertEqual(len({env[name] for env in envs.values()}), 1, name)
        self.assertEqual(len({env["TORCHELASTIC_ERROR_FILE"] for env in envs.values()}), 4)
        # The store at MASTER_ADDR:MASTER_PORT took a torch client from every rank.
        for rec in records.values():
            self.assertEqual(rec["store_values"], [f"rank {r} was here" for r in range(4)])
        # OMP_NUM_THREADS=1 is announced once on stderr.
        notices = [line for line in result.dlrun_lines() if OMP_NOTICE in line]
        self.assertEqual(len(notices), 1, result)

    def test_tf_config(self):
        _, records = self.dump(["--nproc-per-node=4"])
        self.assertEqual(sorted(records), [0, 1, 2, 3])
        configs = {rank: json.loads(rec["env"]["TF_CONFIG"]) for rank, rec in records.items()}
        workers = configs[0]["cluster"]["worker"]
        self.assertEqual(len(workers), 4, configs[0])
        ports = []
        for endpoint in workers:
            host, port = endpoint.rsplit(":", 1)
            self.assertEqual(host, "127.0.0.1", endpoint)
            ports.append(int(port))
        self.assertEqual(len(set(ports)), 4, workers)
        # The agent's store has a port of its own; rank 0's (a torch without libuv) is rank 0's.
        if lacks_libuv():
            self.assertEqual(int(records[0]["env"]["MASTER_PORT"]), ports[0])
        else:
            self.assertNotIn(int(records[0]["env"]["MASTER_PORT"]), ports)
        for rank, config in configs.items():
            with self.subTest(rank=rank):
                self.assertEqual(set(config), {"cluster", "task"})
                self.assertEqual(config["cluster"], {"worker": workers})
                self.assertEqual(config["task"], {"type": "worker", "index": rank})
                self.assertIsInstance(config["task"]["index"], int)
                # The port listed at index RANK is the one reserved for this worker: free to bind.
                self.assertIsNone(records[rank]["bind_error"])

    def test_newer_torchrun_flags(self):
        # --virtual-local-rank: LOCAL_RANK 0 and each worker's own device, its entry of the
        # inherited list; --start-method and --signals-to-handle as torchrun 2.x scripts pass them.
        _, records = self.dump(
            [
                "--nproc-per-node=2",
                "--virtual-local-rank",
                "--start-method=fork",
                "--signals-to-handle=SIGTERM,SIGUSR1",
            ],
            env=clean_env(CUDA_VISIBLE_DEVICES="5,7"),
        )
        self.assertEqual(sorted(records), [0, 1])
        for rank, device in ((0, "5"), (1, "7")):
            env = records[rank]["env"]
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["LOCAL_RANK"], "0")
            self.assertEqual(env["CUDA_VISIBLE_DEVICES"], device)
            self.assertEqual(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGUSR1")
        # Without the flags: the list is every worker's, and the signals are torchrun 2.x's
        # default four, named as torchrun names them.
        _, records = self.dump(["--nproc-per-node=2"], env=clean_env(CUDA_VISIBLE_DEVICES="5,7"))
        self.assertEqual({rec["env"]["CUDA_VISIBLE_DEVICES"] for rec in records.values()}, {"5,7"})
        self.assertEqual(
            {rec["env"]["TORCHELASTIC_SIGNALS_TO_HANDLE"] for rec in records.values()},
            {"SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
        )
        # The one-line refusal when the list is too short for the workers.
        result = run_dlrun(
            self,
            ["--nproc-per-node=3", "--virtual-local-rank", PYTHON, ENV_DUMP, temp_dir(self)],
            env=clean_env(CUDA_VISIBLE_DEVICES="5,7"),
        )
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.dlrun_lines()), 1, result)
        self.assertIn("--virtual-local-rank", result.stderr)

    def test_pet_nproc_per_node(self):
        _, records = self.dump([], env=clean_env(PET_NPROC_PER_NODE="3"))
        self.assertEqual(sorted(records), [0, 1, 2])
        self.assertEqual({rec["env"]["WORLD_SIZE"] for rec in records.values()}, {"3"})

    def test_flag_wins_over_pet_variable(self):
        _, records = self.dump(["--nproc-per-node", "2"], env=clean_env(PET_NPROC_PER_NODE="3"))
        self.assertEqual(sorted(records), [0, 1])
        self.assertEqual({rec["env"]["LOCAL_WORLD_SIZE"] for rec in records.values()}, {"2"})

    def test_underscored_flags(self):
        _, records = self.dump(["--nproc_per_node=2", "--max_restarts=1", "--role", "trainer"])
        self.assertEqual(sorted(records), [0, 1])
        for rank, rec in records.items():
            self.assertEqual(rec["env"]["WORLD_SIZE"], "2")
            self.assertEqual(rec["env"]["TORCHELASTIC_MAX_RESTARTS"], "1")
            self.assertEqual(rec["env"]["ROLE_NAME"], "trainer")
            self.assertEqual(rec["env"]["ROLE_RANK"], str(rank))

    def test_user_settings_are_kept(self):
        env = clean_env(
            OMP_NUM_THREADS="7",
            TORCH_NCCL_ASYNC_ERROR_HANDLING="0",
            NCCL_ASYNC_ERROR_HANDLING="2",
            PET_ROLE="fromenv",
        )
        result, records = self.dump(["--nproc-per-node=2"], env=env)
        self.assertEqual(sorted(records), [0, 1])
        for rec in records.values():
            self.assertEqual(rec["env"]["OMP_NUM_THREADS"], "7")
            self.assertEqual(rec["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0")
            self.assertEqual(rec["env"]["NCCL_ASYNC_ERROR_HANDLING"], "2")
            self.assertEqual(rec["env"]["ROLE_NAME"], "fromenv")
        self.assertEqual([line for line in result.dlrun_lines() if OMP_NOTICE in line], [], result)

    def test_nproc_per_node_cpu_and_auto(self):
        cpus = len(os.sched_getaffinity(0))
        gpus = len([n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)])
        for value, expected in (("cpu", cpus), ("auto", gpus or cpus)):
            with self.subTest(value=value):
                _, records = self.dump([f"--nproc-per-node={value}"])
                self.assertEqual(sorted(records), list(range(expected)))

    def test_one_worker_gets_no_omp_default(self):
        _, records = self.dump(["--nproc-per-node=1"])
        self.assertEqual(sorted(records), [0])
        self.assertNotIn("OMP_NUM_THREADS", records[0]["env"])


if __name__ == "__main__":
    main()
