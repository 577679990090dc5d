"""Claim+complete throughput through the HTTP API under gunicorn, next to the store.

    python bench/http_throughput.py --workers 1,4,8 --seconds 10

gunicorn serves Switchboard with the project's gunicorn.conf.py (uvicorn
workers; GUNICORN_WORKERS applies) against the benchmark database. N client
processes loop: claim the next todo, complete it. Each holds both paths and
they take turns of ``--slice`` seconds on the wall clock (as in
bench/store_throughput.py): "http" sends ``POST /api/v1/todos/claim`` and
``POST /api/v1/todos/<id>/complete`` over one keep-alive connection; "store"
calls the store directly in the client process. The ratio http/store is the
cost of the web tier (HTTP, token lookup, JSON, request log) on this machine,
where gunicorn, the clients and PostgreSQL share the cores. The CPU per todo is
the client's own for "store" and gunicorn's for "http".
"""

import benchlib
import store_throughput


def http_step(port, token, worker):
    """Return a step that claims and completes over one keep-alive connection."""
    client = benchlib.Client(port, token)
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

    return lambda: store_throughput.timed(claim, complete)


def worker(index, url, endpoint_id, port, token, slice_seconds):
    """Return a loop that alternates the store and HTTP paths."""
    name = f"w{index}"
    modes = {
        "store": store_throughput.store_step(url, endpoint_id, name),
        "http": http_step(port, token, name),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def measure(url, endpoint_id, server, token, workers, seconds, slice_seconds):
    """Fill the queue, run N alternating clients, and return each path's figures."""
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, int(max(20_000, 2_000 * seconds * workers)))
    before = server.cpu_seconds()
    outcomes = benchlib.run_processes(
        worker, workers, seconds, (url, endpoint_id, server.port, token, slice_seconds)
    )
    server_cpu = server.cpu_seconds() - before
    figures = benchlib.merge_modes(outcomes)
    store, http = figures["store"], figures["http"]
    store["app_cpu_ms_per_todo"] = store["client_cpu_ms_per_todo"]
    http["app_cpu_ms_per_todo"] = (
        server_cpu / http["done"] * 1000 if http["done"] else float("nan")
    )
    return figures


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4, 8])
    parse.add_argument("--seconds", type=float, default=10)
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of one path"
    )
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url)
    info = benchlib.machine(url)
    runs = []
    with benchlib.gunicorn(url) as server:
        for workers in args.workers:
            figures = measure(
                url, endpoint_id, server, token, workers, args.seconds, args.slice
            )
            ratio = figures["http"]["rate"] / figures["store"]["rate"]
            runs.append({"workers": workers, **figures, "ratio": ratio})
            print(
                f"  {workers} clients: store {figures['store']['rate']:,.0f}/s, "
                f"http {figures['http']['rate']:,.0f}/s, ratio {ratio:.2f}",
                flush=True,
            )

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
            "slice": args.slice,
            "gunicorn": {"config": "gunicorn.conf.py"},
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
