"""Claim latency beside what a queue accumulates: terminal rows, held and
cancelled todos, another queue's backlog.

Question: does a claim stay as fast when the table around its few claimable
todos holds a million finished rows, thousands of todos held for an answer or
cancelled, or a large backlog in another queue?

    python bench/claim_latency.py                        # every case
    python bench/claim_latency.py --backlog 0 --held 10000 --canceled 10000
    python bench/claim_latency.py --backlog 1000000 --held 0 --canceled 0 \\
        --other-queue 0

Each case is timed against an empty table at the same moment, so both see the
same load on the machine: "empty" (``<database>_empty``) holds only
``--pending`` claimable todos; the case's table holds the same few beside:

- terminal: ``--backlog`` terminal rows (done, and a twentieth dead letters)
  of the same endpoint and queue;
- held: ``--held`` todos held for an answer (pending with an open question,
  half of them assigned to the timing worker, so both its lanes hold some) and
  ``--canceled`` cancelled todos, in the same queue: the claim must pass over
  them at no cost (CONTRACT §14's held todos sit past the end of every lane);
- other queue: ``--other-queue`` pending todos in endpoint A's queue ``bulk``,
  beside 200 ready todos in A's and B's ``rare``. The claims timed are A's on
  ``rare``, B's on ``rare`` and B's across its whole grant, each with custom
  plans and with the generic plan (``plan_cache_mode``), the two databases
  taking turns claim by claim.

A case whose sizes are all 0 is skipped. For the first two, one process per
table times ``--claims`` claims through ``store.claim_next`` and as many of the
store's own SQL on a bare psycopg connection (the baseline), taking turns and
paced so the two processes leave the cores to PostgreSQL; after each timed
claim the todo is completed and a replacement enqueued (untimed). The claim's
plan (EXPLAIN ANALYZE: its scans and buffers) is recorded for both tables.

It prints each case's p50, p99 and mean (ms) and the ratio case/empty (the
goal: at most 2). Result: bench/results/latest/claim_latency.json
(`python bench/report.py`).
"""

import json
import time

import benchlib
import psycopg

BACKLOG_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, owner, attempt,
                   max_attempts, next_retry_at, last_error, result, created_at,
                   updated_at)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'old ' || n, '{}'::jsonb,
       CASE WHEN n %% 20 = 0 THEN 'failed' ELSE 'done' END, 'old-worker',
       CASE WHEN n %% 20 = 0 THEN 5 ELSE 1 END, 5, NULL,
       CASE WHEN n %% 20 = 0 THEN 'gave up' ELSE '' END, '{"ok": true}'::jsonb,
       now() - interval '30 days' + n * interval '1 ms', now() - interval '1 day'
  FROM generate_series(1, %(count)s) AS n
"""


# Held todos: pending, an open question with no deadline (available_at at
# store.HELD_UNTIL_ANSWERED); every other one assigned to the timing worker.
HELD_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, assignee, attempt,
                   max_attempts, last_error, created_at, updated_at, available_at,
                   question, question_status, asked_at, answer_nonce)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'held ' || n, '{}'::jsonb,
       'pending', CASE WHEN n %% 2 = 0 THEN 'latency' END, 0, 5, '',
       now() - interval '1 day' + n * interval '1 ms', now(), %(held_until)s,
       '{"text": "go on?", "choices": null, "answer_schema": null,
         "asked_by": "latency", "return_to": "pool"}'::jsonb,
       'open', now() - interval '1 hour', md5(n::text)
  FROM generate_series(1, %(count)s) AS n
"""

CANCELED_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, result, created_at, updated_at,
                   canceled_at, cancel_request)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'canceled ' || n, '{}'::jsonb,
       'done', 0, 5, '', '{"canceled": {"reason": "bench", "by": "bench"}}'::jsonb,
       now() - interval '1 day' + n * interval '1 ms', now(), now(),
       '{"reason": "bench", "by": "bench"}'::jsonb
  FROM generate_series(1, %(count)s) AS n
