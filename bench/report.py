"""Print the latest result of each benchmark as Markdown tables.

    python bench/report.py            # the newest JSON of each benchmark
    python bench/report.py FILE ...   # these result files

docs/benchmarks.md quotes these tables; the JSON files stay in bench/results/.
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NAMES = (
    "peers",
    "store_throughput",
    "http_throughput",
    "claim_latency",
    "enqueue_throughput",
    "doorbell_latency",
    "profile_api",
)


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value):
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def cpu(figures, name):
    return f"{figures[name]:.2f}" if name in figures else "–"


PEER_LABELS = {
    "bare": "bare loop",
    "store": "store",
    "store10": "store batch 10",
    "http": "HTTP",
    "http10": "HTTP batch 10",
    "pgqueuer1": "pgqueuer batch 1",
    "pgqueuer10": "pgqueuer batch 10",
    "procrastinate": "procrastinate",
}


def load_range(run):
    """Return the lowest and highest load average seen during a run's samples."""
    samples = [item for reps in run["samples"].values() for item in reps]
    return (
        min(item["load"][0] for item in samples),
        max(item["load"][1] for item in samples),
    )


def peers(data):
    systems = data["systems"]
    rates = table(
        ["workers", *(PEER_LABELS.get(name, name) for name in systems)],
        [[run["workers"], *(run["rates"][s] for s in systems)] for run in data["runs"]],
    )
    keys = sorted({key for run in data["runs"] for key in run["ratios"]})
    ratios = table(
        [
            "workers",
            *(
                " / ".join(PEER_LABELS.get(part, part) for part in key.split("/"))
                for key in keys
            ),
        ],
        [
            [
                run["workers"],
                *(f"{run['ratios'].get(key, float('nan')):.2f}" for key in keys),
            ]
            for run in data["runs"]
        ],
    )
    loads = ", ".join(
        "{} workers {:.1f}–{:.1f}".format(run["workers"], *load_range(run))
        for run in data["runs"]
    )
    command = data.get("command", "python bench/peers.py")
    return "\n\n".join(
        [
            f"Command: `{command}`; load average during the runs: {loads}.",
            "todos (jobs) per second, median of the repetitions:\n\n" + rates,
            "Ratios:\n\n" + ratios,
        ]
    )


def store_throughput(data):
    return table(
        [
            "workers",
            "plain psycopg todos/s",
            "store todos/s",
            "store/plain",
            "claim p50 ms plain / store",
            "claim p99 ms plain / store",
            "client CPU ms/todo plain / store",
        ],
        [
            [
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                f"**{run['ratio']:.2f}**",
                f"{run['plain']['latency_ms']['claim']['p50']:.2f} / "
                f"{run['store']['latency_ms']['claim']['p50']:.2f}",
                f"{run['plain']['latency_ms']['claim']['p99']:.2f} / "
                f"{run['store']['latency_ms']['claim']['p99']:.2f}",
                f"{cpu(run['plain'], 'client_cpu_ms_per_todo')} / "
                f"{cpu(run['store'], 'client_cpu_ms_per_todo')}",
            ]
            for run in data["runs"]
        ],
    )


def http_throughput(data):
    return table(
        [
            "clients",
            "store todos/s",
            "HTTP todos/s",
            "HTTP/store",
            "HTTP claim p50 / p99 ms",
            "HTTP complete p50 ms",
            "app CPU ms/todo: store / gunicorn",
        ],
        [
            [
                run["workers"],
                run["store"]["rate"],
                run["http"]["rate"],
                f"**{run['ratio']:.2f}**",
                f"{run['http']['latency_ms']['claim']['p50']:.2f} / "
                f"{run['http']['latency_ms']['claim']['p99']:.2f}",
                run["http"]["latency_ms"]["complete"]["p50"],
                f"{cpu(run['store'], 'app_cpu_ms_per_todo')} / "
                f"{cpu(run['http'], 'app_cpu_ms_per_todo')}",
            ]
            for run in data["runs"]
        ],
    )


