"""Claim+complete throughput through the HTTP API under gunicorn, next to the store.

    python bench/http_throughput.py --workers 1,4,8 --seconds 5

gunicorn serves Switchboard with the project's gunicorn.conf.py (gthread
workers; GUNICORN_WORKERS and GUNICORN_THREADS apply) against the benchmark
database. N client processes, each with one keep-alive connection, loop on
``POST /api/v1/todos/claim`` then ``POST /api/v1/todos/<id>/complete``. The
store-level loop of bench/store_throughput.py runs in the same run with the
same N, in alternating order; the ratio http/store is the cost of the web tier
(HTTP parsing, token lookup, JSON, request log) on this machine. The server and
the clients share the machine's cores with PostgreSQL, as they would on one box.
"""

import time

import benchlib
import store_throughput


def http_worker(index, port, token):
    """Return a loop that claims and completes over one keep-alive connection."""
    client = benchlib.Client(port, token)
    worker = f"http-{index}"
    client.request("GET", "/api/v1/todos?limit=1")

    def claim():
        status, data = client.request("POST", "/api/v1/todos/claim", {"worker": worker})
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"claim answered {status}: {data}")
        return data["todo"]["id"]

    def complete(todo_id):
        status, data = client.request(
            "POST", f"/api/v1/todos/{todo_id}/complete", {"worker": worker}
        )
        if status != 200:
            raise RuntimeError(f"complete answered {status}: {data}")

    return lambda stop_at: store_throughput.drain(stop_at, claim, complete)


def measure(url, endpoint_id, server, token, mode, workers, seconds):
    """Fill the queue and run one mode (store or http) with N workers.

    The application's CPU per todo is the workers' own for "store", and
    gunicorn's (master and workers) for "http", where the clients only speak HTTP.
    """
    if mode == "store":
        figures = store_throughput.measure(
            url, endpoint_id, "store", workers, seconds, ()
        )
        figures["app_cpu_ms_per_todo"] = figures["client_cpu_ms_per_todo"]
        return figures
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, int(max(10_000, 1_500 * seconds * workers)))
    before = server.cpu_seconds()
    outcomes = benchlib.run_processes(
        http_worker, workers, seconds, (server.port, token)
    )
    figures = benchlib.merge(outcomes)
    figures["app_cpu_ms_per_todo"] = (
        (server.cpu_seconds() - before) / figures["done"] * 1000
        if figures["done"]
        else float("nan")
    )
    return figures


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4, 8])
    parse.add_argument("--seconds", type=float, default=5)
    parse.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="repeat each pair of runs; the median round counts",
    )
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url)
    info = benchlib.machine(url)
    runs = []
    with benchlib.gunicorn(url) as server:
        started = time.perf_counter()
        for number, workers in enumerate(args.workers):
            runs.append(
                {
                    "workers": workers,
                    **benchlib.paired_rounds(
                        args.rounds,
                        number,
                        lambda mode, workers=workers: measure(
                            url, endpoint_id, server, token, mode, workers, args.seconds
                        ),
                        f"{workers} clients",
                        modes=("store", "http"),
                    ),
                }
            )
        print(f"  measured in {time.perf_counter() - started:.0f} s", flush=True)

    rows = [
        [
            run["workers"],
            run["store"]["rate"],
            run["http"]["rate"],
            f"{run['ratio']:.2f}",
            run["store"]["latency_ms"]["claim"]["p50"],
            run["http"]["latency_ms"]["claim"]["p50"],
            run["http"]["latency_ms"]["claim"]["p99"],
            run["http"]["latency_ms"]["complete"]["p50"],
            run["store"]["app_cpu_ms_per_todo"],
            run["http"]["app_cpu_ms_per_todo"],
        ]
        for run in runs
    ]
    benchlib.print_table(
        f"claim+complete over HTTP, {args.seconds:g} s per run (todos/s; ms)",
        [
            "clients",
            "store/s",
            "http/s",
            "http/store",
            "store claim p50",
            "http claim p50",
            "http claim p99",
            "http complete p50",
            "store CPU ms/todo",
            "gunicorn CPU ms/todo",
        ],
        rows,
    )
    benchlib.write_results(
        "http_throughput",
        {
            "benchmark": "http_throughput",
            "machine": info,
            "seconds": args.seconds,
            "gunicorn": {"config": "gunicorn.conf.py"},
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
