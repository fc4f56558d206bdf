"""rdzv_bench.py's report: the tables of (a) (rendezvous; --control and --metrics, on/off) and
(c) (recovery), printed from the runs' figures.
"""

import statistics

from rdzv_processes import rendezvous_timeout


def describe(outcome, cap_s):
    if outcome.seconds is not None:
        return f"{outcome.seconds * 1e3:.0f} ms"
    if outcome.why == "cap":
        return f"did not recover within {cap_s:.0f} s"
    return f"did not recover: {outcome.why}"


def median(values):
    return statistics.median(values) if values else None


def ms(value):
    return "-" if value is None else f"{value * 1e3:.0f}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return "n/a"
    return f"{numerator / denominator:.1f}"


def ratio_pairs(tools):
    """The (numerator, denominator) variant names worth a ratio: each torchrun variant over
    dlrun on the same kind of backend (torchrun-etcd-v2 over dlrun-etcd), and
    dlrun-etcd/dlrun-c10d."""
    names = [t.name for t in tools]
    pairs = []
    for tool in tools:
        same = "dlrun-" + ("c10d" if tool.backend == "c10d" else "etcd")
        if tool.launcher == "torchrun" and same in names:
            pairs.append((tool.name, same))
    if "dlrun-etcd" in names and "dlrun-c10d" in names:
        pairs.append(("dlrun-etcd", "dlrun-c10d"))
    return pairs


def report_rendezvous(tools, ks, times, failed, short):
    names = [t.name for t in tools]
    pairs = ratio_pairs(tools)
    print(
        "(a) rendezvous: launch of the first of K agents to the last worker's start, "
        "median ms (runs)"
    )
    header = "%-4s" + " %16s" * len(names) + " %27s" * len(pairs)
    print(header % ("K", *names, *(f"{a}/{b}" for a, b in pairs)))
    for k in ks:
        cells, value = [], {}  # value: name -> (median or the cap, whether it is the cap)
        for name in names:
            key = (name, k)
            if key in failed and failed[key].startswith("timed out"):
                cells.append(f"> {rendezvous_timeout(k) * 1e3:.0f}")
                value[name] = (rendezvous_timeout(k), True)
            elif key in failed:
                cells.append("failed")
            else:
                cells.append(f"{ms(median(times[key]))} ({len(times[key])})")
                value[name] = (median(times[key]), False)
        for a, b in pairs:
            (num, capped), (den, _) = value.get(a, (None, False)), value.get(b, (None, False))
            cells.append(("> " if capped else "") + ratio(num, den))
        print(header % (k, *cells))
    print_shortfalls(failed, short)


def print_shortfalls(failed, short):
    """The runs of (a) that failed, and the variants the budget cut short."""
    for (name, k), why in sorted(failed.items(), key=lambda item: (item[0][1], item[0][0])):
        print(f"  K={k}, {name}: failed: {why}")
    if short:
        print(
            "  the time budget ran out first: fewer runs (or none, -) for "
            + ", ".join(f"{name} K={k}" for name, k in sorted(short, key=lambda x: x[1]))
        )


# --control and --metrics: each run's figures, (heading, its second line, format, the value of
# a run of K agents, see rendezvous_run).
FIGURES = (
    ("rdzv", "ms", "{:.0f}", lambda run, k: run["rdzv"] * 1e3),
    ("job", "ms", "{:.0f}", lambda run, k: run["job"] * 1e3),
    ("req/agent", "start", "{:.1f}", lambda run, k: run["start"]["requests"] / k),
    ("req/agent", "job", "{:.1f}", lambda run, k: run["total"]["requests"] / k),
    ("conn/agent", "job", "{:.2f}", lambda run, k: run["total"]["connections"] / k),
    (
        "store req/s",
        "start",
        "{:.0f}",
        lambda run, k: run["start"]["requests"] / (run["start"]["time"] - run["t0"]),
    ),
    ("agent CPU", "ms/agent", "{:.1f}", lambda run, k: run["agents_cpu"] * 1e3 / k),
    ("agent CPU", "ms/s/agent", "{:.1f}", lambda run, k: run["agents_cpu"] * 1e3 / k / run["job"]),
    ("store CPU", "us/agent", "{:.0f}", lambda run, k: run["store_cpu"] * 1e6 / k),
    (
        "store CPU",
        "us/req",
        "{:.2f}",
        lambda run, k: run["store_cpu"] * 1e6 / run["total"]["requests"],
    ),
    ("http", "req/run", "{:.0f}", lambda run, k: run["watched"]),
)
# The figures whose run-by-run on/off ratio is printed.
PAIRED = (
    "rdzv ms",
    "agent CPU ms/agent",
    "agent CPU ms/s/agent",
    "store req/s start",
    "store CPU us/req",
)


