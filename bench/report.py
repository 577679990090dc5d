"""Print the benchmarks' latest results as Markdown; keep the docs' tables in step.

    python bench/report.py              # every bench/results/latest/<name>.json
    python bench/report.py peers board  # these benchmarks only
    python bench/report.py --docs       # rewrite the docs' marked tables
    python bench/report.py --check      # exit 1 when a marked table is stale

A page of docs/ (or README.md) quotes a result between two markers:

    <!-- bench:peers -->
    (the table: command, date, machine, results)
    <!-- /bench:peers -->

``--docs`` replaces the text between every pair with the table of that
benchmark's result file; ``--check`` exits non-zero when a marked table differs
from its result file, when a marker names a benchmark whose result file is
missing, or names no benchmark at all. With ``--committed``, only result files
that git tracks count, and a marker whose file is not committed yet is skipped
(the test suite checks so). A result from a ``--quick`` run is labelled
"(quick)": a smoke run, not a measurement.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT
LATEST = ROOT / "bench" / "results" / "latest"
NAMES = (
    "store_vs_sql",
    "claim_latency",
    "peers",
    "waiting_agents",
    "doorbell_latency",
    "failover_cost",
    "board",
    "worker_runtime",
    "admission_run",
    "admission_run_ha",
    "admission",
    "schedule_lateness",
    "tracing",
    "budgets",
)
# Result files a script writes beside its own: the name, and the run that does.
ALSO_WRITTEN = {"admission_run_ha": "admission_run.py --ha"}
MARKER = re.compile(
    r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)",
    re.DOTALL,
)
OPENING = re.compile(r"<!-- bench:([\w-]+) -->")


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def p50_p99(summary):
    return f"{summary['p50']:.2f} / {summary['p99']:.2f}"


# --- One renderer per benchmark -------------------------------------------------


# The peers table's CPU columns: a column no row has a figure for is left out
# (result files from before PostgreSQL's CPU was measured).
PEERS_CPU = (
    ("client CPU", "client_cpu_ms_per_todo"),
    ("server CPU", "server_cpu_ms_per_todo"),
    ("PostgreSQL CPU", "postgres_cpu_ms_per_todo"),
)


def peers(data):
    results = data["results"]
    median = results["median"]
    labels = {name: row["label"] for name, row in median.items()}
    cpu = [
        (header, key)
        for header, key in PEERS_CPU
        if any(row.get(key) is not None for row in median.values())
    ]
    rows = [
        [
            row["label"],
            row["rate"],
            f"{ratio(row['ratio'])} {labels.get(row['peer'], '')}".strip()
            if row["ratio"] is not None
            else "",
            *(row.get(key) for _, key in cpu),
        ]
        for row in median.values()
    ]
    reps = results["reps"]
    loads = ", ".join(
        f"{rep['load_before'][0]:.1f}→{rep['load_after'][0]:.1f}" for rep in reps
    )
    params = data["parameters"]
    budgets = [
        f"{row['label']}: {budget_sentence(row['server_budget_ms_per_todo'])}."
        for row in median.values()
        if row.get("server_budget_ms_per_todo") is not None
    ]
    parts = [
        f"{params['workers']} workers, {params['seconds']:g} s per path, median "
        f"of {len(reps)} rep(s) (load average per rep: {loads}); a single path's "
        "todo is a claim+complete pair; CPU is per todo, in ms.",
        table(["path", "todos/s", "vs peer", *(header for header, _ in cpu)], rows),
    ]
    if budgets:
        parts.append(
            "At each target's rate, what is left of the machine for the server: "
            + " ".join(budgets)
        )
    floors = results.get("floors")
    if floors:
        slice_seconds = params.get("slice", 0.5)
        parts.append(
            "Beside the floor: each served path and its HTTP floor (the store's "
            f"SQL) took turns of {slice_seconds:g} s in the same worker processes, "
            "so both ran under the same load on the machine; the served path's "
            "todos/s over the floor's, the median over the reps and each rep's."
        )
        parts.append(
            table(
                ["path", "floor", "vs floor", "reps"],
                [
                    [
                        row["label"],
                        labels.get(row["floor"], row["floor"]),
                        ratio(row["ratio"]),
                        ", ".join(f"{value:.2f}" for value in row["reps"]),
                    ]
                    for row in floors.values()
                ],
            )
        )
    return "\n\n".join(parts)


def budget_sentence(budget):
    """Say what a server budget (peers.server_budget, ms of CPU per todo) leaves."""
    if budget <= 0:
        return (
            "nothing (its clients and PostgreSQL alone would need more CPU than "
            "the machine has)"
        )
    return f"{budget:.2f} ms of CPU per todo"


def store_vs_sql(data):
    results = data["results"]
    moves = table(
        [
            "workers",
            "plain SQL todos/s",
            "store todos/s",
            "store batch 10 todos/s",
            "store/plain",
            "claim p50 / p99 ms plain",
            "claim p50 / p99 ms store",
        ],
        [
            [
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                run["store10"]["rate"],
                ratio(run["store_over_plain"]),
                p50_p99(run["plain"]["latency_ms"]["claim"]),
                p50_p99(run["store"]["latency_ms"]["claim"]),
            ]
            for run in results["claim_complete"]
        ],
    )
    made = table(
        [
            "create",
            "workers",
            "plain SQL creates/s",
            "store creates/s",
            "store/plain",
            "create p50 / p99 ms store",
        ],
        [
            [
                run["workload"],
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                ratio(run["store_over_plain"]),
                p50_p99(run["store"]["latency_ms"]["create"]),
            ]
            for run in results["create"]
        ],
    )
    return "Claim+complete:\n\n" + moves + "\n\nCreate:\n\n" + made


def claim_latency(data):
    parts = []
    for name, case in data["results"]["cases"].items():
        if name == "other_queue":
            parts.append(
                f"Beside {case['pending_in_other_queue']:,} pending todos in another "
                "queue (ms):\n\n"
                + table(
                    ["claim", "p50 / p99 alone", "p50 / p99 beside", "p50 ratio"],
                    [
                        [
                            label,
                            p50_p99(f["empty"]),
                            p50_p99(f["beside"]),
                            ratio(f["beside_over_empty"].get("p50")),
                        ]
                        for label, f in case["claims"].items()
                    ],
                )
            )
            continue
        beside = ", ".join(
            f"{case[key]:,} {label}"
            for key, label in (
                ("terminal_rows", "terminal rows"),
                ("held", "held"),
                ("canceled", "cancelled"),
            )
            if case[key]
        )
        parts.append(
            f"Beside {beside} (ms):\n\n"
            + table(
                ["path", "p50 / p99 alone", "p50 / p99 beside", "p50 ratio", "buffers"],
                [
                    [
                        mode,
                        p50_p99(case["empty"][mode]),
                        p50_p99(case["beside"][mode]),
                        ratio(case["beside_over_empty"][mode]["p50"]),
                        f"{case['empty']['plan']['buffers']} / "
                        f"{case['beside']['plan']['buffers']}",
                    ]
                    for mode in ("plain", "store")
                ],
            )
        )
    return "\n\n".join(parts)


def waiting_agents(data):
    results, params = data["results"], data["parameters"]
    rows = []
    for kind in ("create", "overview", "healthz", "wake"):
        if kind in results["idle"]:
            rows.append(
                [
                    f"{kind} p50 / p99 ms (failed)",
                    *(
                        f"{results[w][kind]['p50_ms']} / {results[w][kind]['p99_ms']}"
                        f" ({results[w][kind]['failed']})"
                        for w in ("idle", "loaded")
                    ),
                ]
            )
    rows.append(
        ["PostgreSQL connections (max)"]
        + [results[w]["pg_connections_max"] for w in ("idle", "loaded")]
    )
    rows.append(
        [
            "server worker threads",
            results.get("worker_threads_idle"),
            results.get("worker_threads_loaded"),
        ]
    )
    late = results.get("waiters_after", {})
    if "polls_late_n" in late:
        rows.append(
            [
                f"long polls past their deadline p50 / p99 / max ms"
                f" ({late['polls_late_n']:,})",
                "",
                f"{late['polls_late_p50_ms']} / {late['polls_late_p99_ms']}"
                f" / {late['polls_late_max_ms']}",
            ]
        )
    opened = results["waiters_open"]
    waiters = (
        f"{opened.get('polls_waiting', 0):,}/{params['long_polls']:,} long polls, "
        f"{opened.get('sse_open', 0):,}/{params['sse']:,} event streams, "
        f"{opened.get('mcp_open', 0):,}/{params['mcp']:,} MCP GET streams, "
        f"{opened.get('mcp_claims_waiting', 0):,}/{params['mcp_claims']:,} waiting "
        f"MCP claim_next, {opened.get('mcp_listen', 0):,}/{params['mcp_listen']:,} "
        "MCP listen streams"
    )
    return (
        f"Waiters open: {waiters}; {params['seconds']:g} s per measurement.\n\n"
        + table(["figure", "no waiters", "waiters"], rows)
    )


def doorbell_latency(data):
    results = data["results"]
    rows = [
        ["the store's create SQL → a bare LISTEN connection (baseline)", "listen"],
        ["POST /api/v1/todos → the waiting POST /api/v1/todos/claim returns", "http"],
        ["(the POST /api/v1/todos request alone)", "create"],
    ]
    return table(
        ["path", "p50 ms", "p99 ms", "mean ms"],
        [
            [label, results[key]["p50"], results[key]["p99"], results[key]["mean"]]
            for label, key in rows
        ],
    )


def failover_cost(data):
    return table(
        [
            "workers",
            "single todos/s",
            "pair todos/s",
            "pair, local commit todos/s",
            "pair/single",
            "complete p50 / p99 ms single",
            "complete p50 / p99 ms pair",
        ],
        [
            [
                run["workers"],
                run["single"]["rate"],
                run["pair"]["rate"],
                run["pair-local"]["rate"],
                ratio(run["pair_over_single"]),
                p50_p99(run["single"]["latency_ms"]["complete"]),
                p50_p99(run["pair"]["latency_ms"]["complete"]),
            ]
            for run in data["results"]["runs"]
        ],
    )


def board(data):
    results, params = data["results"], data["parameters"]
    pages = table(
        ["page", "median ms", "p95 ms"],
        [[p["page"], p["median_ms"], p["p95_ms"]] for p in results["pages"]],
    )
    baselines = table(
        ["naive query (baseline)", "median ms", "p95 ms"],
        [[b["query"], b["median_ms"], b["p95_ms"]] for b in results["baselines"]],
    )
    return (
        f"Over {params['todos']:,} todos and {params['history']:,} history rows, "
        f"{params['rounds']} renders per page:\n\n{pages}\n\n{baselines}"
    )


def worker_runtime(data):
    results = data["results"]
    reps = results["reps"]
    loads = ", ".join(
        f"{rep['load_before'][0]:.1f}→{rep['load_after'][0]:.1f}" for rep in reps
    )
    params = data["parameters"]
    rows = [
        [name, row["rate"], ratio(row["ratio"]), row["client_cpu_ms_per_todo"]]
        for name, row in results["median"].items()
    ]
    return (
        f"{params['workers']} processes, {params['seconds']:g} s per path, median "
        f"of {len(reps)} rep(s) (load average per rep: {loads}); the target is "
        f"{params['target_ratio']}× the hand-written loop.\n\n"
        + table(["path", "todos/s", "vs http", "client CPU ms/todo"], rows)
    )


def admission_run_rows(results):
    """The figures of an admission run, plain or across a failover."""
    served = []
    if results.get("app_servers"):
        served = [
            ["app servers", results["app_servers"]],
            [
                "workers through them / on the store",
                f"{results['workers_served']} / {results['workers_on_store']}",
            ],
            ["HTTP requests", results["http_requests"]],
        ]
    return [
        ["store and API calls", results["operations"]],
        *served,
        ["claim calls", results["claim_calls"]],
        ["todos claimed", results["todos_claimed"]],
        ["leases lapsed and reaped", results["reaped"]],
        ["retries requeued", results["retries_requeued"]],
        ["limit changes while running", results["setting_changes"]],
        ["history rows replayed", results["events_replayed"]],
        ["claims checked against a group limit", results["claims_checked"]],
        ["claims checked against a rate window", results["rate_claims_checked"]],
        ["errors", results["errors"]],
        ["**violations**", results["violations"]],
    ]


def admission_run(data):
    results = data["results"]
    params = data["parameters"]
    return (
        f"{params['processes']} worker processes, a reaper and a settings changer, "
        f"{params['groups']} groups, {results['seconds']:g} s:\n\n"
        + table(["figure", "value"], admission_run_rows(results))
    )


def admission_run_ha(data):
    results = data["results"]
    params = data["parameters"]
    rows = admission_run_rows(results)
    rows.insert(-2, ["calls retried through the outage", results["outage_retries"]])
    return (
        f"{params['processes']} worker processes, a reaper and a settings changer, "
        f"{params['groups']} groups, {results['seconds']:g} s; the primary "
        f"({results['primary_killed']}) killed {params['kill_after']:g} s in, a new "
        f"primary {results['new_primary_after_seconds']:g} s later:\n\n"
        + table(["figure", "value"], rows)
    )


def admission(data):
    results = data["results"]
    params = data["parameters"]
    fair = results["fairness"]
    weights = fair["weights"]
    waits = fair["small_p95_wait_ms"]
    deep = results["deep"]
    aging = results["aging"]
    rows = [
        [
            f"small group's p95 wait, {params['flood']:,} todos of another group "
            "ahead / alone",
            f"{ratio(fair['flood_over_alone'])} ({waits['flood']:.1f} / "
            f"{waits['alone']:.1f} ms)",
            "≤ 2×",
        ],
        [
            "claims of weight 3 / weight 1",
            f"{ratio(weights['ratio'])} ({weights['weight_3']} / "
            f"{weights['weight_1']})",
            "3× ± 10%",
        ],
    ]
    for name, label in (("cheap_store", "store"), ("cheap_http", "HTTP")):
        run = results[name]
        reps = run.get("reps", [])
        spread = f"; reps {', '.join(ratio(r) for r in reps)}" if len(reps) > 1 else ""
        rows.append(
            [
                f"{label} claim+complete, every control / none (todos/s)",
                f"{ratio(run['all_over_none'])} ({run['all']['rate']:,.0f} / "
                f"{run['none']['rate']:,.0f}{spread})",
                "≥ 0.85×",
            ]
        )
    rows += [
        [
            f"claim p50, {params['deep']:,} pending over {params['deep_groups']:,} "
            f"groups ({deep['groups_at_limit']:,} at their limit) / one todo",
            f"{ratio(deep['deep_over_shallow_p50'])} "
            f"({deep['deep_claim_ms']['p50']:.2f} / "
            f"{deep['shallow_claim_ms']['p50']:.2f} ms)",
            "≤ 1.2×",
        ],
        [
            f"a level-1 todo behind {params['behind']:,} level-3 is claimed next",
            str(results["priority"]["urgent_claimed_next"]),
            "True",
        ],
        [
            f"a level-5 todo under level-1 work, aging {aging['aging_seconds']} s",
            f"claimed after {cell(aging['level_5_claimed_after_seconds'])} s "
            f"(bound {aging['bound_seconds']} s)",
            "within the bound",
        ],
    ]
    return (
        f"{params['workers']} processes for the cheapness runs, "
        f"{params['seconds']:g} s each, turns of {params['slice']:g} s, "
        f"{params.get('reps', 1)} rep(s) (the median rep's figures); "
        f"{params['groups']:,} groups in the controlled queue.\n\n"
        + table(["figure", "value", "target"], rows)
    )


def tracing(data):
    results = data["results"]
    params = data["parameters"]
    median = results["median"]
    targets = results["targets"]
    rows = []
    for path, label in (("http", "HTTP"), ("store", "store")):
        for phase, what in (
            ("create", "create p50 (ms)"),
            ("drain", "claim+complete todos/s"),
        ):
            row = median[f"{path}_{phase}"]
            each = row.get("reps", {})
            rows.append(
                [
                    f"{label} {what}",
                    *(row["figures"][mode] for mode in ("on", "off", "bare")),
                    f"{row['slowdown']['on']:+.1%}",
                    f"{row['slowdown']['off']:+.1%}",
                    ", ".join(f"{value:+.0%}" for value in each.get("on", [])),
                ]
            )
    loads = ", ".join(
        f"{rep['load_before'][0]:.1f}→{rep['load_after'][0]:.1f}"
        for rep in results["reps"]
    )
    spans = results["spans_received"]
    received = ", ".join(f"{spans.get(kind, 0):,} {kind}" for kind in spans)
    return (
        f"{params['workers']} processes, {params['seconds']:g} s a phase, turns of "
        f"{params['slice']:g} s, median of {len(results['reps'])} rep(s) (load "
        f"average per rep: {loads}). Slower than bare: a create's p50 over bare's, "
        f"bare's todos/s over the mode's, in each rep (its modes took turns under "
        f"the same load), then the median over the reps; the targets are on ≤ "
        f"+{targets['on']:.0%}, off ≤ +{targets['off']:.0%}. The receiver got "
        f"{received} spans, decoding them in "
        f"{results['receiver_cpu_seconds']:.1f} CPU s.\n\n"
        + table(
            ["figure", "on", "off", "bare", "on vs bare", "off vs bare", "on: reps"],
            rows,
        )
    )


def cpu_share(results):
    share = results.get("machine_cpu") or {}
    if not share:
        return ""
    return (
        f" The machine's CPUs while it ran: {share['busy_pct']}% busy, "
        f"{share['steal_pct']}% stolen."
    )


def schedule_lateness(data):
    results = data["results"]
    params = data["parameters"]
    late = results["lateness_seconds"]
    interval = results["sweep_interval_seconds"]
    rows = [
        [
            "slots fired / expected",
            f"{results['slots_fired']:,} / {results['slots_expected']:,}",
            "all",
        ],
        ["slots missing", results["slots_missing"], 0],
        ["slots doubled", results["slots_doubled"], 0],
        ["lateness p50 (s)", late["p50"], ""],
        ["lateness p95 (s)", late["p95"], ""],
        ["lateness p99 (s)", late["p99"], f"≤ {results['target_p99_seconds']}"],
        ["lateness max (s)", late["max"], ""],
    ]
    return (
        f"{params['schedules']:,} schedules over {params['endpoints']} endpoints "
        f"and {params['queues']} queues each, all due each minute; "
        f"{results['slots_expected'] // max(params['schedules'], 1)} slot(s) a "
        "schedule; `manage.py sweep --loop` at its "
        f"default interval, {interval} s.{cpu_share(results)}\n\n"
        + table(["figure", "value", "target"], rows)
    )


def budgets(data):
    results = data["results"]
    params = data["parameters"]
    rows = [
        [
            "claim+complete with usage, budgets that never bind / no budget (todos/s)",
            f"{ratio(results['budget_over_none'])} "
            f"({results['budget']['rate']:,.0f} / {results['none']['rate']:,.0f})",
            "≥ 0.9×",
        ],
        [
            "claim+complete with usage / without (todos/s)",
            f"{ratio(results['none_over_plain'])} "
            f"({results['none']['rate']:,.0f} / {results['plain']['rate']:,.0f})",
            "",
        ],
    ]
    return (
        f"{params['workers']} processes, {params['seconds']:g} s, turns of "
        f"{params['slice']:g} s, {params['todos']:,} pending todos per mode; "
        "the budgets: one of the endpoint, one of the queue.\n\n"
        + table(["figure", "value", "target"], rows)
    )


RENDERERS = {
    "store_vs_sql": store_vs_sql,
    "claim_latency": claim_latency,
    "peers": peers,
    "waiting_agents": waiting_agents,
    "doorbell_latency": doorbell_latency,
    "failover_cost": failover_cost,
    "board": board,
    "worker_runtime": worker_runtime,
    "admission_run": admission_run,
    "admission_run_ha": admission_run_ha,
    "admission": admission,
    "schedule_lateness": schedule_lateness,
    "tracing": tracing,
    "budgets": budgets,
}


def machine(info):
    return (
        f"{info['cores']} cores, {info['memory_gib']} GiB, Linux {info['kernel']}, "
        f"PostgreSQL {info['postgresql']} (fsync {info['fsync']}), "
        f"Python {info['python']}"
    )


def render(data):
    """The Markdown of one result file: command, date, machine, then results."""
    load = data["load_average"]
    quick = (
        "**(quick)** a smoke run at tiny sizes, not a measurement.\n\n"
        if data.get("quick")
        else ""
    )
    head = (
        f"{quick}Command: `{data['command']}`; {data['date']}; "
        f"{machine(data['machine'])}; load average {load['before'][0]:.2f} before, "
        f"{load['after'][0]:.2f} after."
    )
    return head + "\n\n" + RENDERERS[data["name"]](data)


# --- Files ----------------------------------------------------------------------


def committed_results():
    """The result files git tracks."""
    listed = subprocess.run(
        ["git", "ls-files", "bench/results/latest"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {Path(path).stem for path in listed}


def load(name, committed=None):
    """The result file of ``name``, or None when it is missing (or, with
    ``committed``, not tracked by git)."""
    path = LATEST / f"{name}.json"
    if not path.exists() or (committed is not None and name not in committed):
        return None
    return json.loads(path.read_text())


def doc_pages():
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def sync_docs(write, committed_only):
    """Compare (and with ``write`` rewrite) every marked table; return problems."""
    committed = committed_results() if committed_only else None
    problems = []
    for page in doc_pages():
        text = page.read_text()
        where = page.relative_to(ROOT)
        for name in OPENING.findall(text):
            if name not in RENDERERS:
                problems.append(f"{where}: marker bench:{name} names no benchmark")
        closed = {match["name"] for match in MARKER.finditer(text)}
        for name in set(OPENING.findall(text)) - closed:
            problems.append(f"{where}: bench:{name} has no closing marker")

        def replace(match, where=where):
            name = match["name"]
            if name not in RENDERERS:
                return match[0]
            data = load(name, committed)
            if data is None:
                if not committed_only:
                    problems.append(f"{where}: no result file for bench:{name}")
                return match[0]
            body = render(data) + "\n"
            if match["body"].strip() != body.strip():
                if not write:
                    problems.append(f"{where}: bench:{name} differs from its file")
                return match[1] + "\n" + body + "\n" + match[4]
            return match[0]

        updated = MARKER.sub(replace, text)
        if write and updated != text:
            page.write_text(updated)
            print(f"rewrote {where}")
    return problems


def main():
    parse = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parse.add_argument("names", nargs="*", help=f"of: {', '.join(NAMES)}")
    parse.add_argument("--docs", action="store_true", help="rewrite marked tables")
    parse.add_argument("--check", action="store_true", help="fail on a stale table")
    parse.add_argument(
        "--committed",
        action="store_true",
        help="only result files git tracks count; skip markers of the others",
    )
    args = parse.parse_args()
    unknown = [name for name in args.names if name not in RENDERERS]
    if unknown:
        parse.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(NAMES)}")
    if args.docs or args.check:
        problems = sync_docs(write=args.docs, committed_only=args.committed)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for name in args.names or NAMES:
        data = load(name)
        if data is None:
            run = ALSO_WRITTEN.get(name, f"{name}.py")
            print(f"### {name}\n\n(no result file: run `python bench/{run}`)\n")
            continue
        print(f"### {name}{' (quick)' if data.get('quick') else ''}\n")
        print(render(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