"""


def build_table(url, endpoint_id, backlog, pending, held=0, canceled=0):
    """Empty the table, add the terminal backlog, the held and canceled todos and
    the pending few, analyze."""
    from todos import store

    benchlib.reset_todos(url)
    with psycopg.connect(url, autocommit=True) as conn:
        for sql, count in ((HELD_SQL, held), (CANCELED_SQL, canceled)):
            if count:
                conn.execute(
                    sql,
                    {
                        "endpoint_id": endpoint_id,
                        "queue": benchlib.QUEUE,
                        "count": count,
                        "held_until": store.HELD_UNTIL_ANSWERED,
                    },
                )
    if backlog:
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                BACKLOG_SQL,
                {"endpoint_id": endpoint_id, "queue": benchlib.QUEUE, "count": backlog},
            )
        print(
            f"  inserted {backlog:,} terminal rows in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    benchlib.fill_pending(url, endpoint_id, pending)


def explain_claim(url, endpoint_id, claim_sql):
    """Return the claim scan's plan (rolled back, so nothing is claimed)."""
    from todos import store

    params = store.bind_claim(store.Scope(endpoint_id), "explain")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim_sql, params
        ).fetchone()
        conn.rollback()
    plan = rows[0][0] if isinstance(rows[0], list) else json.loads(rows[0])[0]
    return plan


def plan_summary(plan):
    """Return the scans of a plan (node type, relation, index) and its buffers."""
    scans = []

    def walk(node):
        if "Scan" in node["Node Type"]:
            scans.append(
                " ".join(
                    filter(
                        None,
                        [
                            node["Node Type"],
                            node.get("Index Name") or node.get("Relation Name"),
                        ],
                    )
                )
            )
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    buffers = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get(
        "Shared Read Blocks", 0
    )
    return {
        "scans": scans,
        "buffers": buffers,
        "execution_ms": plan.get("Execution Time"),
    }


def claimers(url, endpoint_id, claim_sql, create_sql):
    """Return (store, plain) callables that claim once and return the seconds.

    Each completes its todo and enqueues a replacement after the clock stops,
    so the queue keeps the same number of claimable todos.
    """

    benchlib.setup_django(url)
    from todos import store

    scope = store.Scope(endpoint_id, None)

    def store_claim(number):
        started = time.perf_counter()
        todo = store.claim_next(scope, "latency")
        elapsed = time.perf_counter() - started
        store.complete_todo(scope, todo.id, None, lease_token=todo.lease_token)
        store.create_todo(scope, queue=benchlib.QUEUE, title=f"refill {number}")
        return elapsed

    conn = psycopg.connect(url, autocommit=True)
    claim_params = store.bind_claim(scope, "latency", lease_seconds=300)

    def plain_claim(number):
        started = time.perf_counter()
        row = conn.execute(claim_sql, claim_params).fetchone()
        elapsed = time.perf_counter() - started
        ack = store.Ack("complete", str(row[0]), lease_token=row[18])
        conn.execute(*store.bind_acks(scope, [ack]))
        conn.execute(
            create_sql,
            store.bind_create(
                endpoint_id, queue=benchlib.QUEUE, title=f"refill {number}"
            ),
        )
        return elapsed

    return store_claim, plain_claim


def latency_worker(index, urls, endpoint_ids, sqls, claims, warmup, pace):
    """Return a loop timing store and plain claims, taking turns, on one database."""
    url, endpoint_id = urls[index], endpoint_ids[index]
    store_claim, plain_claim = claimers(url, endpoint_id, *sqls)
    for number in range(warmup):
        (store_claim if number % 2 else plain_claim)(number)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE todos")

    def run(stop_at):
        latencies = {"store": [], "plain": []}
        for number in range(2 * claims):
            if time.perf_counter() > stop_at:
                break
            if number % 2:
                latencies["store"].append(store_claim(number))
            else:
                latencies["plain"].append(plain_claim(number))
            time.sleep(pace)
        return {"done": len(latencies["store"]), "latencies": latencies}

    return run


# --- Beside another queue's backlog -----------------------------------------------

BULK_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at, available_at)
SELECT gen_random_uuid(), %s, 'bulk', 'bulk ' || n, '{}'::jsonb, 'pending', 0, 5,
       '', now() - interval '1 day' + n * interval '1 ms', now(),
       now() - interval '1 day' + n * interval '1 ms'
  FROM generate_series(1, %s) AS n
