"""Runs one fixed sequence of torch TCPStore client calls against a store; prints one JSON record
per step, for the store differential test (test_store_differential.py) to compare across servers.

Usage: store_sequence.py HOST PORTS LIBUV TIMEOUT_S  (LIBUV: 1 or 0, the clients' use_libuv; a
torch 1.x interpreter has no such option and ignores it). PORTS is one port, or several servers
of one kind separated by commas: the steps are dealt among them in turn (step i to server
i % count) and each server's share runs on a thread of its own, all at once, since the steps
spend their time waiting on timeouts. Each server sees the same steps in the same order from one
run to the next, so its key counts and listings compare.

Every step uses fresh client connections and keys under its own prefix ("<step>/..."), so a step
whose connection the server drops leaves the next steps unaffected. A record is
{"step": name, "ops": [client methods it calls], "results": [[label, outcome], ...]} where an
outcome is {"value": ..., "error": exception class name or null, "timing": class}. Timing
classes: "immediate" (returned within IMMEDIATE_S), "timeout" (ran to the call's timeout),
"woken" (a call in the background that was still blocked BLOCK_CHECK_S after it began and
returned within IMMEDIATE_S of the step's trigger), "client-side" (a TypeError from the
bindings: nothing was sent), "slow" or "hang" (none of those: always a failure). Steps that
call a method this torch lacks are left out (torch 1.x has fewer), as they are against every
server.
"""

import json
import sys
import threading

from store_sequence_record import FINISH_GRACE_S, IMMEDIATE_S, STEPS, Background, Run, step, td

# --- plain values ---------------------------------------------------------------------------


@step("set", "get")
def set_get(s):
    c = s.client()
    for label, value in (
        ("text", "hello"),
        ("binary", b"\x00a\x00\xff"),
        ("empty", b""),
        ("large", bytes(range(256)) * 4096),
    ):
        s.call(f"set {label}", lambda: c.set(s.k(label), value))
        s.call(f"get {label}", lambda: c.get(s.k(label)))
    s.call("overwrite", lambda: c.set(s.k("text"), "replaced"))
    s.call("get overwritten", lambda c=s.client(): c.get(s.k("text")))
    s.call("set empty key", lambda: c.set("", "v"))
    s.call("get empty key", lambda: c.get(""))


@step("get")
def get_missing(s):
    s.call("get missing", lambda c=s.client(): c.get(s.k("missing")))


@step("set_timeout", "get")
def get_missing_after_set_timeout(s):
    c = s.client(timeout_s=60)
    s.call("set_timeout", lambda: c.set_timeout(td(s.run.timeout_s)))
    s.call("get missing", lambda: c.get(s.k("missing")))


@step("add", "get")
def add(s):
    c = s.client()
    for delta in (5, 2, -10, 0):
        s.call(f"add {delta}", lambda: c.add(s.k("n"), delta))
    s.call("get", lambda: c.get(s.k("n")))


@step("set", "add", "get")
def add_onto_text(s):
    """Values that are integers only in part: torch reads them as C's strtoll does."""
    for name, text in (
        ("suffix", "12abc"),
        ("space", " 7"),
        ("plus", "+4"),
        ("hex", "0x10"),
        ("newline", "\n-3\n"),
    ):
        c = s.client()
        s.call(f"set {name}", lambda: c.set(s.k(name), text))
        s.call(f"add {name}", lambda: c.add(s.k(name), 1))
        s.call(f"get {name}", lambda c=s.client(): c.get(s.k(name)))


@step("set", "add", "get")
def add_onto_non_integer(s):
    """The server drops the connection; the store and the server live on."""
    for name, text in (("word", "abc"), ("empty", ""), ("sign", "-"), ("huge", "9" * 20)):
        c = s.client()
        s.call(f"set {name}", lambda: c.set(s.k(name), text))
        s.call(f"add {name}", lambda: c.add(s.k(name), 1))
        s.call(f"same client {name}", lambda: c.get(s.k(name)))
        s.call(f"get {name}", lambda c=s.client(): c.get(s.k(name)))


