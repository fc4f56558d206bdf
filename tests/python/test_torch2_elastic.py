"""torch 2.13 for real (issue 29): torchrun 2.13's own agents rendezvous through dlrund, dlrun's
agents run torch 2.13 workers, and a worker sees the same launch under either launcher.

- torchrun 2.13 (`python -m torch.distributed.run`, c10d, `is_host=false`) on two simulated
  hosts meets through a dlrund on one of them and trains DDP over gloo to equal replicas.
- dlrun runs the same DDP job on one host and on two simulated hosts.
- torch 2.13's FileTimerClient, @record error files and torch's readers of the launcher's
  variables behave the same under dlrun as under torchrun 2.13.
- The environment diff: one worker (workers/torch_probe.py) under torchrun 2.13 and under dlrun
  with the same flags (standalone, and two nodes through dlrund); every variable is equal, equal
  after normalising what varies from run to run (NORMALISED), or one of the documented
  differences (DOCUMENTED): nothing else.

Runs under torch 2.13's interpreter (ctest: python_torch2_elastic) and as root (network
namespaces). Every process is stopped by PID, or with its simulated host; every wait has a
deadline.
"""

import os
import re
import signal
import time
import unittest

import torch

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    is_running,
    log_tails,
    read_json,
    temp_dir,
    wait_until,
    worker,
)
from launcher_fixture import RDZV_PORT, START_TIMEOUT_S, Launcher, dlrund_in
from netns_fixture import Hosts, main

TORCH_ERA = "2.13."
DDP_TRAIN = worker("ddp_train.py")
PROBE = worker("torch_probe.py")
FAIL_WORKER = worker("fail_worker.py")
TIMER_WORKER = worker("timer_worker.py")
NPROC = 2
TIMER_S = 1  # timer_worker.py's expires(after=1)
KILLED_WITHIN_S = 10  # the timer, the server's checks and a loaded machine
RECORD_MESSAGE = "the data loader ran dry"

# --- the environment diff --------------------------------------------------------------------
#
# `run` describes a launch: "tmp" (its TMPDIR), "endpoint" (--rdzv-endpoint HOST:PORT, None when
# standalone), "group0" ({launcher: the addresses of the host whose workers have GROUP_RANK 0}).


def _standalone_only(placeholder):
    return lambda value, run: placeholder if run["endpoint"] is None else value


def _under_tmp(placeholder):
    return lambda value, run: placeholder if value.startswith(run["tmp"] + os.sep) else value


# Values that legitimately differ from one launch to the next, and what each becomes before the
# comparison.
NORMALISED = {
    # Standalone, each launcher picks a free port for its store (two nodes: DOCUMENTED).
    "MASTER_PORT": _standalone_only("<port>"),
    # Standalone, a random id per launch (torchrun a UUID, dlrun its own); --rdzv-id otherwise.
    "TORCHELASTIC_RUN_ID": _standalone_only("<run id>"),
    # Each launcher's file in a fresh directory under TMPDIR, one per rank and attempt (checked
    # further in assert_error_files: one per rank, where @record writes).
    "TORCHELASTIC_ERROR_FILE": _under_tmp("<error file>"),
    # With TORCHELASTIC_ENABLE_FILE_TIMER=1: the FIFO of each launcher's timer server, a fresh
    # name under TMPDIR.
    "TORCHELASTIC_TIMER_FILE": _under_tmp("<timer fifo>"),
}


def _dlrun_only(t, d, run):
    return None if (t is None, d is None) == (True, False) else "set by dlrun alone"


def _dlrun_where_it_applies(t, d, run):
    """A variable dlrun sets in some jobs alone (several nodes, say): never torchrun's."""
    return None if t is None else "set by torchrun too"


def _package_appended(t, d, run):
    """PYTHONPATH: the inherited one (if any), then the directory of dlrun's package."""
    if d is None or not d.endswith("/share/dlrun/python"):
        return "dlrun's package directory is not last"
    inherited = d.rpartition(":")[0] if ":" in d else None
    return None if inherited == (t or None) else "the inherited PYTHONPATH is not kept first"


