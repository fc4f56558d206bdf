"""A torch built without libuv under dlrun (issue 61). torch 2.4 and later ask for libuv in every
worker's client of an agent's store, which such a build (Debian 13's python3-torch 2.6) refuses;
dlrun finds that out before the workers start and has rank 0's torch serve their store.

- The interpreter's own torch (ctest runs this file under Debian's and under torch 2.13's): a DDP
  job trains with no variable set; whether dlrun switched is checked against torch itself (a
  client asked for libuv refuses or not); a user's USE_LIBUV=0 is kept and the job trains; a
  failed first attempt is followed by one on a new store. On Debian 13 this is torch 2.6
  without libuv, on Debian 12 torch 1.13, under the tests' environment torch 2.13 with libuv.
- Torch trees made here (the probe reads files only): one whose library lacks libuv gets rank
  0's endpoint, TORCHELASTIC_USE_AGENT_STORE=False and USE_LIBUV=0, with a user's USE_LIBUV
  kept and said; one with libuv, and torch 1.x, leave every worker at the agent's store;
  --worker-store=agent and rank0 override the choice.
"""

import json
import os
import socket
import sys
import unittest

from dlrun_fixture import PYTHON, clean_env, main, read_json, run_dlrun, temp_dir, worker

DDP_TRAIN = worker("ddp_train.py")
ENV_DUMP = worker("env_dump.py")
WORLD = 2
TIMEOUT_S = 90
SAID = "was built without libuv, which its clients ask for at dlrun's store"
NO_LIBUV = b"LibUV TCPStore implementation missing"


def refuses_agent_store():
    """torch's own answer: does a client asked for libuv (as torch 2.4+'s agent-store client is)
    refuse to be made? torch 1.x has no such choice."""
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as s:  # a port where nothing listens: only the refusal matters
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        dist.TCPStore(
            "127.0.0.1", port, is_master=False, use_libuv=True, timeout=timedelta(milliseconds=100)
        )
    except TypeError:
        return False  # no use_libuv: torch 1.x
    except Exception as e:
        return "without libuv support" in str(e)
    return False


class OwnTorch(unittest.TestCase):
    """The torch this interpreter imports, for real."""

    @classmethod
    def setUpClass(cls):
        cls.refuses = refuses_agent_store()
        print(
            f"test_torch_libuv: {PYTHON}: torch refuses an agent's store: {cls.refuses}",
            file=sys.stderr,
        )

    def train(self, *extra, env=None, max_restarts=0):
        out = temp_dir(self)
        result = run_dlrun(
            self,
            [
                "--standalone",
                f"--nproc-per-node={WORLD}",
                f"--max-restarts={max_restarts}",
                PYTHON,
                DDP_TRAIN,
                out,
                str(WORLD),
                *extra,
            ],
            env=env or clean_env(),
            timeout=TIMEOUT_S,
        )
        self.assertEqual(result.returncode, 0, result)
        records = [read_json(os.path.join(out, f"ok_{r}.json")) for r in range(WORLD)]
        self.assertEqual(len({r["checksum"] for r in records}), 1, records)
        self.assertEqual(
            {r["agent_store"] for r in records}, {"False" if self.refuses else "True"}, result
        )
        return out, records, result

    def test_ddp_trains_with_nothing_set(self):
        _, _, result = self.train()
        self.assertEqual(result.stderr.count(SAID), 1 if self.refuses else 0, result)
        if self.refuses:
            self.assertIn("USE_LIBUV=0)", result.stderr)

    def test_a_users_use_libuv_is_kept(self):
        _, _, result = self.train(env=clean_env(USE_LIBUV="0"))
        if self.refuses:
            self.assertIn("USE_LIBUV=0 as set", result.stderr)

    def test_a_failed_attempt_is_followed_by_one_on_a_new_store(self):
        out, records, result = self.train("--fail-first-attempt", max_restarts=1)
        failed = [n for n in os.listdir(out) if n.startswith("failed_")]
        self.assertEqual(len(failed), 1, result)
        self.assertNotEqual(failed[0][len("failed_") :], records[0]["master_port"])


class MadeTorch(unittest.TestCase):
    """Torch trees the probe reads; the workers (env_dump.py) never import torch."""

    def run_with(self, version, library, env_extra=None, flags=()):
        site = temp_dir(self)
        torch = os.path.join(site, "torch")
        os.makedirs(os.path.join(torch, "lib"))
        with open(os.path.join(torch, "__init__.py"), "w") as f:
            f.write("raise ImportError('no worker here imports torch')\n")
        with open(os.path.join(torch, "version.py"), "w") as f:
            f.write(f"__version__ = '{version}'\n")
        with open(os.path.join(torch, "lib", "libtorch_cpu.so"), "wb") as f:
            f.write(b"\x7fELF" + b"\0" * 8192 + library + b"\0" * 8192)
        out = temp_dir(self)
        result = run_dlrun(
            self,
            ["--standalone", f"--nproc-per-node={WORLD}", *flags, PYTHON, ENV_DUMP, out],
            env=clean_env(PYTHONPATH=site, **(env_extra or {})),
            timeout=TIMEOUT_S,
        )
        self.assertEqual(result.returncode, 0, result)
        envs = [read_json(os.path.join(out, f"env_{r}.json"))["env"] for r in range(WORLD)]
        return torch, envs, result

    def test_without_libuv_rank_zero_serves_the_store(self):
        torch, envs, result = self.run_with("2.6.0", NO_LIBUV)
        lines = [line for line in result.stderr.splitlines() if SAID in line]
        self.assertEqual(len(lines), 1, result)
        self.assertIn(f"torch 2.6.0 in {torch} {SAID}", lines[0])
        rank0 = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"][0]
        for env in envs:
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "False")
            self.assertEqual(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", rank0)
            self.assertEqual(env["USE_LIBUV"], "0")

    def test_a_users_use_libuv_is_kept_and_said(self):
        _, envs, result = self.run_with("2.6.0", NO_LIBUV, {"USE_LIBUV": "1"})
        self.assertIn("USE_LIBUV=1 as set", result.stderr)
        self.assertEqual({env["USE_LIBUV"] for env in envs}, {"1"})

    def test_worker_store_overrides_what_the_torch_asks(self):
        # agent: dlrun's store even for a torch without libuv (a Python that execs a program
        # of dlrun's store); rank0: rank 0's torch's store even for one with libuv.
        _, envs, result = self.run_with("2.6.0", NO_LIBUV, flags=["--worker-store=agent"])
        self.assertNotIn(SAID, result.stderr)
        self.assertEqual({env["TORCHELASTIC_USE_AGENT_STORE"] for env in envs}, {"True"})
        _, envs, result = self.run_with("2.13.0", b"uv_loop_init", flags=["--worker-store=rank0"])
        self.assertIn(
            "--worker-store=rank0: rank 0's torch serves the workers' store", result.stderr
        )
        rank0 = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"][0]
        for env in envs:
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "False")
            self.assertEqual(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", rank0)

    def test_with_libuv_or_before_2_4_nothing_changes(self):
        for version, library in (("2.13.0", b"uv_loop_init"), ("1.13.1", NO_LIBUV)):
            with self.subTest(version=version):
                _, envs, result = self.run_with(version, library)
                self.assertNotIn(SAID, result.stderr)
                for env in envs:
                    self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")
                    self.assertNotIn("USE_LIBUV", env)


if __name__ == "__main__":
    main()
