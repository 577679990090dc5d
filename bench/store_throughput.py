"""Claim+complete throughput of the store, next to a plain psycopg loop.

    python bench/store_throughput.py --workers 1,2,4,8 --seconds 10

For each worker count, N processes drain one queue: claim the next todo,
complete it, repeat. Each process holds both paths and takes turns of
``--slice`` seconds, switching on the wall clock so all N switch together:
"store" runs ``store.claim_next`` + ``store.complete_todo`` through Django's
connection; "plain" runs the very same two SQL statements (the store's
constants, the same parameters) on a bare psycopg connection. Both paths thus
run with the same N, on the same database and queue, under the same load from
the rest of the machine; the ratio store/plain is the figure to compare.
"""

import time

import benchlib


def store_step(url, endpoint_id, worker):
    """Return a step that claims and completes one todo through todos.store."""
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id, None)
    connection.ensure_connection()

    def claim():
        try:
            return store.claim_next(scope, worker).id
        except store.NotFound:
            return None

    def complete(todo_id):
        store.complete_todo(scope, todo_id, worker)

    return lambda: timed(claim, complete)


def plain_step(url, endpoint_id, worker, claim_sql, complete_sql, lease):
    """Return a step that runs the store's SQL on a bare psycopg connection."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    scope = {"endpoint_id": endpoint_id, "queues": None}
    claim_params = {
        **scope,
        "worker": worker,
        "actor": worker,
        "event_error": "",
        "lease": lease,
    }

    def claim():
        row = conn.execute(claim_sql, claim_params).fetchone()
        return None if row is None else row[0]

    def complete(todo_id):
        params = {
            **scope,
            "id": todo_id,
            "worker": worker,
            "actor": worker,
            "event_error": "",
            "result": None,
        }
        if conn.execute(complete_sql, params).fetchone() is None:
            raise RuntimeError(f"complete matched no row: {todo_id}")

    return lambda: timed(claim, complete)


def timed(claim, complete):
    """Claim and complete one todo; return the two latencies, or None if no work."""
    start = time.perf_counter()
    todo_id = claim()
    claimed = time.perf_counter()
    if todo_id is None:
        return None
    complete(todo_id)
    return {"claim": claimed - start, "complete": time.perf_counter() - claimed}


def worker(index, url, endpoint_id, sql, slice_seconds):
    """Return a loop that alternates the store and plain paths."""
    name = f"w{index}"
    modes = {
        "plain": plain_step(url, endpoint_id, name, *sql),
        "store": store_step(url, endpoint_id, name),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def measure(url, endpoint_id, workers, seconds, sql, slice_seconds):
    """Fill the queue, run N alternating workers, and return each path's figures."""
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, int(max(20_000, 3_000 * seconds * workers)))
    outcomes = benchlib.run_processes(
        worker, workers, seconds, (url, endpoint_id, sql, slice_seconds)
    )
    return benchlib.merge_modes(outcomes)


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 2, 4, 8])
    parse.add_argument("--seconds", type=float, default=10)
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of one path"
    )
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, _ = benchlib.ensure_endpoint(url)
    benchlib.setup_django(url)
    from django.conf import settings

    from todos import store

    sql = (
        store.CLAIM_NEXT_SQL,
        store.COMPLETE_SQL[0],
        settings.SWITCHBOARD_LEASE_SECONDS,
    )
    info = benchlib.machine(url)
    runs = []
    for workers in args.workers:
        figures = measure(url, endpoint_id, workers, args.seconds, sql, args.slice)
        ratio = figures["store"]["rate"] / figures["plain"]["rate"]
        runs.append({"workers": workers, **figures, "ratio": ratio})
        print(
            f"  {workers} workers: plain {figures['plain']['rate']:,.0f}/s, "
            f"store {figures['store']['rate']:,.0f}/s, ratio {ratio:.2f}",
            flush=True,
        )

    rows = [
        [
            run["workers"],
            run["plain"]["rate"],
            run["store"]["rate"],
            f"{run['ratio']:.2f}",
            run["plain"]["latency_ms"]["claim"]["p50"],
            run["store"]["latency_ms"]["claim"]["p50"],
            run["plain"]["latency_ms"]["claim"]["p99"],
            run["store"]["latency_ms"]["claim"]["p99"],
            run["plain"]["client_cpu_ms_per_todo"],
            run["store"]["client_cpu_ms_per_todo"],
        ]
        for run in runs
    ]
    benchlib.print_table(
        f"claim+complete throughput, {args.seconds:g} s per worker count, paths "
        f"alternating every {args.slice:g} s (todos/s; ms)",
        [
            "workers",
            "plain/s",
            "store/s",
            "store/plain",
            "plain p50",
            "store p50",
            "plain p99",
            "store p99",
            "plain CPU",
            "store CPU",
        ],
        rows,
    )
    dry = sum(run[mode]["dry"] for run in runs for mode in ("store", "plain"))
    if dry:
        print(f"warning: workers found the queue empty {dry} times; raise the fill")
    benchlib.write_results(
        "store_throughput",
        {
            "benchmark": "store_throughput",
            "machine": info,
            "seconds": args.seconds,
            "slice": args.slice,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
