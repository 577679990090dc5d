"""A claim beside another queue's backlog: before and after 300 000 pending todos.

    python bench/claim_backlog.py --backlog 300000 --claims 300

Issue #13's case: endpoint A has queues ``bulk`` and ``rare``; endpoint B has
``rare``. The claims timed are A's claim on ``rare``, B's claim on ``rare``
and B's claim across its whole grant, each through ``store.claim_next`` on
Django's connection, once with custom plans (``plan_cache_mode =
force_custom_plan``) and once with the generic plan a prepared statement
settles on (``force_generic_plan``). Each claim is completed and a replacement
enqueued after the clock stops, so every queue keeps its size.

First without a backlog, then after 300 000 pending todos land in A's ``bulk``
(ANALYZEd): the ratio backlog / no backlog of each case is the figure (goal:
≤ 2, flat at about 1.0).
"""

import statistics
import time

import benchlib
import psycopg

READY = 200

BULK_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at, available_at)
SELECT gen_random_uuid(), %s, 'bulk', 'bulk ' || n, '{}'::jsonb, 'pending', 0, 5,
       '', now() - interval '1 day' + n * interval '1 ms', now(),
       now() - interval '1 day' + n * interval '1 ms'
  FROM generate_series(1, %s) AS n
"""


def cases(store, a, b):
    return {
        "A rare": (store.Scope(a), "rare"),
        "B rare": (store.Scope(b), "rare"),
        "B grant": (store.Scope(b), None),
    }


def time_claims(store, connection, scope, queue, mode, claims):
    with connection.cursor() as cursor:
        cursor.execute(f"SET plan_cache_mode = {mode}")
    samples = []
    for number in range(claims):
        started = time.perf_counter()
        todo = store.claim_next(scope, "bench", queue=queue)
        samples.append(time.perf_counter() - started)
        store.complete_todo(scope, todo.id, None, lease_token=todo.lease_token)
        store.create_todo(scope, queue=todo.queue, title=f"refill {number}")
    with connection.cursor() as cursor:
        cursor.execute("RESET plan_cache_mode")
    # The first claims of a generic run may still be planned per call.
    return samples[10:]


def measure(store, connection, scopes, claims):
    figures = {}
    for name, (scope, queue) in scopes.items():
        for mode, label in (
            ("force_custom_plan", "custom"),
            ("force_generic_plan", "generic"),
        ):
            samples = time_claims(store, connection, scope, queue, mode, claims)
            figures[f"{name}, {label}"] = {
                "p50_ms": statistics.median(samples) * 1000,
                "p99_ms": benchlib.percentile(samples, 0.99) * 1000,
            }
    return figures


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--backlog", type=int, default=300_000)
    parse.add_argument("--claims", type=int, default=300)
    args = parse.parse_args()
    url = args.database_url
    benchlib.prepare_database(url)
    benchlib.reset_todos(url)
    a, _ = benchlib.ensure_endpoint(url, "backlog-a")
    b, _ = benchlib.ensure_endpoint(url, "backlog-b")
    benchlib.setup_django(url)
    from django.db import connection

    from todos import store

    scopes = cases(store, a, b)
    for scope in (store.Scope(a), store.Scope(b)):
        store.create_many(scope, [{"queue": "rare"}] * 100)
        store.create_many(scope, [{"queue": "rare"}] * 100)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE todos")
    info = benchlib.machine(url)
    before = measure(store, connection, scopes, args.claims)
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BULK_SQL, [a, args.backlog])
        conn.execute("VACUUM ANALYZE todos")
    print(
        f"  {args.backlog:,} pending in A's bulk in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    after = measure(store, connection, scopes, args.claims)
    rows = [
        [
            case,
            f"{before[case]['p50_ms']:.2f}",
            f"{after[case]['p50_ms']:.2f}",
            f"{after[case]['p50_ms'] / before[case]['p50_ms']:.2f}",
            f"{before[case]['p99_ms']:.2f}",
            f"{after[case]['p99_ms']:.2f}",
        ]
        for case in before
    ]
    benchlib.print_table(
        f"claim_next beside {args.backlog:,} pending in another queue "
        f"({args.claims} claims per case; ms)",
        ["case", "p50 before", "p50 backlog", "ratio", "p99 before", "p99 backlog"],
        rows,
    )
    benchlib.write_results(
        "claim_backlog",
        {
            "benchmark": "claim_backlog",
            "machine": info,
            "backlog": args.backlog,
            "before": before,
            "after": after,
        },
    )


if __name__ == "__main__":
    main()