"""

PLAN_MODES = {"custom": "force_custom_plan", "generic": "force_generic_plan"}
OTHER_QUEUE_CASES = ("A rare", "B rare", "B grant")


def other_queue_setup(url, store):
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
        self.conn.execute(f"SET plan_cache_mode = {PLAN_MODES[mode]}")
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
        row = self.conn.execute(store.lifecycle.CLAIM_PLAIN_SQL, params).fetchone()
        elapsed = time.perf_counter() - started
        ack = store.Ack("complete", str(row[0]), lease_token=row[18])
        self.conn.execute(*store.bind_acks(scope, [ack]))
        refill = store.bind_create(scope.endpoint_id, queue=row[2], title="refill")
        self.conn.execute(store.lifecycle.CREATE_SQL, refill)
        return elapsed


def other_queue(args):
    """Time the claims beside ``--other-queue`` pending todos in another queue."""
    from todos import store

    empty_url = benchlib.sibling_url(args.database_url, "_empty")
    backlog_url = args.database_url
    endpoints = {url: other_queue_setup(url, store) for url in (empty_url, backlog_url)}
    started = time.perf_counter()
    with psycopg.connect(backlog_url, autocommit=True) as conn:
        conn.execute(BULK_SQL, [endpoints[backlog_url][0], args.other_queue])
    for url in (empty_url, backlog_url):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE todos")
    benchlib.progress(
        f"  {args.other_queue:,} pending in A's bulk in "
        f"{time.perf_counter() - started:.1f} s"
    )
    figures = {}
    for mode in PLAN_MODES:
        claimers = {
            url: Claimer(store, url, *endpoints[url], mode)
            for url in (empty_url, backlog_url)
        }
        for case in OTHER_QUEUE_CASES:
            samples = {empty_url: [], backlog_url: []}
            # Turn by turn, so both tables see the same load from the machine.
            for number in range(args.other_claims + 10):
                for url, claimer in claimers.items():
                    seconds = claimer.claim(case)
                    if number >= 10:  # a prepared statement's first runs
                        samples[url].append(seconds)
            empty = benchlib.summary(samples[empty_url])
            beside = benchlib.summary(samples[backlog_url])
            figures[f"{case}, {mode} plan"] = {
                "empty": empty,
                "beside": beside,
                "beside_over_empty": {
                    p: beside[p] / empty[p] for p in ("p50", "p99") if empty[p]
                },
            }
        for claimer in claimers.values():
            claimer.conn.close()
    return figures


# --- The run ----------------------------------------------------------------------


def same_queue_case(args, name, sizes, endpoint_ids, urls, sqls):
    """Build the empty table and the case's, time both at once; return figures."""
    from todos.store import lifecycle

    backlog, held, canceled = sizes
    for table, url, endpoint_id, beside in zip(
        ("empty", name), urls, endpoint_ids, ((0, 0, 0), sizes), strict=True
    ):
        benchlib.progress(
            f"  {table}: {beside[0]:,} terminal rows, {beside[1]:,} held, "
            f"{beside[2]:,} cancelled, {args.pending} pending"
        )
        build_table(url, endpoint_id, beside[0], args.pending, beside[1], beside[2])
    benchlib.progress(f"  timing {args.claims} claims per path on both tables at once")
    outcomes = benchlib.run_processes(
        latency_worker,
        2,
        3600,
        (urls, endpoint_ids, sqls, args.claims, args.warmup, args.pace),
    )
    tables = {}
    for table, url, endpoint_id, outcome in zip(
        ("empty", "beside"), urls, endpoint_ids, outcomes, strict=True
    ):
        plan = plan_summary(explain_claim(url, endpoint_id, lifecycle.CLAIM_PLAIN_SQL))
        tables[table] = {
            "plan": plan,
            "store": benchlib.summary(outcome["latencies"]["store"]),
            "plain": benchlib.summary(outcome["latencies"]["plain"]),
        }
        benchlib.progress(
            f"  {table} plan: {', '.join(plan['scans'])}, {plan['buffers']} buffers"
        )
    ratios = {
        mode: {
            p: tables["beside"][mode][p] / tables["empty"][mode][p]
            for p in ("p50", "p99")
        }
        for mode in ("store", "plain")
    }
    return {
        "terminal_rows": backlog,
        "held": held,
        "canceled": canceled,
        **tables,
        "beside_over_empty": ratios,
    }


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--backlog",
        type=int,
        default=1_000_000,
        help="terminal rows beside the queue's pending todos (1000000; 0 skips)",
    )
    parse.add_argument(
        "--held",
        type=int,
        default=10_000,
        help="todos held for an answer in the same queue (10000)",
    )
    parse.add_argument(
        "--canceled",
        type=int,
        default=10_000,
        help="cancelled todos in the same queue (10000)",
    )
    parse.add_argument(
        "--other-queue",
        type=int,
        default=300_000,
        help="pending todos in another queue of the endpoint (300000; 0 skips)",
    )
    parse.add_argument("--pending", type=int, default=5, help="claimable todos (5)")
    parse.add_argument(
        "--claims", type=int, default=2000, help="timed claims per path (2000)"
    )
    parse.add_argument(
        "--other-claims",
        type=int,
        default=300,
        help="timed claims per other-queue case and plan (300)",
    )
    parse.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="untimed claims before ANALYZE and the timed ones (200)",
    )
    parse.add_argument(
        "--pace",
        type=float,
        default=0.002,
        help="seconds to pause between claims, so the two timing processes leave "
        "the cores to PostgreSQL (0.002)",
    )
    args = parse.parse_args()
    benchlib.apply_quick(
        args,
        parse,
        backlog=20_000,
        held=1_000,
        canceled=1_000,
        other_queue=20_000,
        claims=100,
        other_claims=30,
        warmup=20,
    )

    result = benchlib.Result("claim_latency", args)
    urls = (benchlib.sibling_url(args.database_url, "_empty"), args.database_url)
    endpoint_ids = []
    for url in urls:
        benchlib.prepare_database(url)
        endpoint_ids.append(benchlib.ensure_endpoint(url)[0])
    benchlib.setup_django(args.database_url)
    from todos.store import lifecycle

    sqls = (lifecycle.CLAIM_PLAIN_SQL, lifecycle.CREATE_SQL)
    cases = {}
    for name, sizes in (
        ("terminal", (args.backlog, 0, 0)),
        ("held", (0, args.held, args.canceled)),
    ):
        if any(sizes):
            benchlib.progress(f"case {name}:")
            cases[name] = same_queue_case(args, name, sizes, endpoint_ids, urls, sqls)
    if args.other_queue:
        benchlib.progress(f"case other queue: {args.other_queue:,} pending in bulk")
        cases["other_queue"] = {
            "pending_in_other_queue": args.other_queue,
            "claims": other_queue(args),
        }

    for name, case in cases.items():
        if name == "other_queue":
            benchlib.print_table(
                f"claim beside {case['pending_in_other_queue']:,} pending in endpoint "
                f"A's queue bulk, against the same tables without it "
                f"({args.other_claims} claims per case; ms)",
                ["case", "p50 empty", "p50 beside", "ratio", "p99 empty", "p99 beside"],
                [
                    [
                        label,
                        f["empty"]["p50"],
                        f["beside"]["p50"],
                        f"{f['beside_over_empty'].get('p50', float('nan')):.2f}",
                        f["empty"]["p99"],
                        f["beside"]["p99"],
                    ]
                    for label, f in case["claims"].items()
                ],
            )
            continue
        benchlib.print_table(
            f"claim latency beside {case['terminal_rows']:,} terminal rows, "
            f"{case['held']:,} held, {case['canceled']:,} cancelled "
            f"({args.claims} claims each, {args.pending} pending; ms)",
            ["table", "path", "p50", "p99", "mean", "plan buffers", "p50 ratio"],
            [
                [
                    table,
                    mode,
                    case[table][mode]["p50"],
                    case[table][mode]["p99"],
                    case[table][mode]["mean"],
                    case[table]["plan"]["buffers"],
                    f"{case['beside_over_empty'][mode]['p50']:.2f}"
                    if table == "beside"
                    else "",
                ]
                for table in ("empty", "beside")
                for mode in ("plain", "store")
            ],
        )
    result.write(
        {
            "backlog": args.backlog,
            "held": args.held,
            "canceled": args.canceled,
            "other_queue": args.other_queue,
            "pending": args.pending,
            "claims": args.claims,
            "other_claims": args.other_claims,
        },
        benchlib.rounded({"cases": cases}),
    )


if __name__ == "__main__":
    main()
