"""dlrund's store against torch's own TCPStore servers, differentially (issue 29).

One fixed sequence of client calls (store_sequence.py: every method of torch 2.13's TCPStore,
bad arguments, timeouts, waits released by other clients) runs against torch's servers and
against dlrund, from three kinds of client:
  - torch 2.13 with use_libuv on (its default) and with it off, against torch 2.13's libuv
    server (the reference), its legacy server (use_libuv=False: a second reference, for the
    steps where torch's two servers agree) and dlrund;
  - torch 1.13 (DLRUN_TORCH1_PYTHON, Debian's), against torch 1.13's own server (a 1.13 client
    cannot talk to a 2.x server) and dlrund.
Each kind also runs through a store proxy (dlrund --upstream, as dlrun --store-proxy puts one in
every agent) in front of a dlrund: every outcome must be the one straight on dlrund.
Every step's outcomes (values, exception classes, timing classes) must match the reference's,
except the steps in KEPT_DIFFERENCES, which must differ: nothing else may, and nothing listed
may silently start to agree. Every run gets fresh servers, so key counts and listings compare.
A run deals its steps among SHARES servers of its kind, each share on a thread of its own
(store_sequence.py): a step meets the same server state in every run, and the run waits out its
timeouts in a fraction of the time.
"""

import json
import os
import subprocess
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

from dlrun_fixture import binary_from_env, die_with_parent, main
from dlrund_fixture import read_line, start_dlrund, stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH2 = sys.executable
OP_TIMEOUT_S = 3  # the clients' timeout: how long a blocked call waits before it fails
SEQUENCE_LIMIT_S = 240  # one whole sequence (about 30 timed-out calls, on two shared cores)
START_LIMIT_S = 60  # torch's servers: importing torch on a busy machine takes a while
SHARES = 4  # servers a run deals its steps among (its threads, not processes: torch imports once)

# Where torch does something dlrun deliberately does not, by step (store_sequence.py) and the
# client kinds whose sequence has that step. The test asserts these steps differ from the
# reference and that no other step does.
KEPT_DIFFERENCES = {
    # torch adds with signed overflow, undefined behaviour in C++ that wraps around in practice:
    # a counter at INT64_MAX becomes INT64_MIN. dlrund refuses the ADD (the client sees its
    # connection dropped, as for a value that is no integer) and leaves the value as it was.
    "add_overflow": {"torch2-libuv", "torch2-legacy", "torch1"},
    # torch's libuv server wakes every WAIT on a key that COMPARE_SET finds missing and does
    # not create; the woken client then reads an empty value for a key that does not exist.
    # dlrund keeps such waits waiting until the key is written (torch's legacy server too).
    "wait_on_compare_set_not_creating": {"torch2-libuv", "torch2-legacy"},
    # torch 1.13's server (like 2.13's legacy one) leaves WAITs on a key asleep when
    # COMPARE_SET creates the key. dlrund wakes them, as torch 2.13's default server does.
    "wait_woken_by_compare_set_creating": {"torch1"},
    # A BARRIER's first arrival creates the counter key without waking WAITs on it in torch;
    # they wake only when the last arrival completes the barrier. In dlrund a WAIT returns once
    # its keys exist, whichever request created them.
    "wait_on_barrier_key": {"torch2-libuv", "torch2-legacy"},
}

# Steps where torch 2.13's legacy server differs from its libuv server, by client kind: the
# legacy server lacks the queue ops and does not wake WAITs on a key that COMPARE_SET creates.
# dlrund follows the libuv server, so these are compared against that one only; the test
# asserts the two torch servers differ on exactly these steps.
LEGACY_SERVER_DIFFERS = {
    "torch2-libuv": {
        "queue",
        "queue_is_no_key",
        "queue_pop_woken_by_push",
        "queue_push_wakes_one",
        "wait_woken_by_compare_set_creating",
        "wait_on_compare_set_not_creating",
    },
    "torch2-legacy": {"wait_woken_by_compare_set_creating", "wait_on_compare_set_not_creating"},
}

# Every client method of torch 2.13's TCPStore that reaches the store (host, port, timeout,
# libuvBackend, clone and has_extended_api do not).
TORCH2_OPS = {
    "set",
    "get",
    "add",
    "compare_set",
    "check",
    "wait",
    "delete_key",
    "num_keys",
    "append",
    "multi_get",
    "multi_set",
    "queue_push",
    "queue_pop",
    "queue_len",
    "list_keys",
    "barrier",
    "set_timeout",
}


def quiet_env():
    # torch logs a warning with a stack for every connection a server drops on purpose here.
    return dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")


def differing_steps(records, reference):
    return {
        step
        for step in records.keys() | reference.keys()
        if records.get(step) != reference.get(step)
    }


def describe(step, records, reference):
    """The calls of `step` whose outcomes differ, for a failure message."""
    if step not in records or step not in reference:
        return f"{step}: ran against only one server"
    lines = [f"{step}:"]
    for (label, got), (_, expected) in zip(records[step]["results"], reference[step]["results"]):
        if got != expected:
            lines.append(f"  {label}: {got} where the reference gives {expected}")
    return "\n".join(lines)


