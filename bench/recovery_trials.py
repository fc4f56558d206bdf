"""One trial of bench/recovery_bench.py: a training job (bench/recovery_worker.py) under a
launcher, one fault, the time to the job's next completed step, and the checks; and the floor,
the same workers started by hand with no launcher.

The simulated hosts (scripts/netns.sh through tests/python/netns_fixture.py): hosts 0-2 run the
launchers (one agent each), host 3 a fresh dlrund per trial (the c10d rendezvous of the
multi-node cases, the store of both launchers there: `is_host=false`). Every connection starts
inside a namespace; the benchmark itself only reads and writes files. The floor runs in the
root namespace on loopback.

A trial:
1. the agents start; the job is steady once rank 0 of one incarnation (a resume line) has taken
   STEADY_STEPS steps in the world the case expects, then the case's settle time more without a
   restart (a spare in place; a worker's fault: what the node forks ahead made);
2. the fault, its time (time.time()) taken right before the kill;
3. recovery: the first step line of another incarnation than the one stepping at the fault,
   minus the fault's time; failed when none comes within --deadline s, or an agent that was not
   killed exits first (any exit before recovery fails: the job did not come back); a lost
   host, its processes SIGKILLed by PID at the fault, is swept (netns.sh kill) after that;
4. the stop file: every agent not killed must exit 0 within STOP_TIMEOUT_S;
5. the lineage: no resume from an older step than one already logged (a step line means its
   checkpoint was in place), no step logged twice;
6. everything left is killed: each agent by PID, then every process in the trial's hosts
   (netns.sh kill), dlrund by PID.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

from chaos_faults import kill_and_reap, read_from, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dlrun_fixture import clean_env, die_with_parent  # noqa: E402
from dlrund_fixture import read_line  # noqa: E402
from recovery_faults import (  # noqa: E402
    HANG_TIMEOUT_S,
    POLL_S,
    Failed,
    is_worker,
    running_workers,
)

WORKER = os.path.join(HERE, "recovery_worker.py")
STORE_SERVER = os.path.join(HERE, "torch_store_server.py")
DLRUND_HOST = 3
DLRUND_PORT = 29400
STEADY_STEPS = 5  # steps of one incarnation before the job counts as training
START_TIMEOUT_S = 120  # launch to steady training (torch's start-up on 2 shared cores)
STOP_TIMEOUT_S = 60  # the stop file to every agent's exit
# Where a survivor leaves its loop: dlrun.recovery's line (to be replaced, or for the fallback),
# or the agent's refusal of an in-process recovery, or why it stopped the group.
REPLACED = re.compile(
    r"dlrun\.recovery: rank \d+: .*(exiting to be replaced|falling back)"
    r"|no in-process recovery \(|stopping workers: "
)


class Outcome:
    def __init__(self, recovery=None, respawn=None, reason=None, kind=None, note=None, phases=None):
        self.recovery = recovery  # seconds, when the trial succeeded
        self.respawn = respawn  # of which from the fault to the new rank 0's start
        self.phases = phases  # in process: {phase: seconds} of rank 0's recovery
        self.reason = reason  # why it failed, else None
        self.kind = kind  # Failed.kind
        self.note = note  # a remark that is no failure (torchrun's orphaned workers)


# --- what the worker writes ------------------------------------------------------------------


class StepLog:
    """steps.jsonl as it grows: only whole lines, each read once."""

    def __init__(self, path):
        self.path, self.offset, self.records = path, 0, []

    def poll(self):
        data = read_from(self.path, self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                self.records.append(json.loads(line))
            except ValueError:
                continue  # not the worker's (a single write(2) per line leaves no half line)
        return self.records

    def steady(self, world, count):
        """The incarnation of rank 0 when it took `count` steps since its resume in `world`."""
        records = self.poll()
        starts = [i for i, r in enumerate(records) if r["kind"] == "resume"]
        if not starts or records[starts[-1]]["world"] != world:
            return None
        inc = records[starts[-1]]["inc"]
        steps = [r for r in records[starts[-1] + 1 :] if r["kind"] == "step" and r["inc"] == inc]
        return inc if len(steps) >= count else None

    def stepping(self):
        """The incarnation of the last step line, or None."""
        steps = [r for r in self.poll() if r["kind"] == "step"]
        return steps[-1]["inc"] if steps else None

    def first_step_after(self, t, other_than):
        for r in self.poll():
            if r["kind"] == "step" and r["inc"] != other_than and r["time"] > t:
                return r
        return None

    def resume_of(self, step):
        """The resume line of the incarnation that took `step`, or None."""
        return next(
            (
                r
                for r in self.records
                if r["kind"] == "resume" and step is not None and r["inc"] == step["inc"]
            ),
            None,
        )

    def respawn(self, t, other_than):
        """Seconds from `t` to the start of the rank 0 that took the first step after it (in
        process, a survivor's: when its failed step raised)."""
        resume = self.resume_of(self.first_step_after(t, other_than))
        return resume["start"] - t if resume else None

    def phases(self, t, other_than):
        """An in-process recovery's phases as rank 0 saw them: the fault to its recovery's
        start (a replacement's start-up included), its loop's leave, meet, group and state, and the
        step after, or None."""
        step = self.first_step_after(t, other_than)
        resume = self.resume_of(step)
        if not resume or not resume.get("recovery"):
            return None
        took = resume["recovery"]
        # From the recovery's own end back: a replacement's start-up (its interpreter, imports,
        # model) falls before its recovery, in "to recovery".
        return {
            "to recovery": resume["loaded"] - took["total"] - t,
            "leave": took["leave"],
            "meet": took["meet"],
            "group": took["group"],
            "state": took["state"],
            "step": step["time"] - resume["loaded"],
        }

    def read_checkpoint_after(self, t):
        """Whether rank 0 read the checkpoint file in a start after `t`."""
        return any(
            r["kind"] == "resume" and r["start"] > t and r.get("checkpoint") for r in self.poll()
        )

    def lineage_error(self):
        """A step taken twice after it was checkpointed, else None."""
        logged = 0
        for r in self.poll():
            if r["kind"] == "resume" and r["step"] < logged:
                return f"resumed from step {r['step']} after step {logged} was checkpointed"
            if r["kind"] == "step":
                if r["step"] <= logged:
                    return f"step {r['step']} taken twice"
                logged = r["step"]
        return None


# torch 2.13's stores warn on every accept where a peer's name cannot be looked up (the simulated
# hosts have no DNS): noise for a failure's reason.
NOISE = re.compile(r"hostname of the client socket cannot be retrieved|^[\s^~]*$")


def last_line(path):
    """What a log says last: its newest line naming an error among the last 40, else its last
    line (noise left out)."""
    lines = [
        line.strip()
        for line in read_from(path, 0).decode(errors="replace").splitlines()
        if not NOISE.search(line)
    ][-40:]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    text = (errors or lines or ["(no output)"])[-1]
    return text[:240]


# --- a trial ---------------------------------------------------------------------------------


class Trial:
    """One launch of one case under one launcher (`argv_prefix`: the launcher and its own flags)."""

    def __init__(self, setup, case, launcher, argv_prefix, index):
        self.setup, self.case, self.launcher, self.index = setup, case, launcher, index
        self.hosts, self.nproc = setup.hosts, setup.nproc
        self.dir = os.path.join(setup.scratch, f"{case.name}-{launcher}-{index}")
        os.makedirs(self.dir)
        shutil.copy(setup.checkpoint, os.path.join(self.dir, "checkpoint.pt"))
        self.log = StepLog(os.path.join(self.dir, "steps.jsonl"))
        self.argv_prefix = argv_prefix
        self.agents = {}  # host -> Popen of its launcher
        self.killed = set()  # hosts whose agent the fault took
        self.sweep = set()  # killed hosts to sweep once the recovery is measured (kill_host)
        self.dlrund = None
        self.fault_time = None
        self.fault_inc = None
        self.in_process = launcher.startswith("dlrun-inproc")
        self.victims = set()  # PIDs of the workers the fault killed (or took with a node)
        self.before = []  # the workers running right before the fault

    def flags(self):
        s = self.setup
        flags = [f"--nproc-per-node={self.nproc}", f"--max-restarts={s.max_restarts}"]
        if self.case.name == "hang":
            flags.append(f"--hang-timeout={HANG_TIMEOUT_S:g}")
        if self.case.nnodes is None:
            return ["--standalone", *flags]
        conf = ",".join(["is_host=false", *([s.rdzv_conf] if s.rdzv_conf else [])])
        return [
            f"--nnodes={self.case.nnodes}",
            *flags,
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.hosts.address(DLRUND_HOST)}:{DLRUND_PORT}",
            f"--rdzv-id=recovery-{self.launcher}-{self.case.name}-{self.index}",
            f"--rdzv-conf={conf}",
        ]

    def start(self):
        if self.case.nnodes is not None:
            self.start_dlrund()
        env = clean_env(
            PYTHON_EXEC=self.setup.python,
            TMPDIR=self.dir,
            GLOO_SOCKET_IFNAME="lo" if self.case.nnodes is None else "eth0",
        )
        argv = [
            *self.argv_prefix,
            *self.flags(),
            WORKER,
            "--out",
            self.dir,
            *self.setup.worker_args,
        ]
        for host in self.case.hosts:
            with open(self.agent_log(host), "wb") as log:
                self.agents[host] = self.hosts.popen(
                    host, argv, env=env, stdout=log, stderr=subprocess.STDOUT
                )

    def start_dlrund(self):
        path = os.path.join(self.dir, "dlrund.log")
        with open(path, "wb") as log:
            self.dlrund = self.hosts.popen(
                DLRUND_HOST,
                [
                    self.setup.dlrund,
                    "--host",
                    self.hosts.address(DLRUND_HOST),
                    "--port",
                    str(DLRUND_PORT),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if not wait_for(
            lambda: b"listening on" in read_from(path, 0),
            30,
            lambda: self.dlrund.poll() is not None,
            every=POLL_S,
        ):
            raise Failed("setup", f"dlrund did not start: {last_line(path)}")

    def stamp_fault(self):
        """Right before the kill: its time, and the incarnation of rank 0 stepping then (the
        job may have restarted since it was steady: a step of that one is no recovery)."""
        self.fault_inc = self.log.stepping()
        self.before = running_workers(self.dir)
        self.fault_time = time.time()

    def agent_log(self, host):
        return os.path.join(self.dir, f"agent{host}.log")

    def live_agents(self):
        return {h: p for h, p in self.agents.items() if h not in self.killed}

    def agent_exit(self):
        """'host H exited C: its last line' for the first agent not killed that exited."""
        for host, proc in self.live_agents().items():
            if proc.poll() is not None:
                return (
                    f"host{host}'s {self.launcher} exited {proc.returncode}: "
                    f"{last_line(self.agent_log(host))}"
                )
        return None

    def wait_steady(self):
        world = self.case.world * self.nproc
        inc = None

        def steady():
            nonlocal inc
            inc = self.log.steady(world, STEADY_STEPS)
            return inc is not None

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if not wait_for(steady, deadline - time.monotonic(), self.agent_exit, POLL_S):
                why = self.agent_exit() or f"no steady training within {START_TIMEOUT_S} s"
                raise Failed("start", f"did not start: {why}")
            if not self.case.settle:
                return inc
            time.sleep(self.case.settle)  # the spare's join; a restart meanwhile starts over
            if self.log.steady(world, STEADY_STEPS) == inc and self.log.stepping() == inc:
                return inc

    def wait_recovery(self, inc):
        found = None

        def recovered():
            nonlocal found
            found = self.log.first_step_after(self.fault_time, inc)
            return found is not None

        deadline = self.fault_time + self.setup.deadline
        if not wait_for(recovered, max(0.0, deadline - time.time()), self.agent_exit, POLL_S):
            if recovered():  # the step came just as an agent exited
                return found["time"] - self.fault_time
            exited = self.agent_exit()
            if exited:
                raise Failed("exit", exited)
            raise Failed(
                "hang",
                f"no step within {self.setup.deadline:g} s of the fault; "
                + "; ".join(f"host{h}: {last_line(self.agent_log(h))}" for h in self.live_agents()),
            )
        return found["time"] - self.fault_time

    def stop(self):
        with open(os.path.join(self.dir, "stop"), "w"):
            pass
        live = self.live_agents()
        if not wait_for(
            lambda: all(p.poll() is not None for p in live.values()), STOP_TIMEOUT_S, every=POLL_S
        ):
            raise Failed("stop", f"still running {STOP_TIMEOUT_S} s after the stop")
        bad = self.agent_exit_codes(live)
        if bad:
            raise Failed("stop", f"exited non-zero after recovering: {bad}")

    def agent_exit_codes(self, agents):
        bad = []
        for host, proc in agents.items():
            if proc.returncode != 0:
                bad.append(f"host{host} {proc.returncode} ({last_line(self.agent_log(host))})")
        return "; ".join(bad)

    def run(self):
        """Runs the trial; returns an Outcome. Everything it started is stopped before it
        returns."""
        try:
            self.start()
            self.wait_steady()
            note = self.case.fault(self)
            recovery = self.wait_recovery(self.fault_inc)
            for host in self.sweep:
                self.hosts.kill_host(host)
            respawn = self.log.respawn(self.fault_time, self.fault_inc)
            phases = self.check_in_process() if self.in_process else None
            self.stop()
            error = self.log.lineage_error()
            if error:
                raise Failed("twice", error)
            return Outcome(recovery=recovery, respawn=respawn, note=note, phases=phases)
        except Failed as failure:
            return Outcome(reason=str(failure), kind=failure.kind)
        finally:
            self.close()

    def check_in_process(self):
        """After an in-process recovery: every survivor's process is the one from before the
        fault, no checkpoint was read; returns rank 0's phases."""
        gone = [w for w in self.before if w["pid"] not in self.victims and not is_worker(w)]
        if gone:
            raise Failed(
                "replaced",
                "survivors' processes replaced: ranks "
                + ", ".join(str(w["rank"]) for w in gone)
                + self.why_replaced(),
            )
        if self.log.read_checkpoint_after(self.fault_time):
            raise Failed("checkpoint", "rank 0 read the checkpoint file after the fault")
        phases = self.log.phases(self.fault_time, self.fault_inc)
        if phases is None:
            raise Failed("replaced", "the step after the fault came from no in-process recovery")
        return phases

    def why_replaced(self):
        """What the agents' logs say of a survivor that left its loop (the loop's own line, its
        agent's refusal to recover in process, or why it stopped the group), as '; ' and the
        first such line, else nothing."""
        for host in sorted(self.agents):
            text = read_from(self.agent_log(host), 0).decode(errors="replace")
            for line in text.splitlines():
                if REPLACED.search(line):
                    return f"; host{host}: {line.strip()[:300]}"
        return ""

    def close(self):
        for proc in self.agents.values():
            kill_and_reap(proc)
        for host in self.case.hosts:  # torchrun's orphaned workers, whatever else is left
            if self.hosts.closed:
                break  # a signal's handler took every host down already
            try:
                self.hosts.kill_host(host)
            except RuntimeError as error:  # netns.sh kill: something outlived 10 s of SIGKILLs
                print(f"recovery_bench: {error}", file=sys.stderr, flush=True)
        kill_and_reap(self.dlrund)


# --- the floor -------------------------------------------------------------------------------


def floor_trial(setup, world, index):
    """The workers' own start, no launcher: `world` processes started at once on loopback with
    the environment torchrun gives (rank by hand, a fresh torch TCPStore served by
    torch_store_server.py, as a launcher's store exists before its workers), each loading the
    checkpoint; returns (seconds from their start to the first completed step, rank 0's resume
    record with the times it was launched and took its first step), or raises Failed."""
    out = os.path.join(setup.scratch, f"floor{world}-{index}")
    os.makedirs(out)
    shutil.copy(setup.checkpoint, os.path.join(out, "checkpoint.pt"))
    return run_bare(setup, world, out)


def run_bare(setup, world, out):
    """Runs the workers of `out` by hand until their first step, then stops them."""
    store = subprocess.Popen(
        [setup.python, STORE_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
    workers = []
    try:
        port = int(read_line(store.stdout, 30))
        log = StepLog(os.path.join(out, "steps.jsonl"))
        base = clean_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            GROUP_RANK="0",
            GROUP_WORLD_SIZE="1",
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            TORCHELASTIC_RUN_ID="floor",
            OMP_NUM_THREADS="1",
            TMPDIR=out,
        )
        start = time.time()
        for rank in range(world):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
            with open(os.path.join(out, f"rank{rank}.log"), "wb") as f:
                workers.append(
                    subprocess.Popen(
                        [setup.python, "-u", WORKER, "--out", out, *setup.worker_args],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent,
                    )
                )
        first = None

        def stepped():
            nonlocal first
            first = next((r for r in log.poll() if r["kind"] == "step"), None)
            return first is not None

        exited = lambda: any(w.poll() is not None for w in workers)  # noqa: E731
        if not wait_for(stepped, START_TIMEOUT_S, exited, POLL_S):
            why = last_line(os.path.join(out, "rank0.log"))
            raise Failed("start", f"the bare workers took no step: {why}")
        with open(os.path.join(out, "stop"), "w"):
            pass
        wait_for(lambda: all(w.poll() is not None for w in workers), STOP_TIMEOUT_S)
        resume = next(r for r in log.poll() if r["kind"] == "resume")
        return first["time"] - start, dict(resume, launched=start, first=first["time"])
    finally:
        for proc in workers:
            kill_and_reap(proc)
        store.stdin.close()
        kill_and_reap(store)
        store.stdout.close()
