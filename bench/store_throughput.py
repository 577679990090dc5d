"""Claim+complete throughput of the store, next to a plain psycopg loop.

    python bench/store_throughput.py --workers 1,2,4,8 --seconds 10

For each worker count, N processes drain one queue: claim the next todo,
complete it, repeat. Each process holds both paths and takes turns of
``--slice`` seconds, switching on the wall clock so all N switch together:
"store" runs ``store.claim_next`` + ``store.complete_todo`` (with the lease
token) through Django's connection; "plain" runs the very same two SQL
statements (the store's constants, the same parameters) on a bare psycopg
connection; "store10" claims ten at once (``store.claim_many``) and completes
them with one ``store.acknowledge_many``. All paths run with the same N, on the
same database and queue, under the same load from the rest of the machine; the
ratios store/plain and store10/plain are the figures to compare.
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
            return store.claim_next(scope, worker)
        except store.NotFound:
            return None

    def complete(todo):
        store.complete_todo(scope, todo.id, worker, lease_token=todo.lease_token)

    return lambda: timed(claim, complete)


def store_batch_step(url, endpoint_id, worker, batch=10):
    """Return a step that claims ten and acknowledges them in one call."""
    benchlib.setup_django(url)
    from todos import store

    scope = store.Scope(endpoint_id, None)

    def claim():
        return store.claim_many(scope, worker, limit=batch) or None

    def complete(todos):
        acks = [
            store.Ack("complete", todo.id, lease_token=todo.lease_token)
            for todo in todos
        ]
        for outcome in store.acknowledge_many(scope, acks):
            if isinstance(outcome, Exception):
                raise outcome

    return lambda: timed(claim, complete, count=len)


def plain_step(url, endpoint_id, worker, claim_sql, complete_sql, lease):
    """Return a step that runs the store's SQL on a bare psycopg connection."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    scope = {"endpoint_id": endpoint_id, "queues": None}
    claim_params = {
        **scope,
        "worker": worker,
        "lease": None,
        "default_lease": lease,
        "limit": 1,
    }

    def claim():
        row = conn.execute(claim_sql, claim_params).fetchone()
        # id and lease_token (TODO_COLUMNS: lease_token is the 19th column)
        return None if row is None else (row[0], row[18])

    def complete(claimed):
        todo_id, token = claimed
        params = {
            **scope,
            "operator": False,
            "default_lease": lease,
            "ids": [todo_id],
            "ops": ["complete"],
            "workers": [worker],
            "tokens": [token],
            "results": [None],
            "errors": [""],
            "leases": [None],
            "progresses": [None],
            "checkpoints": [None],
            "handoffs": [None],
            "assignees": [None],
            "notes": [None],
        }
        if conn.execute(complete_sql, params).fetchone() is None:
            raise RuntimeError(f"complete matched no row: {todo_id}")

    return lambda: timed(claim, complete)


def timed(claim, complete, count=None):
    """Claim and complete; return the latencies (and todos done), None if no work."""
    start = time.perf_counter()
    claimed_todos = claim()
    claimed = time.perf_counter()
    if claimed_todos is None:
        return None
    complete(claimed_todos)
    out = {"claim": claimed - start, "complete": time.perf_counter() - claimed}
    if count is not None:
        out["todos"] = count(claimed_todos)
    return out


def worker(index, url, endpoint_id, sql, slice_seconds):
    """Return a loop that alternates the store and plain paths."""
    name = f"w{index}"
    modes = {
        "plain": plain_step(url, endpoint_id, name, *sql),
        "store": store_step(url, endpoint_id, name),
        "store10": store_batch_step(url, endpoint_id, name),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def measure(url, endpoint_id, workers, seconds, sql, slice_seconds):
    """Fill the queue, run N alternating workers, and return each path's figures."""
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, int(max(20_000, 6_000 * seconds * workers)))
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

    from todos.store import lifecycle

    sql = (lifecycle.CLAIM_SQL, lifecycle.ACK_SQL, settings.SWITCHBOARD_LEASE_SECONDS)
    info = benchlib.machine(url)
    runs = []
    for workers in args.workers:
        figures = measure(url, endpoint_id, workers, args.seconds, sql, args.slice)
        ratio = figures["store"]["rate"] / figures["plain"]["rate"]
        batch_ratio = figures["store10"]["rate"] / figures["plain"]["rate"]
        runs.append(
            {"workers": workers, **figures, "ratio": ratio, "batch_ratio": batch_ratio}
        )
        print(
            f"  {workers} workers: plain {figures['plain']['rate']:,.0f}/s, "
            f"store {figures['store']['rate']:,.0f}/s, "
            f"store10 {figures['store10']['rate']:,.0f}/s, "
            f"ratios {ratio:.2f} / {batch_ratio:.2f}",
            flush=True,
        )

    rows = [
        [
            run["workers"],
            run["plain"]["rate"],
            run["store"]["rate"],
            run["store10"]["rate"],
            f"{run['ratio']:.2f}",
            f"{run['batch_ratio']:.2f}",
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
            "store10/s",
            "store/plain",
            "store10/plain",
            "plain p50",
            "store p50",
            "plain p99",
            "store p99",
            "plain CPU",
            "store CPU",
        ],
        rows,
    )
    dry = sum(
        run[mode]["dry"] for run in runs for mode in ("store", "store10", "plain")
    )
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
