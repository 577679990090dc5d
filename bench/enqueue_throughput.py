"""Enqueue throughput, without and with idempotency keys, next to plain psycopg.

    python bench/enqueue_throughput.py --workers 1,4 --seconds 10

Three workloads, each through ``store.create_todo`` ("store") and as the
store's own SQL on a bare psycopg connection ("plain"):

- ``no-key``: every create inserts a row;
- ``unique-keys``: every create carries a fresh idempotency key;
- ``duplicates``: every key is sent twice in a row, so half the creates
  collapse onto the live todo (the insert does nothing, one read returns it).

As in bench/store_throughput.py, each of the N processes holds both paths and
they take turns of ``--slice`` seconds on the wall clock, so both paths run with
the same N, on the same database, under the same load.
"""

import json
import time
import uuid

import benchlib

WORKLOADS = ("no-key", "unique-keys", "duplicates")


def keys(workload, prefix):
    """Yield the idempotency key of each successive create (None for no key)."""
    number = 0
    while True:
        if workload == "no-key":
            yield None
        elif workload == "unique-keys":
            yield f"{prefix}-{number}"
        else:
            yield f"{prefix}-{number // 2}"
        number += 1


def store_step(url, endpoint_id, workload, prefix):
    """Return a step that enqueues one todo through todos.store."""
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id, None)
    connection.ensure_connection()
    next_key = keys(workload, prefix)

    def step():
        started = time.perf_counter()
        _, created = store.create_todo(
            scope,
            queue=benchlib.QUEUE,
            title="t",
            payload={"n": 1},
            idempotency_key=next(next_key),
        )
        return {"create": time.perf_counter() - started, "inserted": float(created)}

    return step


def plain_step(url, endpoint_id, workload, prefix, create_sql, duplicate_sql):
    """Return a step that runs the store's create SQL on a bare psycopg connection."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    next_key = keys(workload, prefix)

    def step():
        started = time.perf_counter()
        params = {
            "id": str(uuid.uuid4()),
            "endpoint_id": endpoint_id,
            "queue": benchlib.QUEUE,
            "title": "t",
            "payload": json.dumps({"n": 1}),
            "assignee": None,
            "max_attempts": 5,
            "delay_seconds": None,
            "default_max_attempts": 5,
            "idempotency_key": next(next_key),
            "actor": "",
        }
        created = conn.execute(create_sql, params).fetchone() is not None
        if not created and conn.execute(duplicate_sql, params).fetchone() is None:
            raise RuntimeError("a duplicate create found no live todo")
        return {"create": time.perf_counter() - started, "inserted": float(created)}

    return step


def worker(index, url, endpoint_id, workload, sql, slice_seconds):
    """Return a loop that alternates the store and plain paths."""
    modes = {
        "plain": plain_step(url, endpoint_id, workload, f"plain-{index}", *sql),
        "store": store_step(url, endpoint_id, workload, f"store-{index}"),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def measure(url, endpoint_id, workload, workers, seconds, sql, slice_seconds):
    """Empty the table, run one workload with N workers, return each path's figures."""
    benchlib.reset_todos(url)
    outcomes = benchlib.run_processes(
        worker, workers, seconds, (url, endpoint_id, workload, sql, slice_seconds)
    )
    figures = benchlib.merge_modes(outcomes)
    for mode in figures.values():
        # "inserted" was recorded as a 0/1 sample per create; its mean is the share.
        mode["new_rows_per_create"] = mode["latency_ms"].pop("inserted")["mean"] / 1000
    return figures


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4])
    parse.add_argument("--seconds", type=float, default=10)
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of one path"
    )
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, _ = benchlib.ensure_endpoint(url)
    benchlib.setup_django(url)
    from todos.store import lifecycle

    sql = (lifecycle.CREATE_SQL, lifecycle.LIVE_DUPLICATE_SQL)
    info = benchlib.machine(url)
    runs = []
    for workload in WORKLOADS:
        for workers in args.workers:
            figures = measure(
                url, endpoint_id, workload, workers, args.seconds, sql, args.slice
            )
            ratio = figures["store"]["rate"] / figures["plain"]["rate"]
            runs.append(
                {"workload": workload, "workers": workers, **figures, "ratio": ratio}
            )
            print(
                f"  {workload}, {workers} workers: plain "
                f"{figures['plain']['rate']:,.0f}/s, store "
                f"{figures['store']['rate']:,.0f}/s, ratio {ratio:.2f}",
                flush=True,
            )

    rows = [
        [
            run["workload"],
            run["workers"],
            run["plain"]["rate"],
            run["store"]["rate"],
            f"{run['ratio']:.2f}",
            f"{run['store']['new_rows_per_create']:.2f}",
            run["plain"]["latency_ms"]["create"]["p50"],
            run["store"]["latency_ms"]["create"]["p50"],
            run["store"]["latency_ms"]["create"]["p99"],
        ]
        for run in runs
    ]
    benchlib.print_table(
        f"enqueue throughput, {args.seconds:g} s per run, paths alternating every "
        f"{args.slice:g} s (creates/s; create ms)",
        [
            "workload",
            "workers",
            "plain/s",
            "store/s",
            "store/plain",
            "new rows",
            "plain p50",
            "store p50",
            "store p99",
        ],
        rows,
    )
    benchlib.write_results(
        "enqueue_throughput",
        {
            "benchmark": "enqueue_throughput",
            "machine": info,
            "seconds": args.seconds,
            "slice": args.slice,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
