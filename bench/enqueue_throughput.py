"""Enqueue throughput, without and with idempotency keys, next to plain psycopg.

    python bench/enqueue_throughput.py --workers 1,4 --seconds 5

Three workloads, each through ``store.create_todo`` ("store") and as the
store's own SQL on a bare psycopg connection ("plain"), in the same run:

- ``no-key``: every create inserts a row;
- ``unique-keys``: every create carries a fresh idempotency key;
- ``duplicates``: every key is sent twice in a row, so half the creates
  collapse onto the live todo (the insert does nothing, one read returns it).
"""

import time
import uuid

import benchlib

WORKLOADS = ("no-key", "unique-keys", "duplicates")


def key_for(workload, worker, number):
    """Return the idempotency key of the number-th create of a worker, or None."""
    if workload == "no-key":
        return None
    if workload == "unique-keys":
        return f"{worker}-{number}"
    return f"{worker}-{number // 2}"


def store_worker(index, url, endpoint_id, workload):
    """Return a loop that enqueues through todos.store."""
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id, None)
    worker = f"store-{index}"
    connection.ensure_connection()

    def create(number):
        _, created = store.create_todo(
            scope,
            queue=benchlib.QUEUE,
            title=f"t {number}",
            payload={"n": number},
            idempotency_key=key_for(workload, worker, number),
        )
        return created

    return lambda stop_at: enqueue(stop_at, create)


def plain_worker(index, url, endpoint_id, workload, create_sql, duplicate_sql):
    """Return a loop that runs the store's create SQL on a bare psycopg connection."""
    import json

    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    worker = f"plain-{index}"

    def create(number):
        params = {
            "id": str(uuid.uuid4()),
            "endpoint_id": endpoint_id,
            "queue": benchlib.QUEUE,
            "title": f"t {number}",
            "payload": json.dumps({"n": number}),
            "assignee": None,
            "max_attempts": 5,
            "idempotency_key": key_for(workload, worker, number),
            "actor": "",
            "event_error": "",
        }
        if conn.execute(create_sql, params).fetchone() is not None:
            return True
        if conn.execute(duplicate_sql, params).fetchone() is None:
            raise RuntimeError("a duplicate create found no live todo")
        return False

    return lambda stop_at: enqueue(stop_at, create)


def enqueue(stop_at, create):
    """Create until the deadline; count the calls and the rows inserted."""
    latencies, inserted, number = [], 0, 0
    while (start := time.perf_counter()) < stop_at:
        inserted += create(number)
        latencies.append(time.perf_counter() - start)
        number += 1
    return {"done": number, "inserted": inserted, "latencies": {"create": latencies}}


def measure(url, endpoint_id, mode, workload, workers, seconds, sql):
    """Empty the table, run one mode of one workload, return the merged figures."""
    benchlib.reset_todos(url)
    if mode == "store":
        outcomes = benchlib.run_processes(
            store_worker, workers, seconds, (url, endpoint_id, workload)
        )
    else:
        outcomes = benchlib.run_processes(
            plain_worker, workers, seconds, (url, endpoint_id, workload, *sql)
        )
    figures = benchlib.merge(outcomes)
    figures["inserted"] = sum(item["inserted"] for item in outcomes)
    return figures


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4])
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
    from todos import store

    sql = (store.CREATE_SQL, store.LIVE_DUPLICATE_SQL)
    info = benchlib.machine(url)
    runs = []
    for number, (workload, workers) in enumerate(
        (w, n) for w in WORKLOADS for n in args.workers
    ):
        runs.append(
            {
                "workload": workload,
                "workers": workers,
                **benchlib.paired_rounds(
                    args.rounds,
                    number,
                    lambda mode, workload=workload, workers=workers: measure(
                        url, endpoint_id, mode, workload, workers, args.seconds, sql
                    ),
                    f"{workload}, {workers} workers",
                ),
            }
        )

    rows = [
        [
            run["workload"],
            run["workers"],
            run["plain"]["rate"],
            run["store"]["rate"],
            f"{run['ratio']:.2f}",
            f"{run['store']['inserted'] / max(run['store']['done'], 1):.2f}",
            run["plain"]["latency_ms"]["create"]["p50"],
            run["store"]["latency_ms"]["create"]["p50"],
            run["store"]["latency_ms"]["create"]["p99"],
        ]
        for run in runs
    ]
    benchlib.print_table(
        f"enqueue throughput, {args.seconds:g} s per run (creates/s; create ms)",
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
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
