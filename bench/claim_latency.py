"""Claim latency with a large terminal backlog, next to an empty table.

    python bench/claim_latency.py --backlog 1000000 --pending 5 --claims 2000

Two databases are measured at the same time, so both see the same load on the
machine: "empty" (``<database>_empty``) holds only a few pending todos;
"backlog" holds the same few pending todos behind ``--backlog`` terminal rows
(done, and some dead letters) of the same endpoint and queue. One process per
database times ``--claims`` claims through ``store.claim_next`` and as many of
the store's SQL on a bare psycopg connection (the baseline), taking turns and
paced so the two processes do not saturate the cores. After each timed claim
the todo is completed and a replacement enqueued (untimed), so the queue always
holds ``--pending`` claimable todos. The claim scan's plan is recorded for both.

    python bench/claim_latency.py --backlog 0 --held 10000 --canceled 10000

puts, instead (or besides), ``--held`` todos held for an answer (pending, an
open question, half of them assigned to the timing worker so both of its
lanes hold some) and ``--canceled`` canceled todos (done) in the second
table's queue, beside the same few pending: the claim must pass over them at
no cost (CONTRACT §14's held todos sit past the end of every lane's range).
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


def claimers(url, endpoint_id, claim_sql, complete_sql, create_sql):
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
        conn.execute(complete_sql, store.bind_acks(scope, [ack]))
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


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--backlog", type=int, default=1_000_000)
    parse.add_argument("--pending", type=int, default=5)
    parse.add_argument(
        "--held",
        type=int,
        default=0,
        help="todos held for an answer beside the second table's queue",
    )
    parse.add_argument(
        "--canceled",
        type=int,
        default=0,
        help="canceled todos beside the second table's queue",
    )
    parse.add_argument("--claims", type=int, default=2000)
    parse.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="untimed claims before ANALYZE and the timed ones",
    )
    parse.add_argument(
        "--pace",
        type=float,
        default=0.002,
        help="seconds to pause between claims, so the two timing processes leave "
        "the cores to PostgreSQL",
    )
    args = parse.parse_args()

    urls = (args.database_url + "_empty", args.database_url)
    endpoint_ids = []
    for url in urls:
        benchlib.prepare_database(url)
        endpoint_ids.append(benchlib.ensure_endpoint(url)[0])
    benchlib.setup_django(args.database_url)
    from todos.store import lifecycle

    sqls = (lifecycle.CLAIM_SQL, lifecycle.ACK_SQL, lifecycle.CREATE_SQL)
    info = benchlib.machine(args.database_url)
    names = ("empty", "backlog")
    backlogs = (0, args.backlog)
    beside = ((0, 0), (args.held, args.canceled))
    for name, url, endpoint_id, backlog, (held, canceled) in zip(
        names, urls, endpoint_ids, backlogs, beside, strict=True
    ):
        print(
            f"{name}: {backlog:,} terminal rows, {held:,} held, {canceled:,} "
            f"canceled, {args.pending} pending",
            flush=True,
        )
        build_table(url, endpoint_id, backlog, args.pending, held, canceled)
    print(f"timing {args.claims} claims per path on both tables at once", flush=True)
    outcomes = benchlib.run_processes(
        latency_worker,
        2,
        3600,
        (urls, endpoint_ids, sqls, args.claims, args.warmup, args.pace),
    )
    tables = {}
    for name, url, endpoint_id, backlog, outcome in zip(
        names, urls, endpoint_ids, backlogs, outcomes, strict=True
    ):
        plan = plan_summary(explain_claim(url, endpoint_id, lifecycle.CLAIM_SQL))
        tables[name] = {
            "backlog": backlog,
            "held": beside[names.index(name)][0],
            "canceled": beside[names.index(name)][1],
            "plan": plan,
            "store": benchlib.summary(outcome["latencies"]["store"]),
            "plain": benchlib.summary(outcome["latencies"]["plain"]),
        }
        print(f"  {name} plan: {plan['scans']}, {plan['buffers']} buffers", flush=True)

    ratios = {
        mode: {
            p: tables["backlog"][mode][p] / tables["empty"][mode][p]
            for p in ("p50", "p99")
        }
        for mode in ("store", "plain")
    }
    rows = [
        [
            table,
            mode,
            figures[mode]["p50"],
            figures[mode]["p99"],
            figures[mode]["mean"],
            figures["plan"]["buffers"],
        ]
        for table, figures in tables.items()
        for mode in ("plain", "store")
    ]
    benchlib.print_table(
        f"claim latency (ms), {args.claims} claims each, {args.pending} pending",
        ["table", "path", "p50", "p99", "mean", "plan buffers"],
        rows,
    )
    benchlib.print_table(
        "backlog / empty",
        ["path", "p50 ratio", "p99 ratio"],
        [[mode, f"{r['p50']:.2f}", f"{r['p99']:.2f}"] for mode, r in ratios.items()],
    )
    benchlib.write_results(
        "claim_latency",
        {
            "benchmark": "claim_latency",
            "machine": info,
            "pending": args.pending,
            "claims": args.claims,
            "tables": tables,
            "backlog_over_empty": ratios,
        },
    )


if __name__ == "__main__":
    main()