@step("set", "add", "get")
def add_overflow(s):
    c = s.client()
    s.call("set max", lambda: c.set(s.k("n"), str(2**63 - 1)))
    s.call("add 1", lambda: c.add(s.k("n"), 1))
    s.call("get", lambda c=s.client(): c.get(s.k("n")))


@step("set", "compare_set", "get", "num_keys")
def compare_set(s):
    c = s.client()
    s.call("set", lambda: c.set(s.k("present"), "old"))
    s.call("match", lambda: c.compare_set(s.k("present"), "old", "new"))
    s.call("mismatch", lambda: c.compare_set(s.k("present"), "wrong", "other"))
    s.call("get", lambda: c.get(s.k("present")))
    s.call("missing, empty expected", lambda: c.compare_set(s.k("created"), "", "first"))
    s.call("get created", lambda: c.get(s.k("created")))
    before = c.num_keys()
    s.call("missing, expected given", lambda: c.compare_set(s.k("absent"), "x", "y"))
    s.call("keys added", lambda: c.num_keys() - before)
    s.call("empty desired", lambda: c.compare_set(s.k("present"), "new", ""))
    s.call("get emptied", lambda: c.get(s.k("present")))


@step("set", "check")
def check(s):
    c = s.client()
    c.set(s.k("a"), "1")
    s.call("present", lambda: c.check([s.k("a")]))
    s.call("missing", lambda: c.check([s.k("b")]))
    s.call("mixed", lambda: c.check([s.k("a"), s.k("b")]))
    s.call("none", lambda: c.check([]))


@step("set", "delete_key", "get", "num_keys")
def delete_key(s):
    c = s.client()
    before = c.num_keys()
    c.set(s.k("a"), "1")
    s.call("delete present", lambda: c.delete_key(s.k("a")))
    s.call("delete again", lambda: c.delete_key(s.k("a")))
    s.call("delete never set", lambda: c.delete_key(s.k("b")))
    s.call("keys added", lambda: c.num_keys() - before)
    s.call("set again", lambda: c.set(s.k("a"), "2"))
    s.call("get", lambda: c.get(s.k("a")))


@step("set", "add", "num_keys")
def num_keys(s):
    c = s.client()
    before = c.num_keys()
    c.set(s.k("a"), "1")
    c.set(s.k("b"), "2")
    c.set(s.k("a"), "3")
    c.add(s.k("c"), 1)
    s.call("keys added", lambda: c.num_keys() - before)


@step("append", "get")
def append(s):
    c = s.client()
    s.call("append new", lambda: c.append(s.k("a"), "po"))
    s.call("append more", lambda: c.append(s.k("a"), "tato"))
    s.call("append nothing", lambda: c.append(s.k("a"), ""))
    s.call("get", lambda: c.get(s.k("a")))
    s.call("append empty to new", lambda: c.append(s.k("b"), ""))
    s.call("get empty", lambda: c.get(s.k("b")))


@step("multi_set", "multi_get", "get")
def multi_set_get(s):
    c = s.client()
    s.call("multi_set", lambda: c.multi_set([s.k("a"), s.k("b")], ["1", "2"]))
    s.call("multi_get", lambda: c.multi_get([s.k("b"), s.k("a"), s.k("b")]))
    s.call("get", lambda: c.get(s.k("a")))
    s.call("multi_set none", lambda: c.multi_set([], []))
    s.call("multi_get none", lambda: c.multi_get([]))
    s.call("multi_set repeated key", lambda: c.multi_set([s.k("c"), s.k("c")], ["x", "y"]))
    s.call("get repeated", lambda: c.get(s.k("c")))


@step("multi_get")
def multi_get_missing(s):
    c = s.client()
    c.set(s.k("a"), "1")
    s.call("multi_get missing", lambda: c.multi_get([s.k("a"), s.k("missing")]))


@step("list_keys", "set", "add", "delete_key", "queue_push")
def list_keys(s):
    c = s.client()
    c.set(s.k("a"), "1")
    c.add(s.k("b"), 1)
    c.set(s.k("c"), "3")
    c.delete_key(s.k("c"))
    s.call("queue_push", lambda c=s.client(): c.queue_push(s.k("q"), "v"))  # queues are no keys
    s.call("list_keys", lambda: sorted(k for k in c.list_keys() if k.startswith(s.name)))


