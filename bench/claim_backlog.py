"""A claim beside another queue's backlog: before and after 300 000 pending todos.

    python bench/claim_backlog.py --backlog 300000 --claims 300

Issue #13's case: endpoint A has queues ``bulk`` and ``rare``; endpoint B has
``rare``. Two databases built alike, 200 ready todos in each endpoint's
``rare``; one of them also has 300 000 pending todos in A's ``bulk``
(ANALYZEd). The claims timed are A's claim on ``rare``, B's on ``rare`` and
B's across its whole grant: the store's own ``CLAIM_SQL`` (bound by
``store.bind_claim``) on a prepared psycopg connection per database, with
custom plans (``plan_cache_mode = force_custom_plan``) and with the generic
plan (``force_generic_plan``). The two databases take turns claim by claim, so
both see the same load; each claim is completed and a replacement enqueued
after the clock stops. The ratio backlog / no backlog of each case is the
figure (goal: ≤ 2).
"""

import statistics
import time

import benchlib
import psycopg

BULK_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at, available_at)
SELECT gen_random_uuid(), %s, 'bulk', 'bulk ' || n, '{}'::jsonb, 'pending', 0, 5,
       '', now() - interval '1 day' + n * interval '1 ms', now(),
       now() - interval '1 day' + n * interval '1 ms'
  FROM generate_series(1, %s) AS n
"""

MODES = {"custom": "force_custom_plan", "generic": "force_generic_plan"}


def setup(url, store):
    """A fresh database with endpoints A and B, 200 ready todos in each's rare."""
    benchlib.prepare_database(url)
    benchlib.reset_todos(url)
    a, _ = benchlib.ensure_endpoint(url, "backlog-a")
    b, _ = benchlib.ensure_endpoint(url, "backlog-b")
    with psycopg.connect(url, autocommit=True) as conn:
        for endpoint in (a, b):
            for number in range(200):
                params = store.bind_create(endpoint, queue="rare", title=f"r{number}")
                conn.execute(store.lifecycle.CREATE_SQL, params)
    return a, b


class Claimer:
    """The store's own claim, complete and create statements on one connection."""

    def __init__(self, store, url, a, b, mode):
        self.store = store
        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)
        self.conn.execute(f"SET plan_cache_mode = {MODES[mode]}")
        self.cases = {
            "A rare": (store.Scope(a), "rare"),
            "B rare": (store.Scope(b), "rare"),
            "B grant": (store.Scope(b), None),
        }

    def claim(self, case):
        """Claim once; return the seconds the claim took (complete and refill after)."""
        store = self.store
        scope, queue = self.cases[case]
        params = store.bind_claim(scope, "bench", queue=queue)
        started = time.perf_counter()
        row = self.conn.execute(store.lifecycle.CLAIM_SQL, params).fetchone()
        elapsed = time.perf_counter() - started
        ack = store.Ack("complete", str(row[0]), lease_token=row[18])
        self.conn.execute(store.lifecycle.ACK_SQL, store.bind_acks(scope, [ack]))
        refill = store.bind_create(scope.endpoint_id, queue=row[2], title="refill")
        self.conn.execute(store.lifecycle.CREATE_SQL, refill)
        return elapsed


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--backlog", type=int, default=300_000)
    parse.add_argument("--claims", type=int, default=300)
    args = parse.parse_args()
    empty_url = args.database_url
    backlog_url = empty_url.rsplit("/", 1)[0] + "/switchboard_bench_backlog"
    benchlib.setup_django(empty_url)
    from todos import store

    endpoints = {url: setup(url, store) for url in (empty_url, backlog_url)}
    started = time.perf_counter()
    with psycopg.connect(backlog_url, autocommit=True) as conn:
        conn.execute(BULK_SQL, [endpoints[backlog_url][0], args.backlog])
    for url in (empty_url, backlog_url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE todos")
    print(
        f"  {args.backlog:,} pending in A's bulk in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    info = benchlib.machine(empty_url)
    figures = {}
    for mode in MODES:
        claimers = {
            url: Claimer(store, url, *endpoints[url], mode)
            for url in (empty_url, backlog_url)
        }
        for case in ("A rare", "B rare", "B grant"):
            samples = {empty_url: [], backlog_url: []}
            # Turn by turn, so both tables see the same load from the machine.
            for number in range(args.claims + 10):
                for url, claimer in claimers.items():
                    seconds = claimer.claim(case)
                    if number >= 10:  # a prepared statement's first runs
                        samples[url].append(seconds)
            figures[f"{case}, {mode}"] = {
                label: {
                    "p50_ms": statistics.median(samples[url]) * 1000,
                    "p99_ms": benchlib.percentile(samples[url], 0.99) * 1000,
                }
                for label, url in (("empty", empty_url), ("backlog", backlog_url))
            }
        for claimer in claimers.values():
            claimer.conn.close()
    rows = [
        [
            case,
            f"{f['empty']['p50_ms']:.2f}",
            f"{f['backlog']['p50_ms']:.2f}",
            f"{f['backlog']['p50_ms'] / f['empty']['p50_ms']:.2f}",
            f"{f['empty']['p99_ms']:.2f}",
            f"{f['backlog']['p99_ms']:.2f}",
        ]
        for case, f in figures.items()
    ]
    benchlib.print_table(
        f"claim beside {args.backlog:,} pending in endpoint A's queue bulk, against"
        f" the same tables without it ({args.claims} claims per case; ms)",
        ["case", "p50 no backlog", "p50 backlog", "ratio", "p99 no", "p99 backlog"],
        rows,
    )
    benchlib.write_results(
        "claim_backlog",
        {
            "benchmark": "claim_backlog",
            "machine": info,
            "backlog": args.backlog,
            "figures": figures,
        },
    )


if __name__ == "__main__":
    main()