def _store_address(t, d, run):
    """MASTER_ADDR: torchrun gives a name (standalone `localhost`; two nodes the FQDN of group
    rank 0's node), dlrun a numeric address. Standalone both name this host's loopback. Through a
    rendezvous endpoint torchrun's workers use a second store that its group rank 0's agent
    serves, dlrun's the endpoint's store itself (a dlrund there is the one store of the job),
    through the port of their attempt's key space on it (ARCHITECTURE.md section 3a)."""
    if run["endpoint"] is None:
        # torchrun's name may resolve to 127.0.1.1, as Debian's /etc/hosts maps the host's name
        loopback = all(a.startswith("127.") for a in t["master_addresses"])
        return (
            None
            if (
                loopback
                and t["master_addresses"]
                and d["master_addresses"] == ["127.0.0.1"]
                and d["env"]["MASTER_ADDR"] == "127.0.0.1"
            )
            else "not this host's loopback"
        )
    host, port = run["endpoint"].rsplit(":", 1)
    if d["env"]["MASTER_ADDR"] != host or d["env"]["MASTER_PORT"] == port:
        return f"dlrun's workers do not reach an attempt's port of the endpoint {run['endpoint']}"
    if not set(t["master_addresses"]) & set(run["group0"]["torchrun"]):
        return "torchrun's store is not on its group rank 0's host"
    if t["env"]["MASTER_PORT"] == port:
        return "torchrun's workers use the rendezvous store"
    return None


# The documented differences: variable -> (its check, the words of
# docs/guides/moving-from-torchrun.md). Each check takes both records of a rank (or, for a
# variable one launcher lacks, both values) and the launch, and returns what no longer holds
# (None: the difference is as documented).
DOCUMENTED = {
    "TF_CONFIG": (
        "values",
        _dlrun_only,
        "dlrun describes the job to TensorFlow's strategies (--tf-config=never: not)",
    ),
    "NCCL_ASYNC_ERROR_HANDLING": (
        "values",
        _dlrun_only,
        "torch 1.x's name of TORCH_NCCL_ASYNC_ERROR_HANDLING",
    ),
    "DLRUN_PROGRESS_FILE": ("values", _dlrun_only, "the progress board dlrun.progress writes"),
    "DLRUN_CHECKPOINT_SHM": (
        "values",
        _dlrun_only,
        "the node's memory dlrun.checkpoint saves into",
    ),
    "DLRUN_CHECKPOINT_COPY": (
        "values",
        _dlrun_only,
        "the module dlrun.checkpoint copies a save with",
    ),
    "DLRUN_CHECKPOINT_AGENT": (
        "values",
        _dlrun_where_it_applies,
        "where the node's dlrun serves checkpoint copies",
    ),
    "PYTHONPATH": (
        "values",
        _package_appended,
        "dlrun appends the directory of its Python package, after the worker's own",
    ),
    "MASTER_ADDR": (
        "records",
        _store_address,
        "dlrun's addresses are numeric; through an endpoint dlrun's workers use its store",
    ),
    "MASTER_PORT": (
        "records",
        _store_address,
        "through an endpoint dlrun's workers use its "
        "store, at their attempt's port; torchrun 2.x's group rank 0 agent serves "
        "them another",
    ),
}


def normalise(env, run):
    return {
        key: NORMALISED[key](value, run) if key in NORMALISED else value
        for key, value in env.items()
    }


def env_differences(torchrun_env, dlrun_env, run):
    """The variables set differently by the two launchers, outside DOCUMENTED:
    {name: (torchrun's, dlrun's)}, a missing one as None."""
    left, right = normalise(torchrun_env, run), normalise(dlrun_env, run)
    return {
        key: (left.get(key), right.get(key))
        for key in sorted(set(left) | set(right))
        if key not in DOCUMENTED and left.get(key) != right.get(key)
    }


def documented_differences_hold(t, d, run):
    """Each DOCUMENTED entry checked for one rank's records: {name: what is wrong}."""
    wrong = {}
    for key, (takes, check, reason) in DOCUMENTED.items():
        problem = (
            check(t["env"].get(key), d["env"].get(key), run)
            if takes == "values"
            else check(t, d, run)
        )
        if problem:
            wrong[key] = (
                f"{problem} (documented: {reason}): torchrun {t['env'].get(key)!r}, "
                f"dlrun {d['env'].get(key)!r}"
            )
    return wrong


# --- launching -------------------------------------------------------------------------------


def torchrun_argv(*args):
    return [PYTHON, "-m", "torch.distributed.run", *args]


def dlrun_argv(*args):
    return [binary_from_env("DLRUN", "dlrun"), *args]