# --- waiting --------------------------------------------------------------------------------


@step("set", "wait")
def wait_present(s):
    c = s.client()
    c.set(s.k("a"), "1")
    c.set(s.k("b"), "2")
    s.call("present", lambda: c.wait([s.k("a"), s.k("b")]))
    s.call("present, timeout given", lambda: c.wait([s.k("a")], td(s.run.timeout_s)))
    s.call("none", lambda: c.wait([]))


@step("wait", "set", "get")
def wait_timeout(s):
    c = s.client()
    s.call("wait, timeout given", lambda: c.wait([s.k("missing")], td(s.run.timeout_s)))
    s.call("same client set", lambda: c.set(s.k("after"), "x"))
    s.call("same client get", lambda: c.get(s.k("after")))


@step("wait")
def wait_default_timeout(s):
    s.call("wait", lambda c=s.client(): c.wait([s.k("missing")]))


def woken_wait(s, keys, triggers):
    """A client waits on `keys`; another runs `triggers` (label, fn(client)) in order, and the
    wait is observed blocked before the last one and finished after it."""
    waiter, other = s.client(), s.client()
    call = Background(lambda: waiter.wait([s.k(k) for k in keys]))
    for label, fn in triggers:
        s.blocked(f"blocked before {label}", call)
        s.trigger(label, lambda: fn(other))
    s.finish("wait", call)
    s.call("same client get", lambda: waiter.get(s.k(keys[0])))


@step("wait", "set", "get")
def wait_woken_by_set(s):
    woken_wait(s, ["k"], [("set", lambda c: c.set(s.k("k"), "v"))])


@step("wait", "add", "get")
def wait_woken_by_add(s):
    woken_wait(s, ["k"], [("add", lambda c: c.add(s.k("k"), 3))])


@step("wait", "append", "get")
def wait_woken_by_append(s):
    woken_wait(s, ["k"], [("append", lambda c: c.append(s.k("k"), "v"))])


@step("wait", "multi_set", "get")
def wait_woken_by_multi_set(s):
    woken_wait(s, ["k"], [("multi_set", lambda c: c.multi_set([s.k("j"), s.k("k")], ["1", "2"]))])


@step("wait", "compare_set", "get")
def wait_woken_by_compare_set_creating(s):
    woken_wait(s, ["k"], [("compare_set", lambda c: c.compare_set(s.k("k"), "", "v"))])


@step("wait", "compare_set", "get")
def wait_on_compare_set_not_creating(s):
    woken_wait(s, ["k"], [("compare_set", lambda c: c.compare_set(s.k("k"), "x", "y"))])


@step("wait", "set", "get")
def wait_two_keys(s):
    woken_wait(
        s,
        ["a", "b"],
        [("set a", lambda c: c.set(s.k("a"), "1")), ("set b", lambda c: c.set(s.k("b"), "2"))],
    )


@step("wait", "set", "get")
def wait_repeated_key(s):
    woken_wait(s, ["a", "a"], [("set", lambda c: c.set(s.k("a"), "1"))])


@step("wait", "delete_key", "set", "get")
def wait_not_woken_by_delete(s):
    woken_wait(
        s,
        ["k"],
        [("delete_key", lambda c: c.delete_key(s.k("k"))), ("set", lambda c: c.set(s.k("k"), "v"))],
    )


def released(s, label, blocking, trigger_label, trigger):
    """`blocking(client)` runs in the background, is observed blocked, and `trigger(client)`
    on another client releases it. Returns the blocked call's client."""
    blocked, other = s.client(), s.client()
    call = Background(lambda: blocking(blocked))
    s.blocked("blocked", call)
    s.trigger(trigger_label, lambda: trigger(other))
    s.finish(label, call)
    return blocked


@step("get", "set")
def get_woken_by_set(s):
    released(s, "get", lambda c: c.get(s.k("k")), "set", lambda c: c.set(s.k("k"), "v"))


