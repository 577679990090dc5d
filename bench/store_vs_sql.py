"""The store's transitions next to the same SQL run bare: what todos.store costs.

Question: what does going through ``todos.store`` (Django's connection, the
typed rows, the diagnosis of a miss) cost over running its own statements on a
bare psycopg connection?

    python bench/store_vs_sql.py                 # 1 and 4 workers
    python bench/store_vs_sql.py --workers 1,2,4,8 --seconds 10

Two parts, each on the benchmark database, every path in the same run:

- claim+complete: N processes drain one queue. Each holds three paths and
  takes turns of ``--slice`` seconds switched on the wall clock, so all N
  switch together and every path sees the same load: "plain" runs the store's
  ``CLAIM_PLAIN_SQL`` and its acknowledgement (bound by ``store.bind_claim`` and
  ``store.bind_acks``) on a bare psycopg connection; "store" runs
  ``store.claim_next`` + ``store.complete_todo``; "store10" claims ten with
  ``store.claim_many`` and completes them with one ``store.acknowledge_many``.
- create: the same turns for enqueueing, ``store.create_todo`` beside the
  store's ``CREATE_SQL`` (and its ``LIVE_DUPLICATE_SQL`` read) run bare, in
  three workloads: no idempotency key; a fresh key per create; every key sent
  twice in a row (half the creates collapse onto the live todo).

It prints todos/s (creates/s), the ratio store/plain, claim and create
latencies (p50, p99) and the client CPU per todo. Result:
bench/results/latest/store_vs_sql.json (`python bench/report.py`).
"""

import time

import benchlib
import psycopg

WORKLOADS = ("no-key", "unique-keys", "duplicates")


# --- claim+complete -------------------------------------------------------------


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

    return lambda: benchlib.timed(claim, complete)


def store_batch_step(url, endpoint_id, worker, batch=10):
    """Return a step that claims ten and acknowledges them in one call."""
    benchlib.setup_django(url)
    from todos import store

    scope = store.Scope(endpoint_id, None)

    def claim():
        return store.claim_many(scope, worker, limit=batch)

    def complete(todos):
        acks = [
            store.Ack("complete", todo.id, lease_token=todo.lease_token)
            for todo in todos
        ]
        for outcome in store.acknowledge_many(scope, acks):
            if isinstance(outcome, Exception):
                raise outcome

    return lambda: benchlib.timed(claim, complete, count=len)