def launch_env(tmp, **overrides):
    """The same environment for both launchers: nothing inherited that steers either, the
    interpreter under test for .py entry points (both honour PYTHON_EXEC), one TMPDIR."""
    return clean_env(PYTHON_EXEC=PYTHON, TMPDIR=tmp, **overrides)


def records(out, prefix, count):
    return [read_json(os.path.join(out, f"{prefix}_{r}.json")) for r in range(count)]


class Torch2Case(unittest.TestCase):
    def setUp(self):
        # Not skipped elsewhere: under another torch these tests would prove nothing.
        self.assertTrue(
            torch.__version__.startswith(TORCH_ERA),
            f"{PYTHON} has torch {torch.__version__}, not {TORCH_ERA}x",
        )
        self.logs = temp_dir(self)

    def launch(self, name, argv, env, **kwargs):
        return Launcher(self, name, argv, env, self.logs, **kwargs)

    def all_logs(self):
        return log_tails(self.logs, tail=None)

    def assert_replicas(self, out, world):
        names = sorted(os.listdir(out))
        self.assertEqual(names, sorted(f"ok_{r}.json" for r in range(world)), self.all_logs())
        done = [read_json(os.path.join(out, n)) for n in names]
        self.assertEqual(sorted(r["rank"] for r in done), list(range(world)))
        self.assertEqual({r["world"] for r in done}, {world})
        self.assertEqual({r["executable"] for r in done}, {PYTHON})
        self.assertEqual(len({r["checksum"] for r in done}), 1, done)

    def start_dlrund(self, hosts):
        """dlrund inside host 0 at RDZV_PORT; returns once it listens."""
        return dlrund_in(self, hosts, clean_env(), self.logs, "--stats")

    def dlrund_stats(self, dlrund):
        """Stops dlrund (SIGTERM); returns its --stats counts at exit, {"connections": N, ...}."""
        dlrund.proc.send_signal(signal.SIGTERM)
        self.assertEqual(dlrund.wait(START_TIMEOUT_S), 0, dlrund.describe())
        line = next(
            (s for s in dlrund.output().splitlines() if s.startswith("dlrund stats:")), None
        )
        self.assertIsNotNone(line, dlrund.describe())
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}

    def endpoint(self, hosts):
        return f"{hosts.address(0)}:{RDZV_PORT}"

    def assert_error_files(self, recs):
        """TORCHELASTIC_ERROR_FILE: one per rank, and where torch's @record writes."""
        files = [r["env"]["TORCHELASTIC_ERROR_FILE"] for r in recs]
        self.assertEqual(len(set(files)), len(files), files)
        self.assertEqual([r["error_file"] for r in recs], files)

    def assert_same_launch(self, recs, run):
        """Rank by rank ({launcher: records in RANK order}): the environment diff, and what
        torch's readers make of it."""
        self.assertEqual(len(recs["torchrun"]), len(recs["dlrun"]))
        for rs in recs.values():
            self.assert_error_files(rs)
        run = dict(
            run,
            group0={
                launcher: next(r["host_addresses"] for r in rs if r["env"]["GROUP_RANK"] == "0")
                for launcher, rs in recs.items()
            },
        )
        for t, d in zip(recs["torchrun"], recs["dlrun"]):
            with self.subTest(rank=t["env"]["RANK"]):
                self.assertEqual(env_differences(t["env"], d["env"], run), {})
                self.assertEqual(documented_differences_hold(t, d, run), {})
                # The same interpreter, flags and script; the last argument, each run's
                # OUT_DIR, differs.
                self.assertEqual(t["orig_argv"][:-1], d["orig_argv"][:-1])
                for field in (
                    "torch",
                    "is_torchelastic_launched",
                    "use_agent_store",
                    "process_group",
                ):
                    self.assertEqual(t[field], d[field], field)