# --- queues ---------------------------------------------------------------------------------


@step("queue_push", "queue_pop", "queue_len")
def queue(s):
    c = s.client()
    s.call("len missing", lambda: c.queue_len(s.k("q")))
    s.call("pop empty, no block", lambda: c.queue_pop(s.k("q"), False))
    s.call("push a", lambda: c.queue_push(s.k("q"), "a"))
    s.call("push b", lambda: c.queue_push(s.k("q"), b"b\x00"))
    s.call("len", lambda: c.queue_len(s.k("q")))
    s.call("pop", lambda: c.queue_pop(s.k("q")))
    s.call("pop, no block", lambda: c.queue_pop(s.k("q"), block=False))
    s.call("len emptied", lambda: c.queue_len(s.k("q")))


@step("queue_pop")
def queue_pop_timeout(s):
    s.call("pop empty", lambda c=s.client(): c.queue_pop(s.k("q")))


@step("queue_push", "check", "wait", "get", "num_keys", "delete_key", "queue_len")
def queue_is_no_key(s):
    c = s.client()
    before = c.num_keys()
    s.call("push", lambda c=s.client(): c.queue_push(s.k("q"), "a"))
    s.call("check", lambda: c.check([s.k("q")]))
    s.call("wait", lambda: c.wait([s.k("q")]))
    s.call("get", lambda: c.get(s.k("q")))
    s.call("keys added", lambda: c.num_keys() - before)
    s.call("delete_key", lambda: c.delete_key(s.k("q")))
    s.call("len", lambda c=s.client(): c.queue_len(s.k("q")))


@step("queue_push", "queue_pop")
def queue_pop_woken_by_push(s):
    released(
        s, "pop", lambda c: c.queue_pop(s.k("q")), "push", lambda c: c.queue_push(s.k("q"), "v")
    )


@step("queue_push", "queue_pop", "queue_len")
def queue_push_wakes_one(s):
    poppers, other = [s.client(), s.client()], s.client()
    calls = [Background(lambda c=c: c.queue_pop(s.k("q"))) for c in poppers]
    s.blocked("blocked", *calls)
    s.trigger("push", lambda: other.queue_push(s.k("q"), "v"))
    for call in calls:
        call.thread.join(s.run.timeout_s + FINISH_GRACE_S)
    # Which popper wins is the server's choice: record the outcomes in a fixed order.
    outcomes = sorted(
        (json.dumps(c.done[:2]), c.done[3] - s.triggered_at < IMMEDIATE_S) for c in calls if c.done
    )
    s.record("pops (outcome, returned at once)", outcomes, None, "immediate")
    s.call("len", lambda: other.queue_len(s.k("q")))


# --- barrier --------------------------------------------------------------------------------


@step("barrier", "get")
def barrier_alone(s):
    c = s.client()
    s.call("world 1", lambda: c.barrier(s.k("b"), 1))
    s.call("get", lambda: c.get(s.k("b")))
    s.call("world 1 again", lambda: c.barrier(s.k("b"), 1, td(s.run.timeout_s)))
    s.call("get again", lambda: c.get(s.k("b")))
    s.call("world 0", lambda: c.barrier(s.k("z"), 0))
    s.call("world -1", lambda: c.barrier(s.k("n"), -1))


@step("barrier", "get")
def barrier_meets(s):
    """World 3: two wait (the second arrival does not release the first), the third releases."""
    first, second, third = s.client(), s.client(), s.client()
    a = Background(lambda: first.barrier(s.k("b"), 3))
    s.blocked("first blocked", a)
    b = Background(lambda: second.barrier(s.k("b"), 3, td(s.run.timeout_s)))
    s.blocked("both blocked", a, b)
    s.trigger("third", lambda: third.barrier(s.k("b"), 3))
    s.finish("first", a)
    s.finish("second", b)
    s.call("get", lambda: third.get(s.k("b")))
    s.call("fourth", lambda: third.barrier(s.k("b"), 3))