def transition_worker(index, url, endpoint_id, slice_seconds):
    """Return a loop that alternates the plain, store and store10 paths."""
    name = f"w{index}"
    modes = {
        "plain": benchlib.plain_step(url, endpoint_id, name),
        "store": store_step(url, endpoint_id, name),
        "store10": store_batch_step(url, endpoint_id, name),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def transitions(args, endpoint_id, workers):
    benchlib.reset_todos(args.database_url)
    fill = int(max(2_000, 5_000 * args.seconds * workers * args.fill))
    benchlib.fill_pending(args.database_url, endpoint_id, fill)
    outcomes = benchlib.run_processes(
        transition_worker,
        workers,
        args.seconds,
        (args.database_url, endpoint_id, args.slice),
    )
    figures = benchlib.merge_modes(outcomes)
    plain = figures["plain"]["rate"] or float("nan")
    return {
        "workers": workers,
        **figures,
        "store_over_plain": figures["store"]["rate"] / plain,
        "store10_over_plain": figures["store10"]["rate"] / plain,
    }


# --- create ---------------------------------------------------------------------


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


def store_create_step(url, endpoint_id, workload, prefix):
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


def plain_create_step(url, endpoint_id, workload, prefix):
    """Return a step that runs the store's create SQL on a bare connection."""
    benchlib.setup_django(url)
    from todos import store
    from todos.store import lifecycle

    conn = psycopg.connect(url, autocommit=True)
    next_key = keys(workload, prefix)

    def step():
        started = time.perf_counter()
        params = store.bind_create(
            endpoint_id,
            queue=benchlib.QUEUE,
            title="t",
            payload={"n": 1},
            idempotency_key=next(next_key),
        )
        created = conn.execute(lifecycle.CREATE_SQL, params).fetchone() is not None
        if (
            not created
            and not conn.execute(lifecycle.LIVE_DUPLICATE_SQL, params).fetchone()
        ):
            raise RuntimeError("a duplicate create found no live todo")
        return {"create": time.perf_counter() - started, "inserted": float(created)}

    return step


def create_worker(index, url, endpoint_id, workload, slice_seconds):
    modes = {
        "plain": plain_create_step(url, endpoint_id, workload, f"plain-{index}"),
        "store": store_create_step(url, endpoint_id, workload, f"store-{index}"),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def creates(args, endpoint_id, workload, workers):
    benchlib.reset_todos(args.database_url)
    outcomes = benchlib.run_processes(
        create_worker,
        workers,
        args.create_seconds,
        (args.database_url, endpoint_id, workload, args.slice),
    )
    figures = benchlib.merge_modes(outcomes)
    for mode in figures.values():
        # "inserted" was recorded as a 0/1 sample per create; its mean is the share.
        mode["new_rows_per_create"] = mode["latency_ms"].pop("inserted")["mean"] / 1000
    plain = figures["plain"]["rate"] or float("nan")
    return {
        "workload": workload,
        "workers": workers,
        **figures,
        "store_over_plain": figures["store"]["rate"] / plain,
    }


def p50_p99(figures, name):
    latency = figures["latency_ms"][name]
    return f"{latency['p50']:.2f} / {latency['p99']:.2f}"


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--workers", type=benchlib.int_list, default=[1, 4], help="e.g. 1,4 (1,4)"
    )
    parse.add_argument(
        "--seconds", type=float, default=8, help="seconds per worker count (8)"
    )
    parse.add_argument(
        "--create-seconds", type=float, default=5, help="seconds per workload (5)"
    )
    parse.add_argument(
        "--slice", type=float, default=0.5, help="seconds per turn of a path (0.5)"
    )
    parse.add_argument(
        "--fill", type=float, default=1.0, help="scale the pre-filled queue (1.0)"
    )
    args = parse.parse_args()
    benchlib.apply_quick(
        args, parse, workers=[2], seconds=1.5, create_seconds=1.0, slice=0.25
    )

    result = benchlib.Result("store_vs_sql", args)
    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, _ = benchlib.ensure_endpoint(url)
    moves, made = [], []
    for workers in args.workers:
        run = transitions(args, endpoint_id, workers)
        moves.append(run)
        benchlib.progress(
            f"  claim+complete, {workers} workers: plain "
            f"{run['plain']['rate']:,.0f}/s, store {run['store']['rate']:,.0f}/s, "
            f"store10 {run['store10']['rate']:,.0f}/s"
        )
    for workload in WORKLOADS:
        for workers in args.workers:
            run = creates(args, endpoint_id, workload, workers)
            made.append(run)
            benchlib.progress(
                f"  create {workload}, {workers} workers: plain "
                f"{run['plain']['rate']:,.0f}/s, store {run['store']['rate']:,.0f}/s"
            )

    benchlib.print_table(
        f"claim+complete, {args.seconds:g} s per worker count, paths alternating "
        f"every {args.slice:g} s (todos/s; ms)",
        [
            "workers",
            "plain/s",
            "store/s",
            "store10/s",
            "store/plain",
            "store10/plain",
            "claim p50/p99 plain",
            "claim p50/p99 store",
            "CPU ms/todo plain",
            "CPU ms/todo store",
        ],
        [
            [
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                run["store10"]["rate"],
                f"{run['store_over_plain']:.2f}",
                f"{run['store10_over_plain']:.2f}",
                p50_p99(run["plain"], "claim"),
                p50_p99(run["store"], "claim"),
                run["plain"]["client_cpu_ms_per_todo"],
                run["store"]["client_cpu_ms_per_todo"],
            ]
            for run in moves
        ],
    )
    benchlib.print_table(
        f"create, {args.create_seconds:g} s per workload (creates/s; ms)",
        [
            "workload",
            "workers",
            "plain/s",
            "store/s",
            "store/plain",
            "new rows per create",
            "create p50/p99 plain",
            "create p50/p99 store",
        ],
        [
            [
                run["workload"],
                run["workers"],
                run["plain"]["rate"],
                run["store"]["rate"],
                f"{run['store_over_plain']:.2f}",
                f"{run['store']['new_rows_per_create']:.2f}",
                p50_p99(run["plain"], "create"),
                p50_p99(run["store"], "create"),
            ]
            for run in made
        ],
    )
    dry = sum(run[mode]["dry"] for run in moves for mode in ("plain", "store"))
    if dry:
        print(f"warning: workers found the queue empty {dry} times; raise --fill")
    result.write(
        {
            "workers": args.workers,
            "seconds": args.seconds,
            "create_seconds": args.create_seconds,
            "slice": args.slice,
        },
        benchlib.rounded({"claim_complete": moves, "create": made}),
    )


if __name__ == "__main__":
    main()