def report_onoff(tools, ks, failed, short, store):
    """--control's or --metrics's table: per K and variant, medians of FIGURES, then on/off;
    the run-by-run on/off ratios of PAIRED; and the requests per agent by op."""
    feature = tools[0].feature
    figures = [f for f in FIGURES if feature == "metrics" or f[0] != "http"]  # only it watches
    print(
        f"(a) rendezvous, {feature} on and off: K dlrun-c10d agents on a dlrund --stats of "
        "their own per run"
    )
    if feature == "control":
        print("    (off: dlrun --no-control-plane, dlrund --no-control); medians over the runs.")
    else:
        print(
            "    (on: dlrun and dlrund --metrics-port=0, each scraped (/metrics) and polled "
            "(/api/state)"
        )
        print(
            "    once a second from its first line on, as Prometheus and an open page do; "
            "'http': those"
        )
        print("    requests answered); medians over the runs.")
    print("    'start': from the launch to dlrund's first snapshot after the last worker's start;")
    print("    'job': to every agent's exit.")
    header = "%-4s %-7s %4s" + " %11s" * len(figures)
    print(header % ("K", feature, "runs", *(name for name, _, _, _ in figures)))
    print(header % ("", "", "", *(unit for _, unit, _, _ in figures)))
    for k in ks:
        row = {}
        for tool in tools:
            key = (tool.name, k)
            runs = store[key]
            if key in failed or not runs:
                why = f"failed: {failed[key]}" if key in failed else "not run"
                print(f"{k:<4} {tool.setting:<7} {why}")
                continue
            row[tool.setting] = [
                median([value(run, k) for run in runs]) for _, _, _, value in figures
            ]
            print(
                header
                % (
                    k,
                    tool.setting,
                    len(runs),
                    *(form.format(v) for (_, _, form, _), v in zip(figures, row[tool.setting])),
                )
            )
        if "on" in row and "off" in row:
            print(
                header
                % (
                    k,
                    "on/off",
                    "",
                    *(f"{on / off:.3f}" if off else "-" for on, off in zip(row["on"], row["off"])),
                )
            )
    # Runs alternate, so the i-th runs of on and off ran side by side: their ratio cancels
    # most of the load that other work puts on the machine meanwhile.
    names = {tool.setting: tool.name for tool in tools}
    if "on" in names and "off" in names:
        print("  on/off run by run (the i-th of each, next to each other), median [middle half]:")
        for k in ks:
            pairs = list(zip(store[(names["on"], k)], store[(names["off"], k)]))
            if not pairs:
                continue
            cells = []
            for name, unit, _, value in figures:
                if f"{name} {unit}" in PAIRED:
                    ratios = sorted(value(on, k) / value(off, k) for on, off in pairs)
                    quarter = len(ratios) // 4
                    cells.append(
                        f"{name} {unit} {statistics.median(ratios):.3f} "
                        f"[{ratios[quarter]:.3f}-{ratios[len(ratios) - 1 - quarter]:.3f}]"
                    )
            print(f"    K={k} ({len(pairs)} pairs): " + "; ".join(cells))
    print("  requests per agent by op, medians (start | job):")
    for k in ks:
        for tool in tools:
            runs = store[(tool.name, k)]
            if not runs:
                continue
            ops = sorted(
                {op for run in runs for what in ("start", "total") for op in run[what]["ops"]}
            )
            cells = [
                f"{op} {median([r['start']['ops'].get(op, 0) / k for r in runs]):.1f}"
                f" | {median([r['total']['ops'].get(op, 0) / k for r in runs]):.1f}"
                for op in ops
            ]
            print(f"    K={k} {tool.setting}: " + ", ".join(cells))
    print_shortfalls(failed, short)


def report_recovery(tools, victims, results, failed, conf, cap_s):
    print(
        f"(c) recovery: 3 agents --nnodes=2:3 --max-restarts=3 --rdzv-conf={conf} "
        "(torch 1.13 takes whole seconds); one agent and its workers SIGKILLed;"
    )
    print("    time from the kill to the start of both survivors' new workers (WORLD_SIZE 2)")
    for kind in victims:
        print(
            f"  victim: {'the node of the workers store' if kind == 'store' else 'another node'}"
            f" ({kind})"
        )
        medians = {}
        for tool in tools:
            key = (kind, tool.name)
            if key in failed:
                print(f"    {tool.name}: failed: {failed[key]}")
                continue
            runs = results.get(key, [])
            recovered = [o.seconds for o in runs if o.seconds is not None]
            if not runs:
                print(f"    {tool.name}: not measured")
                continue
            if not recovered:
                print(f"    {tool.name}: {describe(runs[-1], cap_s)} ({len(runs)} runs)")
                if all(o.why == "cap" for o in runs):
                    medians[tool.name] = (cap_s, True)
            else:
                lost = [o for o in runs if o.seconds is None]
                note = f"; {len(lost)} did not recover: {describe(lost[-1], cap_s)}" if lost else ""
                medians[tool.name] = (median(recovered), False)
                print(
                    f"    {tool.name}: median {ms(median(recovered))} ms, "
                    f"{ms(min(recovered))}-{ms(max(recovered))} ({len(recovered)} runs{note})"
                )
            print(f"      victim: {runs[-1].victim}")
        for a, b in ratio_pairs(tools):
            if a in medians and b in medians and not medians[b][1]:
                (num, capped), (den, _) = medians[a], medians[b]
                print(f"    {a}/{b}: {'at least ' if capped else ''}{ratio(num, den)}")