def claim_latency(data):
    rows = []
    for name, figures in data["tables"].items():
        for mode in ("plain", "store"):
            rows.append(
                [
                    f"{name} ({figures['backlog']:,} terminal rows)",
                    mode,
                    figures[mode]["p50"],
                    figures[mode]["p99"],
                    figures[mode]["mean"],
                    figures["plan"]["buffers"],
                ]
            )
    ratio_rows = [
        [mode, f"**{r['p50']:.2f}**", f"**{r['p99']:.2f}**"]
        for mode, r in data["backlog_over_empty"].items()
    ]
    plans = "\n".join(
        f"- {name}: " + ", ".join(figures["plan"]["scans"])
        for name, figures in data["tables"].items()
    )
    return "\n\n".join(
        [
            table(
                ["table", "path", "p50 ms", "p99 ms", "mean ms", "plan buffers"], rows
            ),
            table(["path", "backlog/empty p50", "backlog/empty p99"], ratio_rows),
            "Claim scan plan (EXPLAIN ANALYZE after the timed claims):\n\n" + plans,
        ]
    )


def enqueue_throughput(data):
    return table(
        [
            "workload",
            "workers",
            "plain creates/s",
            "store creates/s",
            "store/plain",
            "new rows per create",
            "create p50 ms plain / store",
        ],
        [
            [
                run["workload"],
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                f"**{run['ratio']:.2f}**",
                f"{run['store']['new_rows_per_create']:.2f}",
                f"{run['plain']['latency_ms']['create']['p50']:.2f} / "
                f"{run['store']['latency_ms']['create']['p50']:.2f}",
            ]
            for run in data["runs"]
        ],
    )


def doorbell_latency(data):
    rows = [
        [
            "store's create SQL → bare LISTEN connection notified (baseline)",
            data["listen"],
        ],
        ["POST /api/v1/todos → waiting POST /api/v1/todos/claim returns", data["http"]],
    ]
    if "create" in data:
        rows.append(["(the POST /api/v1/todos request alone)", data["create"]])
    return table(
        ["path", "p50 ms", "p99 ms", "mean ms"],
        [[name, s["p50"], s["p99"], s["mean"]] for name, s in rows],
    )


def profile_api(data):
    cpu = data["cpu_ms_per_todo"]
    rows = [["store alone (baseline)", cpu["store"], ""]]
    if "api_before" in cpu:
        rows.append(["WSGI app before the #13 cuts", cpu["api_before"], ""])
    rows += [
        ["WSGI app: claim + complete requests", cpu["api"], "100 %"],
    ] + [
        [label, cpu["api"] * share, f"{share:.0%}"]
        for label, share in data["shares"].items()
    ]
    return table(["path", "CPU ms/todo", "share of the API's CPU"], rows)


def machine(data):
    info = data["machine"]
    return (
        f"{info['cpus']} CPUs, load average {info['loadavg_at_start'][0]:.1f} at the"
        f" start and {info.get('loadavg_at_end', [float('nan')])[0]:.1f} at the end,"
        f" PostgreSQL {info['postgresql']} (fsync {info['fsync']},"
        f" synchronous_commit {info['synchronous_commit']}), Python {info['python']}"
    )


def latest(name):
    found = sorted(RESULTS.glob(f"{name}-*.json"))
    return found[-1] if found else None


def main():
    paths = [Path(arg) for arg in sys.argv[1:]] or [
        path for path in map(latest, NAMES) if path is not None
    ]
    for path in paths:
        data = json.loads(path.read_text())
        render = globals()[data["benchmark"]]
        print(f"### {data['benchmark']} ({path.name})\n")
        print(f"Machine: {machine(data)}.\n")
        print(render(data) + "\n")


if __name__ == "__main__":
    main()