@step("barrier", "get")
def barrier_timeout(s):
    c = s.client()
    s.call("barrier", lambda: c.barrier(s.k("b"), 2, td(s.run.timeout_s)))
    s.call("same client get", lambda: c.get(s.k("b")))
    s.call("second arrival", lambda c=s.client(): c.barrier(s.k("b"), 2))


@step("barrier")
def barrier_default_timeout(s):
    s.call("barrier", lambda c=s.client(): c.barrier(s.k("b"), 2))


@step("barrier", "set", "get")
def barrier_woken_by_set(s):
    waiter = released(
        s, "barrier", lambda c: c.barrier(s.k("b"), 3), "set", lambda c: c.set(s.k("b"), "7")
    )
    s.call("get", lambda: waiter.get(s.k("b")))


@step("barrier", "wait", "get")
def wait_on_barrier_key(s):
    """A WAIT on the barrier's key, which the first arrival creates and the last completes."""
    first = s.client()
    woken_wait(
        s,
        ["b"],
        [
            ("first arrival", lambda c: first.barrier(s.k("b"), 2, td(0.1))),
            ("last arrival", lambda c: c.barrier(s.k("b"), 2)),
        ],
    )


@step("set", "barrier", "get")
def barrier_on_text(s):
    for name, text, world in (("suffix", "12abc", 13), ("word", "abc", 1)):
        c = s.client()
        s.call(f"set {name}", lambda: c.set(s.k(name), text))
        s.call(f"barrier {name}", lambda: c.barrier(s.k(name), world))
        s.call(f"get {name}", lambda c=s.client(): c.get(s.k(name)))


# --- arguments the client refuses -----------------------------------------------------------

BAD_ARGUMENTS = {
    "set": [lambda c: c.set(1, "x"), lambda c: c.set("k", None), lambda c: c.set("k")],
    "get": [lambda c: c.get(None), lambda c: c.get(b"k")],
    "add": [lambda c: c.add("k", "1"), lambda c: c.add("k", 2**63), lambda c: c.add("k", 1.5)],
    "compare_set": [lambda c: c.compare_set("k", 1, "x"), lambda c: c.compare_set("k", "x")],
    "check": [lambda c: c.check("k"), lambda c: c.check([1])],
    "wait": [lambda c: c.wait("k"), lambda c: c.wait(["k"], 5), lambda c: c.wait([None])],
    "delete_key": [lambda c: c.delete_key(None)],
    "num_keys": [lambda c: c.num_keys(1)],
    "append": [lambda c: c.append("k", 1)],
    "multi_get": [lambda c: c.multi_get("k"), lambda c: c.multi_get([1])],
    "multi_set": [lambda c: c.multi_set(["a", "b"], ["1"]), lambda c: c.multi_set("ab", "12")],
    "queue_push": [lambda c: c.queue_push("q", 1)],
    "queue_pop": [lambda c: c.queue_pop(1)],
    "queue_len": [lambda c: c.queue_len(None)],
    "list_keys": [lambda c: c.list_keys("k")],
    "barrier": [lambda c: c.barrier("b", "2"), lambda c: c.barrier("b")],
    "set_timeout": [lambda c: c.set_timeout(5)],
}


def bad_arguments(op):
    def body(s):
        c = s.client()
        for i, call in enumerate(BAD_ARGUMENTS[op]):
            s.call(f"{op} #{i}", lambda: call(c))
        s.call("client still usable", lambda: c.num_keys() >= 0)

    return body


for _op in BAD_ARGUMENTS:
    STEPS.append((f"bad_arguments_{_op}", [_op, "num_keys"], bad_arguments(_op)))


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    ports = [int(p) for p in sys.argv[2].split(",")]
    runs = [Run(sys.argv[1], port, sys.argv[3] == "1", float(sys.argv[4])) for port in ports]

    failed = []

    def share(i):
        try:
            for name, ops, body in STEPS[i :: len(runs)]:
                runs[i].run(name, ops, body)
        except BaseException:
            failed.append(i)  # a sequence cut short fails, as it did on the main thread
            raise

    threads = [threading.Thread(target=share, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        sys.exit(f"store_sequence: the steps of server(s) {failed} stopped on an error")


if __name__ == "__main__":
    main()