class StoreDifferentialTest(unittest.TestCase):
    def torch_servers(self, python, *backends):
        """Starts torch's own servers (store_servers.py) in one process; returns their ports."""
        proc = subprocess.Popen(
            [python, os.path.join(HERE, "store_servers.py"), *backends],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env=quiet_env(),
            preexec_fn=die_with_parent,
        )
        self.addCleanup(stop_process, proc)
        self.addCleanup(proc.stdin.close)  # the servers' cue to exit
        return json.loads(read_line(proc.stdout, START_LIMIT_S))["ports"]

    def sequence(self, python, ports, libuv):
        """Runs store_sequence.py against servers of one kind; returns its records by step."""
        proc = subprocess.Popen(
            [
                python,
                os.path.join(HERE, "store_sequence.py"),
                "127.0.0.1",
                ",".join(map(str, ports)),
                "1" if libuv else "0",
                str(OP_TIMEOUT_S),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=quiet_env(),
            preexec_fn=die_with_parent,
        )
        self.addCleanup(stop_process, proc)
        try:
            out, err = proc.communicate(timeout=SEQUENCE_LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"__hung__": {"stdout": out[-2000:], "stderr": err[-2000:]}}
        if proc.returncode != 0:
            return {"__failed__": {"rc": proc.returncode, "stderr": err[-4000:]}}
        return {r["step"]: r for r in map(json.loads, out.splitlines())}

    def test_dlrund_answers_as_torchs_own_servers_do(self):
        torch1 = binary_from_env("DLRUN_TORCH1_PYTHON", "torch 1.x python")
        ports = self.torch_servers(TORCH2, *["libuv", "legacy", "libuv", "legacy"] * SHARES)
        libuv_a, legacy_a, libuv_b, legacy_b = (ports[i::4] for i in range(4))
        torch1_ports = self.torch_servers(torch1, *["legacy"] * SHARES)
        dlrunds = [[start_dlrund(self).port for _ in range(SHARES)] for _ in range(3)]
        # The same through a store proxy (dlrund --upstream, dlrun --store-proxy's proxy), each
        # in front of a store of its own.
        proxies = [
            [
                start_dlrund(self, "--upstream", f"127.0.0.1:{start_dlrund(self).port}").port
                for _ in range(SHARES)
            ]
            for _ in range(3)
        ]
        # (client kind, server) -> (interpreter, ports, use_libuv)
        runs = {
            ("torch2-libuv", "libuv"): (TORCH2, libuv_a, True),
            ("torch2-libuv", "legacy"): (TORCH2, legacy_a, True),
            ("torch2-libuv", "dlrund"): (TORCH2, dlrunds[0], True),
            ("torch2-legacy", "libuv"): (TORCH2, libuv_b, False),
            ("torch2-legacy", "legacy"): (TORCH2, legacy_b, False),
            ("torch2-legacy", "dlrund"): (TORCH2, dlrunds[1], False),
            ("torch1", "torch1"): (torch1, torch1_ports, False),
            ("torch1", "dlrund"): (torch1, dlrunds[2], False),
            ("torch2-libuv", "proxy"): (TORCH2, proxies[0], True),
            ("torch2-legacy", "proxy"): (TORCH2, proxies[1], False),
            ("torch1", "proxy"): (torch1, proxies[2], False),
        }
        # All at once: the sequences spend their time blocked on purpose, not computing.
        with ThreadPoolExecutor(len(runs)) as pool:
            futures = {run: pool.submit(self.sequence, *args) for run, args in runs.items()}
            results = {run: future.result() for run, future in futures.items()}

        for run, records in results.items():
            with self.subTest(run=run, check="the sequence ran to its end"):
                self.assertFalse({"__hung__", "__failed__"} & records.keys(), records)
                unclear = [
                    (step, label, outcome)
                    for step, r in records.items()
                    for label, outcome in r["results"]
                    if outcome["timing"] in ("slow", "hang")
                ]
                self.assertEqual(unclear, [], "calls neither immediate nor waiting a timeout")

        for kind in ("torch2-libuv", "torch2-legacy"):
            libuv, legacy = results[(kind, "libuv")], results[(kind, "legacy")]
            dlrund = results[(kind, "dlrund")]
            with self.subTest(client=kind, check="torch's two servers differ where listed"):
                self.assertEqual(differing_steps(legacy, libuv), LEGACY_SERVER_DIFFERS[kind])
            self.assert_differences(kind, dlrund, libuv, "torch 2.13's libuv server")
            agreeing = set(legacy) - LEGACY_SERVER_DIFFERS[kind]
            self.assert_differences(
                kind,
                {s: dlrund.get(s) for s in agreeing},
                {s: legacy[s] for s in agreeing},
                "torch 2.13's legacy server",
            )
        self.assert_differences(
            "torch1",
            results[("torch1", "dlrund")],
            results[("torch1", "torch1")],
            "torch 1.13's server",
        )
        # Through the proxy, every client kind sees what it sees straight on dlrund.
        for kind in ("torch2-libuv", "torch2-legacy", "torch1"):
            with self.subTest(client=kind, check="through the store proxy as straight"):
                proxied, direct = results[(kind, "proxy")], results[(kind, "dlrund")]
                self.assertEqual(
                    differing_steps(proxied, direct),
                    set(),
                    "\n".join(
                        describe(step, proxied, direct)
                        for step in sorted(differing_steps(proxied, direct))
                    ),
                )

        covered = sorted(
            {
                op
                for records in results.values()
                for r in records.values()
                for op in r.get("ops", [])
            }
        )
        print(f"\nops covered: {' '.join(covered)}", file=sys.stderr)
        self.assertEqual(TORCH2_OPS - set(covered), set())

    def assert_differences(self, kind, records, reference, name):
        with self.subTest(client=kind, reference=name):
            kept = {
                step
                for step, kinds in KEPT_DIFFERENCES.items()
                if kind in kinds and step in reference
            }
            differing = differing_steps(records, reference)
            self.assertTrue(reference, f"no records from {name}")
            self.assertEqual(
                differing,
                kept,
                f"dlrund against {name}, {kind} clients:\n"
                + "\n".join(
                    describe(step, records, reference) for step in sorted(differing ^ kept)
                ),
            )


if __name__ == "__main__":
    main()