class DdpTest(Torch2Case):
    """torch 2.13 DDP over gloo, to identical parameters on every rank."""

    def test_torchrun_agents_on_two_hosts_through_dlrund(self):
        with Hosts(2) as hosts:
            dlrund = self.start_dlrund(hosts)
            out = temp_dir(self)
            env = clean_env(GLOO_SOCKET_IFNAME="eth0", PYTHON_EXEC=PYTHON)
            agents = [
                self.launch(
                    f"torchrun{i}",
                    torchrun_argv(
                        "--nnodes=2",
                        f"--nproc-per-node={NPROC}",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={self.endpoint(hosts)}",
                        "--rdzv-id=torchrun-ddp",
                        "--rdzv-conf",
                        "is_host=false",
                        "--max-restarts=0",
                        "--monitor-interval=0.1",
                        DDP_TRAIN,
                        out,
                        str(2 * NPROC),
                    ),
                    env,
                    hosts=hosts,
                    host=i,
                )
                for i in range(2)
            ]
            for agent in agents:
                self.assertEqual(agent.wait(), 0, self.all_logs())
            self.assert_replicas(out, 2 * NPROC)
            # Both agents held the rendezvous there: torch's c10d backend keeps its state with
            # compare-and-set.
            stats = self.dlrund_stats(dlrund)
            self.assertGreaterEqual(stats["connections"], 2, stats)
            self.assertGreater(stats["COMPARE_SET"], 0, stats)

    def test_dlrun_on_one_host(self):
        out = temp_dir(self)
        agent = self.launch(
            "dlrun",
            dlrun_argv(
                "--standalone", f"--nproc-per-node={NPROC}", PYTHON, DDP_TRAIN, out, str(NPROC)
            ),
            clean_env(TMPDIR=self.logs),
        )
        self.assertEqual(agent.wait(), 0, self.all_logs())
        self.assert_replicas(out, NPROC)

    def test_dlrun_on_two_hosts(self):
        with Hosts(2) as hosts:
            out = temp_dir(self)
            env = clean_env(GLOO_SOCKET_IFNAME="eth0", TMPDIR=self.logs)
            agents = [
                self.launch(
                    f"dlrun{i}",
                    dlrun_argv(
                        "--nnodes=2",
                        f"--nproc-per-node={NPROC}",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={self.endpoint(hosts)}",
                        "--rdzv-id=dlrun-ddp",
                        PYTHON,
                        DDP_TRAIN,
                        out,
                        str(2 * NPROC),
                    ),
                    env,
                    hosts=hosts,
                    host=i,
                )
                for i in range(2)
            ]
            for agent in agents:
                self.assertEqual(agent.wait(), 0, self.all_logs())
            self.assert_replicas(out, 2 * NPROC)


class EnvironmentDiffTest(Torch2Case):
    """The same worker under torchrun 2.13 and under dlrun, with the same flags and environment."""

    def probe_both(self, flags, env, hosts=None):
        """Runs torch_probe.py under each launcher, one agent per host (or one on loopback);
        returns {launcher: the records in RANK order}."""
        recs = {}
        for launcher, argv in (("torchrun", torchrun_argv), ("dlrun", dlrun_argv)):
            out = temp_dir(self)
            agents = [
                self.launch(
                    f"{launcher}{i}",
                    argv(*flags, PROBE, out),
                    env,
                    out_dir=out,
                    hosts=hosts,
                    host=i,
                )
                for i in (range(hosts.n) if hosts else [None])
            ]
            for agent in agents:
                self.assertEqual(agent.wait(), 0, self.all_logs())
            recs[launcher] = records(out, "probe", NPROC * len(agents))
        return recs

    def test_standalone(self):
        tmp = temp_dir(self)
        recs = self.probe_both(
            ["--standalone", f"--nproc-per-node={NPROC}"],
            launch_env(tmp, TORCHELASTIC_ENABLE_FILE_TIMER="1"),
        )
        for rec in recs["dlrun"]:
            self.assertIn("TORCHELASTIC_TIMER_FILE", rec["env"])
        self.assert_same_launch(recs, {"tmp": tmp, "endpoint": None})

    def test_two_nodes_through_dlrund(self):
        tmp = temp_dir(self)
        with Hosts(2) as hosts:
            self.start_dlrund(hosts)
            endpoint = self.endpoint(hosts)
            # One after the other under one id: torchrun's and dlrun's keys never meet.
            recs = self.probe_both(
                [
                    "--nnodes=2",
                    f"--nproc-per-node={NPROC}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}",
                    "--rdzv-id=envdiff",
                    "--rdzv-conf",
                    "is_host=false",
                ],
                launch_env(tmp, GLOO_SOCKET_IFNAME="eth0"),
                hosts,
            )
        self.assert_same_launch(recs, {"tmp": tmp, "endpoint": endpoint})


