"""Claim+complete throughput of the store, next to a plain psycopg loop.

    python bench/store_throughput.py --workers 1,2,4,8 --seconds 10

For each worker count, N processes drain one queue: claim the next todo,
complete it, repeat. "store" runs ``store.claim_next`` + ``store.complete_todo``
through Django's connection; "plain" runs the very same two SQL statements
(the store's constants, the same parameters) on a bare psycopg connection. Both
run against the same database in the same run, in alternating order; the ratio
store/plain is the figure to compare across machines.
"""

import time

import benchlib


def store_worker(index, url, endpoint_id):
    """Return a loop that claims and completes through todos.store."""
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id, None)
    worker = f"store-{index}"
    connection.ensure_connection()

    def claim():
        try:
            return store.claim_next(scope, worker).id
        except store.NotFound:
            return None

    def complete(todo_id):
        store.complete_todo(scope, todo_id, worker)

    return lambda stop_at: drain(stop_at, claim, complete)


def plain_worker(index, url, endpoint_id, claim_sql, complete_sql, lease):
    """Return a loop that runs the store's SQL on a bare psycopg connection."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    worker = f"plain-{index}"
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

    return lambda stop_at: drain(stop_at, claim, complete)


def drain(stop_at, claim, complete):
    """Claim and complete until the deadline; time each call and the CPU used."""
    claims, completes, done, dry = [], [], 0, 0
    cpu = time.process_time()
    while (start := time.perf_counter()) < stop_at:
        todo_id = claim()
        claimed = time.perf_counter()
        if todo_id is None:
            dry += 1
            time.sleep(0.001)
            continue
        complete(todo_id)
        claims.append(claimed - start)
        completes.append(time.perf_counter() - claimed)
        done += 1
    return {
        "done": done,
        "dry": dry,
        "cpu": time.process_time() - cpu,
        "latencies": {"claim": claims, "complete": completes},
    }


def measure(url, endpoint_id, mode, workers, seconds, sql):
    """Fill the queue, run one mode with N workers, and return the merged figures."""
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, int(max(20_000, 4_000 * seconds * workers)))
    if mode == "store":
        outcomes = benchlib.run_processes(
            store_worker, workers, seconds, (url, endpoint_id)
        )
    else:
        outcomes = benchlib.run_processes(
            plain_worker, workers, seconds, (url, endpoint_id, *sql)
        )
    return benchlib.merge(outcomes)


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 2, 4, 8])
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
    for number, workers in enumerate(args.workers):
        # Alternate which mode goes first, so drift (autovacuum, the other
        # tenants of the machine) does not always favour the same one.
        runs.append(
            {
                "workers": workers,
                **benchlib.paired_rounds(
                    args.rounds,
                    number,
                    lambda mode, workers=workers: measure(
                        url, endpoint_id, mode, workers, args.seconds, sql
                    ),
                    f"{workers} workers",
                ),
            }
        )

    rows = []
    for run in runs:
        store_fig, plain_fig = run["store"], run["plain"]
        rows.append(
            [
                run["workers"],
                plain_fig["rate"],
                store_fig["rate"],
                f"{run['ratio']:.2f}",
                plain_fig["latency_ms"]["claim"]["p50"],
                store_fig["latency_ms"]["claim"]["p50"],
                plain_fig["latency_ms"]["claim"]["p99"],
                store_fig["latency_ms"]["claim"]["p99"],
            ]
        )
    benchlib.print_table(
        f"claim+complete throughput, {args.seconds:g} s per run (todos/s; claim ms)",
        [
            "workers",
            "plain/s",
            "store/s",
            "store/plain",
            "plain p50",
            "store p50",
            "plain p99",
            "store p99",
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
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
