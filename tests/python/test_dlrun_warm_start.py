"""--warm-start (docs/guides/warm-start.md): workers forked from a Python zygote cannot be told from
workers started fresh, and what cannot be warm-started is refused in one line.

- The same probe (workers/warm_probe.py), as a script and with -m, run fresh and warm, sees the
  same environment (os.environ and the C library's), sys.argv, sys.orig_argv, __main__,
  sys.path, cwd, stdio, signal dispositions and mask, /proc/self/cmdline and its own process
  group, with the agent as its parent and SIGKILL as its parent-death signal.
- Exit codes, death by a signal and an uncaught exception are reported alike.
- The log tree of --log-dir with --tee and --redirects holds the same files and lines.
- A torch gloo job whose rank hangs gets its stacks (with the Python frames) from a warm
  worker; a DDP job whose rank is SIGKILLed restarts through the zygote and exits 0.
- A zygote killed mid-job is said in one line and the restart starts fresh workers.
- A zygote left without a request for a second forks a standby worker, up to one for each of
  the node's workers: the next starts are those processes, which see what the others saw; a
  standby ends with a SIGKILLed agent.
- Refusals: --no-python, train, a binary, -c, --preload alone or malformed (at parse time);
  a preload that cannot be imported, starts a thread or initialises CUDA (at start).
"""

import glob
import json
import os
import re
import signal
import unittest

from dlrun_fixture import (
    PYTHON,
    WORKERS,
    Dlrun,
    clean_env,
    is_running,
    main,
    read_json,
    run_dlrun,
    temp_dir,
    wait_until,
    worker,
)

PROBE = worker("warm_probe.py")
TORCH_TIMEOUT_S = 120  # a torch job's start and restart on 2 shared cores
HANG_EXIT_CODE = 124