class ElasticFeaturesTest(Torch2Case):
    """torch 2.13's FileTimerClient and @record under both launchers (torch's other readers of
    the launcher's variables: EnvironmentDiffTest)."""

    def run_both(self, worker_argv, env, nproc=NPROC):
        """Runs worker_argv (its OUT_DIR first) under torchrun 2.13 and under dlrun, standalone;
        returns {launcher: (exit code, output, out dir)}."""
        results = {}
        for launcher, argv in (("torchrun", torchrun_argv), ("dlrun", dlrun_argv)):
            out = temp_dir(self)
            agent = self.launch(
                launcher,
                argv(
                    "--standalone",
                    f"--nproc-per-node={nproc}",
                    worker_argv[0],
                    out,
                    *worker_argv[1:],
                ),
                env,
                out_dir=out,
            )
            code = agent.wait()
            results[launcher] = (code, agent.output(), out)
        return results

    def test_record_error_file_reaches_the_report(self):
        results = self.run_both([FAIL_WORKER, "record", "1", RECORD_MESSAGE], launch_env(self.logs))
        for launcher, (code, output, _) in results.items():
            with self.subTest(launcher=launcher):
                self.assertEqual(code, 1, output)
        # Each launcher's root cause is the error file torch 2.13's @record wrote.
        torchrun = results["torchrun"][1]
        self.assertRegex(
            torchrun,
            r"Root Cause[^\n]*\n(.*\n)*?\s*rank\s*: 1 \(local_rank: 1\)"
            r"\n(.*\n)*?\s*error_file: \S+/error\.json\n",
            torchrun,
        )
        self.assertIn(f"RuntimeError: {RECORD_MESSAGE}", torchrun)
        report = [line for line in results["dlrun"][1].splitlines() if line.startswith("dlrun:")]
        self.assertIn("dlrun: worker failed: rank 1 (local rank 1) ended with exit code 1", report)
        at = report.index("dlrun: error file of rank 1:")
        self.assertEqual(report[at + 1], f"dlrun:   RuntimeError: {RECORD_MESSAGE}", report)

    def test_file_timer_in_time(self):
        results = self.run_both(
            [TIMER_WORKER, "in-time"], launch_env(self.logs, TORCHELASTIC_ENABLE_FILE_TIMER="1")
        )
        for launcher, (code, output, out) in results.items():
            with self.subTest(launcher=launcher):
                self.assertEqual(code, 0, output)
                for rec in records(out, "rank", NPROC):
                    self.assertTrue(rec["is_fifo"], rec)

    def test_file_timer_overrun_is_killed(self):
        for launcher, argv in (("torchrun", torchrun_argv), ("dlrun", dlrun_argv)):
            with self.subTest(launcher=launcher):
                out = temp_dir(self)
                agent = self.launch(
                    launcher,
                    argv(
                        "--standalone",
                        f"--nproc-per-node={NPROC}",
                        TIMER_WORKER,
                        out,
                        "overrun",
                        "1",
                    ),
                    launch_env(self.logs, TORCHELASTIC_ENABLE_FILE_TIMER="1"),
                    out_dir=out,
                )
                entered = os.path.join(out, "entering_1")
                wait_until(
                    lambda: os.path.exists(entered),
                    START_TIMEOUT_S * 2,
                    "rank 1 to enter its block",
                    proc=agent.proc,
                    on_timeout=agent.describe,
                )
                entered_at = time.monotonic()
                slow = read_json(os.path.join(out, "rank_1.json"))
                wait_until(
                    lambda: not is_running(slow["pid"]),
                    KILLED_WITHIN_S,
                    f"rank 1 (pid {slow['pid']}) to be killed",
                    on_timeout=agent.describe,
                )
                killed_after = time.monotonic() - entered_at
                code = agent.wait()
                output = agent.output()
                self.assertTrue(slow["is_fifo"], slow)
                self.assertGreaterEqual(killed_after, TIMER_S * 0.8, output)
                self.assertFalse(os.path.exists(os.path.join(out, "survived_1")), output)
                if launcher == "torchrun":
                    # torch 2.13's FileTimerServer, having reaped a worker, kills its own agent
                    # with the same signal: no report, no restart.
                    self.assertEqual(code, -signal.SIGKILL, output)
                else:
                    self.assertEqual(code, 128 + signal.SIGKILL, output)
                    self.assertIn(
                        f"dlrun: rank 1 (pid {slow['pid']}): timer 'slow_block' "
                        "expired; sending SIGKILL",
                        output,
                    )


if __name__ == "__main__":
    main()