def zygote_forks(agent, zygote):
    """The agent's children that run the zygote's program other than the zygote: a standby."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        pid = int(stat.split("/")[2])
        try:
            with open(stat, "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        if ppid == agent and pid != zygote and b"dlrun_warm_start" in cmdline:
            found.append(pid)
    return found


def probes(out, attempt=0):
    return {
        int(re.search(r"_(\d+)\.json$", p).group(1)): read_json(p)
        for p in glob.glob(os.path.join(out, f"probe_{attempt}_*.json"))
    }


class Launch:
    """One run's launch-specific values, replaced by placeholders so two runs compare."""

    def __init__(self, record, out):
        env = record["env"]
        self.values = {
            out: "<out>",
            env["TMPDIR"]: "<tmp>",
            env["TORCHELASTIC_RUN_ID"]: "<run>",
            env["MASTER_PORT"]: "<port>",
        }
        self.values.update(
            {
                ep: "<endpoint>"
                for ep in json.loads(env.get("TF_CONFIG", "{}"))
                .get("cluster", {})
                .get("worker", [])
            }
        )

    def normalise(self, value):
        if isinstance(value, dict):
            return {k: self.normalise(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.normalise(v) for v in value]
        if isinstance(value, str):
            for old, new in self.values.items():
                value = value.replace(old, new)
            value = re.sub(r"/dlrun-[A-Za-z0-9]{6}/", "/dlrun-<random>/", value)
            # The agent's checkpoint memory is named by its PID and a random tail.
            value = re.sub(
                r"/dlrun-checkpoints\.\d+\.\d+\.[A-Za-z0-9]{6}$",
                "/dlrun-checkpoints.<agent>",
                value,
            )
            # The run's log folder (the progress board's, DLRUN_PROGRESS_FILE) ends at random.
            value = re.sub(r"<run>_[^/]+/", "<run>_<random>/", value)
        return value


class WarmStartTest(unittest.TestCase):
    def launch(self, args, warm, env=None, cwd=None, timeout=60):
        flags = ["--warm-start"] if warm else []
        return run_dlrun(self, ["--standalone", *flags, *args], env=env, cwd=cwd, timeout=timeout)

    def check_same_view(self, fresh, warm):
        (fresh, fresh_pid, fresh_out), (warm, warm_pid, warm_out) = fresh, warm
        self.assertEqual(sorted(fresh), sorted(warm))
        for rank in fresh:
            f, w = fresh[rank], warm[rank]
            for record, pid in ((f, fresh_pid), (w, warm_pid)):
                self.assertEqual(record["pgid"], record["pid"])  # leads its process group
                self.assertEqual(record["ppid"], pid)  # the agent's child
                self.assertEqual(record["pdeathsig"], signal.SIGKILL)
            self.assertNotIn("dlrun_warm_start", " ".join(w["cmdline"]))
            normal_f = Launch(f, fresh_out).normalise(
                {k: v for k, v in f.items() if k not in ("pid", "ppid", "pgid")}
            )
            normal_w = Launch(w, warm_out).normalise(
                {k: v for k, v in w.items() if k not in ("pid", "ppid", "pgid")}
            )
            for key in normal_f:
                self.assertEqual(normal_f[key], normal_w[key], f"rank {rank}: {key}")

    def run_both(self, command, cwd, env=None, nproc=2):
        views = []
        for warm in (False, True):
            out = os.path.join(temp_dir(self), "out")
            os.mkdir(out)
            dlrun = Dlrun(
                self,
                [
                    "--standalone",
                    f"--nproc-per-node={nproc}",
                    *(["--warm-start"] if warm else []),
                    *command(out),
                ],
                env=env,
                cwd=cwd,
            )
            result = dlrun.wait(60)
            self.assertEqual(result.returncode, 0, result)
            self.assertEqual("dlrun: warm start: Python" in result.stderr, warm, result)
            views.append((probes(out), dlrun.pid, out))
        return views

    def test_a_forked_script_sees_what_a_fresh_one_sees(self):
        cwd = temp_dir(self)
        fresh, warm = self.run_both(
            lambda out: [PYTHON, "-u", PROBE, out], cwd, env=clean_env(PYTHONPATH=f"{cwd}:relative")
        )
        self.check_same_view(fresh, warm)
        warm = warm[0]
        self.assertEqual(warm[0]["path"][0], WORKERS)
        self.assertEqual(warm[0]["path"][1:3], [cwd, os.path.join(cwd, "relative")])
        self.assertEqual(warm[0]["main"]["__file__"], PROBE)
        self.assertTrue(warm[0]["stdio"][1]["write_through"])  # python -u

    def test_a_forked_module_sees_what_a_fresh_one_sees(self):
        cwd = temp_dir(self)
        fresh, warm = self.run_both(
            lambda out: [PYTHON, "-m", "warm_probe", out],
            cwd,
            env=clean_env(PYTHONPATH=WORKERS, PYTHONUNBUFFERED=None),
            nproc=1,
        )
        self.check_same_view(fresh, warm)
        warm = warm[0]
        self.assertEqual(warm[0]["main"]["__spec__"], ["warm_probe", PROBE])
        self.assertEqual(warm[0]["path"][0], cwd)
        self.assertFalse(warm[0]["stdio"][1]["write_through"])  # no -u

    def test_exit_codes_signals_and_exceptions_are_reported_alike(self):
        for action in (["exit", "3"], ["kill", "SIGKILL"], ["raise"]):
            results = []
            for warm in (False, True):
                out = temp_dir(self)
                results.append(self.launch([PYTHON, PROBE, out, *action], warm))
            fresh, warm = results
            self.assertEqual(fresh.returncode, warm.returncode, (action, fresh, warm))
            lines = [
                [
                    line
                    for line in r.stderr.splitlines()
                    if not line.startswith(("dlrun: control plane", "dlrun: warm start"))
                ]
                for r in results
            ]
            self.assertEqual(lines[0], lines[1], (action, fresh, warm))
        self.assertIn("RuntimeError: probe raised", warm.stderr)
        self.assertEqual(warm.returncode, 1)

    def test_the_log_tree_is_the_same(self):
        trees = []
        for warm in (False, True):
            logs = os.path.join(temp_dir(self), "logs")
            result = self.launch(
                [
                    "--nproc-per-node=2",
                    f"--log-dir={logs}",
                    "--redirects=0:3,1:2",
                    "--tee=1:1",
                    PYTHON,
                    worker("output_worker.py"),
                ],
                warm,
            )
            self.assertEqual(result.returncode, 0, result)
            with open(glob.glob(os.path.join(logs, "*", "attempt_0", "0", "stdout.log"))[0]) as f:
                run_id = re.search(r"run id (\S+)", f.read()).group(1)
            tree = {}
            for path in glob.glob(os.path.join(logs, "*", "**"), recursive=True):
                if os.path.isfile(path):
                    relative = os.path.relpath(path, logs).split(os.sep, 1)[1]
                    with open(path) as f:
                        tree[relative] = f.read().replace(run_id, "<run>")
            console = sorted(
                line.replace(run_id, "<run>")
                for line in (result.stdout + result.stderr).splitlines()
                if not line.startswith("dlrun: ")
            )
            trees.append((tree, console))
        self.assertEqual(trees[0], trees[1])
        self.assertIn("attempt_0/0/stdout.log", trees[0][0])

    def test_a_hung_warm_worker_has_its_python_stacks_taken(self):
        logs = os.path.join(temp_dir(self), "logs")
        result = self.launch(
            [
                "--nproc-per-node=2",
                "--hang-timeout=2",
                "--hang-action=exit",
                "--preload=torch,torch.distributed",
                f"--log-dir={logs}",
                PYTHON,
                worker("hang_gloo_worker.py"),
                "1",
                "5",
            ],
            True,
            timeout=TORCH_TIMEOUT_S,
        )
        self.assertEqual(result.returncode, HANG_EXIT_CODE, result)
        self.assertRegex(
            result.stderr,
            r"suspect: rank 1 on this node, last step 5, silent "
            r"[0-9.]+ s, not in a collective\n    "
            r"stuck_before_all_reduce",
        )
        stacks = {}
        for path in glob.glob(os.path.join(logs, "*", "attempt_0", "stacks", "rank_*.txt")):
            with open(path) as f:
                stacks[int(re.search(r"rank_(\d+)\.txt$", path).group(1))] = f.read()
        self.assertEqual(sorted(stacks), [0, 1], result)
        self.assertIn("stuck_before_all_reduce", stacks[1])
        self.assertIn("all_reduce (distributed_c10d.py", stacks[0])

    def test_a_killed_ddp_rank_restarts_through_the_zygote(self):
        out = temp_dir(self)
        dlrun = Dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=2",
                "--max-restarts=1",
                "--warm-start",
                "--preload=torch,torch.distributed",
                PYTHON,
                PROBE,
                out,
                "ddp",
            ],
        )
        first = [os.path.join(out, f"ddp_0_{rank}.json") for rank in (0, 1)]
        wait_until(
            lambda: all(os.path.exists(p) for p in first),
            TORCH_TIMEOUT_S,
            "attempt 0's DDP step",
            proc=dlrun.proc,
            on_timeout=dlrun.describe,
        )
        victim = read_json(first[1])["pid"]
        dlrun.watch_workers([read_json(p)["pid"] for p in first])
        os.kill(victim, signal.SIGKILL)
        result = dlrun.wait(TORCH_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result)
        self.assertIn("rank 1 ended with signal SIGKILL", result.stderr)
        for attempt in (0, 1):
            for rank in (0, 1):
                record = read_json(os.path.join(out, f"ddp_{attempt}_{rank}.json"))
                self.assertIn("torch", record["preloaded"], record)  # forked
                self.assertTrue(record["replicas_agree"], record)
                self.assertEqual(record["world"], 2)

    def test_a_zygote_killed_mid_job_leaves_fresh_starts(self):
        out = temp_dir(self)
        dlrun = Dlrun(
            self,
            [
                "--standalone",
                "--max-restarts=1",
                "--warm-start",
                PYTHON,
                PROBE,
                out,
                "wait-fail",
                "3",
            ],
        )
        wait_until(lambda: probes(out), 30, "attempt 0", proc=dlrun.proc, on_timeout=dlrun.describe)
        dlrun.watch_workers([r["pid"] for r in probes(out).values()])
        self.assertEqual(probes(out)[0]["ppid"], dlrun.pid)
        zygote = int(re.search(r"warm start: Python \S+ \(pid (\d+)\)", dlrun.output()[1]).group(1))
        os.kill(zygote, signal.SIGKILL)
        wait_until(
            lambda: "workers start fresh from now on" in dlrun.output()[1],
            30,
            "the zygote's end",
            proc=dlrun.proc,
            on_timeout=dlrun.describe,
        )
        with open(os.path.join(out, "go"), "w"):
            pass
        result = dlrun.wait(30)
        self.assertEqual(result.returncode, 0, result)
        said = [line for line in result.dlrun_lines() if "workers start fresh" in line]
        self.assertEqual(len(said), 1, result)
        self.assertRegex(said[0], rf"the zygote \(pid {zygote}\) ended with signal SIGKILL")
        fresh = probes(out, 1)[0]
        self.assertEqual(fresh["ppid"], dlrun.pid)
        self.assertEqual(fresh["cmdline"], [PYTHON, PROBE, out, "wait-fail", "3"])

    def waiting_job_with_standbys(self, out, nproc=1):
        """A warm job whose workers wait for OUT/go (then exit 3, and their restarts 0), once
        its zygote has forked a standby for each: (dlrun, attempt 0's probes, the standbys'
        pids)."""
        dlrun = Dlrun(
            self,
            ["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=1", "--warm-start"]
            + [PYTHON, PROBE, out, "wait-fail", "3"],
        )
        wait_until(
            lambda: len(probes(out)) == nproc,
            30,
            "attempt 0",
            proc=dlrun.proc,
            on_timeout=dlrun.describe,
        )
        first = [record for _, record in sorted(probes(out).items())]
        dlrun.watch_workers([p["pid"] for p in first])
        zygote = int(re.search(r"warm start: Python \S+ \(pid (\d+)\)", dlrun.output()[1]).group(1))
        standbys = []

        def forked():
            standbys[:] = zygote_forks(dlrun.pid, zygote)
            return len(standbys) >= nproc

        wait_until(
            forked,
            30,
            "the zygote's standbys",
            proc=dlrun.proc,
            on_timeout=dlrun.describe,
        )
        self.assertEqual(len(standbys), nproc, standbys)
        dlrun.watch_workers(standbys)
        return dlrun, first, standbys

    def test_a_start_after_a_quiet_second_is_the_worker_forked_ahead(self):
        # A zygote without a request for a second forks a standby worker ahead of the next
        # start: the restart is that process, and it sees what a worker forked at the request
        # (attempt 0's) sees.
        out = temp_dir(self)
        dlrun, [first], [standby] = self.waiting_job_with_standbys(out)
        with open(os.path.join(out, "go"), "w"):
            pass
        result = dlrun.wait(30)
        self.assertEqual(result.returncode, 0, result)
        again = probes(out, 1)[0]
        self.assertEqual(again["pid"], standby)
        self.assertEqual(again["ppid"], dlrun.pid)
        self.assertEqual(again["pgid"], again["pid"])
        self.assertEqual(again["pdeathsig"], signal.SIGKILL)
        own = ("env", "child_env", "pid", "ppid", "pgid")  # the attempt's, the process's
        self.assertEqual(
            {k: v for k, v in again.items() if k not in own},
            {k: v for k, v in first.items() if k not in own},
        )
        for key in ("env", "child_env"):
            self.assertEqual(sorted(again[key]), sorted(first[key]), key)
        self.assertEqual(again["env"]["TORCHELASTIC_RESTART_COUNT"], "1")

    def test_a_restart_of_every_worker_takes_the_workers_forked_ahead(self):
        # A standby for each of the node's workers: a whole-group restart forks none (nor does
        # a lost node's recovery on a spare).
        out = temp_dir(self)
        dlrun, _, standbys = self.waiting_job_with_standbys(out, nproc=2)
        with open(os.path.join(out, "go"), "w"):
            pass
        result = dlrun.wait(30)
        self.assertEqual(result.returncode, 0, result)
        again = probes(out, 1)
        self.assertEqual(sorted(p["pid"] for p in again.values()), sorted(standbys))

    def test_a_standby_ends_with_its_agent(self):
        out = temp_dir(self)
        dlrun, [first], [standby] = self.waiting_job_with_standbys(out)
        dlrun.signal(signal.SIGKILL)
        dlrun.proc.wait()
        for pid, what in ((standby, "the standby"), (first["pid"], "the worker")):
            wait_until(lambda pid=pid: not is_running(pid), 10, f"{what}'s end")

    def refused_at_parse(self, args, needle):
        result = run_dlrun(self, ["--standalone", *args])
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result)
        self.assertIn(needle, result.stderr)

    def test_what_cannot_be_forked_is_refused_when_parsed(self):
        self.refused_at_parse(["--warm-start", "--no-python", PYTHON, PROBE], "--no-python")
        self.refused_at_parse(["--warm-start", "train"], "the bundled trainer")
        self.refused_at_parse(["--warm-start", "/bin/true"], "no Python interpreter")
        self.refused_at_parse(["--warm-start", PYTHON, "-c", "pass"], "python -c")
        self.refused_at_parse(["--preload=torch", PYTHON, PROBE], "--preload needs --warm-start")
        self.refused_at_parse(
            ["--warm-start", "--preload=torch,", PYTHON, PROBE],
            "--preload: '' is not a module name",
        )

    def refused_at_start(self, preload, needle, env=None):
        out = temp_dir(self)
        result = run_dlrun(
            self,
            ["--standalone", "--warm-start", f"--preload={preload}", PYTHON, PROBE, out],
            env=env,
        )
        self.assertEqual(result.returncode, 2, result)
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        self.assertEqual(len(errors), 1, result)
        self.assertTrue(errors[0].startswith("dlrun: error: warm start: "), result)
        self.assertIn(needle, errors[0])
        self.assertEqual(os.listdir(out), [])  # no worker ran

    def test_what_cannot_be_forked_is_refused_at_start(self):
        self.refused_at_start(
            "no_such_module_here",
            "cannot import no_such_module_here (--preload): ModuleNotFoundError",
        )
        fakes = temp_dir(self)
        with open(os.path.join(fakes, "ticking.py"), "w") as f:
            f.write(
                "import threading, time\n"
                "threading.Thread(target=time.sleep, args=(60,), daemon=True, "
                "name='ticker').start()\n"
            )
        os.mkdir(os.path.join(fakes, "torch"))
        with open(os.path.join(fakes, "torch", "__init__.py"), "w") as f:
            f.write("class cuda:\n    is_initialized = staticmethod(lambda: True)\n")
        env = clean_env(PYTHONPATH=fakes)
        self.refused_at_start("ticking", "started Python threads (ticker)", env)
        self.refused_at_start("torch", "CUDA was initialised while preloading", env)


if __name__ == "__main__":
    main()
