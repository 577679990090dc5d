"""Board page times at scale: is the Board fast over a million todos?

Question: how long does the server take to render each Board page and
/metrics over 1 000 000 todos and 5 000 000 history rows, next to the naive
queries the rollup and the indexes replace?

    python bench/board.py
    python bench/board.py --todos 1000000 --history 5000000 --rounds 30

Loads the todos with one generate_series INSERT into the Board benchmark's own
database (``switchboard_board_bench`` unless --database-url says otherwise),
mostly terminal, as a long-lived queue is: 90 % done, 5 % dead letters (from
four causes, each with varying ids and numbers), 2 % parked retries, 2 %
pending, 1 % claimed, over 3 endpoints x 4 queues; then five history rows per
todo (one INSERT ... SELECT, in time order), and the sweep loop's rollup of
the last day (timed pass by pass). Then it renders each page through Django's
full stack (middleware, session, views, templates) in this process and reports
the median and p95 server time. Beside the charts, groups and metrics it times
the naive queries they replace (counting the history, grouping every dead
letter's raw error text, counting every todo by state): the baselines.
A rerun skips the loads when the tables already hold the requested counts.

It prints each page's median and p95 (ms) and status, the baselines, and the
dead-letter groups' plan. Result: bench/results/latest/board.json
(`python bench/report.py`).
"""

import logging
import statistics
import time
from urllib.parse import urlencode

import benchlib
import psycopg

ENDPOINTS = 3
QUEUES = ("github", "reviews", "deploys", "imports")

# Each row's state follows from its position: a fixed mix, no randomness, so
# every run loads the same table. created_at walks back a second per row.
LOAD_SQL = """
WITH endpoint AS (
    SELECT array_agg(id ORDER BY name) AS ids
      FROM endpoints WHERE name LIKE 'board-bench-%%'
)
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, owner, attempt,
                   max_attempts, lease_expires_at, claimed_at, next_retry_at,
                   idempotency_key, last_error, result, created_at, updated_at,
                   available_at)
SELECT gen_random_uuid(),
       endpoint.ids[1 + n %% %(endpoints)s],
       (%(queues)s::text[])[1 + (n / 7) %% %(queue_count)s],
       'Bench todo #' || n,
       jsonb_build_object('n', n),
       s.state,
       CASE WHEN s.state IN ('claimed', 'done', 'failed') THEN 'worker-' || n %% 16 END,
       CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.kind = 'dead' THEN 1 ELSE 5 END,
       CASE WHEN s.state = 'claimed' THEN now() + interval '2 hours' END,
       CASE WHEN s.state <> 'pending' THEN now() - n * interval '1 second' END,
       CASE WHEN s.kind = 'retry' THEN now() + interval '2 hours' END,
       'delivery-' || n,
       CASE WHEN s.state <> 'failed' THEN ''
            WHEN n %% 4 = 0 THEN 'TimeoutError: upstream did not answer within '
                                 || (n %% 60) || 's (GET /orders/' || n || ')'
            WHEN n %% 4 = 1 THEN 'KeyError: customer_' || n || ' missing in payload'
            WHEN n %% 4 = 2 THEN 'HTTP 50' || (n %% 4) || ' from 10.0.' || (n %% 9)
                                 || '.' || (n %% 200) || ':8443'
            ELSE 'IntegrityError: duplicate key at 0x' || to_hex(n::bigint * 9973) END,
       CASE WHEN s.state = 'done' THEN '{"ok": true}'::jsonb END,
       now() - n * interval '1 second',
       now() - n * interval '1 second',
       now() - n * interval '1 second'
  FROM generate_series(1, %(count)s) AS n
 CROSS JOIN endpoint
 CROSS JOIN LATERAL (
     SELECT CASE WHEN n %% 100 < 90 THEN 'done'
                 WHEN n %% 100 < 95 THEN 'failed'
                 WHEN n %% 100 < 97 THEN 'failed'
                 WHEN n %% 100 < 99 THEN 'pending'
                 ELSE 'claimed' END AS state,
            CASE WHEN n %% 100 BETWEEN 90 AND 94 THEN 'dead'
                 WHEN n %% 100 BETWEEN 95 AND 96 THEN 'retry' END AS kind
 ) s
"""

REFRESH_SQL = [
    "UPDATE todos SET lease_expires_at = now() + interval '2 hours'"
    " WHERE state = 'claimed' AND lease_expires_at < now() + interval '1 hour'",
    "UPDATE todos SET next_retry_at = now() + interval '2 hours'"
    " WHERE state = 'failed' AND next_retry_at < now() + interval '1 hour'",
]

# Five history rows per todo, in time order (so the history's BRIN index on
# ``at`` is as sharp as an append-only table makes it): created, claimed, two
# heartbeats, and the row that left the todo in its state now.
HISTORY_SQL = """
INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                         actor, error, at)
SELECT t.id, t.endpoint_id, e.from_state,
       CASE WHEN e.k < 4 THEN e.to_state ELSE t.state END,
       CASE WHEN e.k = 0 THEN 0 ELSE t.max_attempts END,
       'bench', '', t.created_at + e.k * interval '12 seconds'
  FROM (SELECT id, endpoint_id, state, max_attempts, created_at FROM todos
         ORDER BY created_at DESC LIMIT %(todos)s) t
 CROSS JOIN (VALUES (0, NULL, 'pending'), (1, 'pending', 'claimed'),
                    (2, 'claimed', 'claimed'), (3, 'claimed', 'claimed'),
                    (4, 'claimed', NULL)) AS e(k, from_state, to_state)
 ORDER BY t.created_at, e.k
"""

# What the charts, the groups and /metrics would cost without the rollup, the
# fingerprint index and the partial indexes.
BASELINES = [
    (
        "charts from the history (last day)",
        "SELECT e.endpoint_id, t.queue, date_trunc('minute', e.at),"
        " count(*) FILTER (WHERE e.from_state IS NULL),"
        " count(*) FILTER (WHERE e.to_state = 'done'),"
        " count(*) FILTER (WHERE e.to_state = 'failed')"
        " FROM todo_events e JOIN todos t ON t.id = e.todo_id"
        " WHERE e.at > now() - interval '1 day' GROUP BY 1, 2, 3",
    ),
    (
        "groups by raw error text",
        "SELECT endpoint_id, queue, last_error, count(*) FROM todos"
        " WHERE state = 'failed' AND next_retry_at IS NULL GROUP BY 1, 2, 3",
    ),
    (
        "metrics by counting every todo",
        "SELECT endpoint_id, queue, state, count(*) FROM todos GROUP BY 1, 2, 3",
    ),
]


def board_url():
    """Return the Board benchmark's database: switchboard_board_bench by default."""
    return benchlib.sibling_url(benchlib.default_url(), name="switchboard_board_bench")


def load(url, count):
    """Fill todos with ``count`` rows unless it already holds exactly that many."""
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM todos").fetchone()[0]
        if have == count:
            print(f"todos already holds {count:,} rows; reusing them")
            # As the sweeps would have it: no claim lapsed, no retry window due
            # since the load (a lapsed claim is a heap read in the overview).
            for statement in REFRESH_SQL:
                conn.execute(statement)
            conn.execute("VACUUM (ANALYZE) todos")
            return
        conn.execute("TRUNCATE todos, todo_events")
        started = time.perf_counter()
        conn.execute("SET statement_timeout = 0")
        conn.execute(
            LOAD_SQL,
            {
                "count": count,
                "endpoints": ENDPOINTS,
                "queues": list(QUEUES),
                "queue_count": len(QUEUES),
            },
        )
        conn.execute("VACUUM (ANALYZE) todos")
        print(f"loaded {count:,} todos in {time.perf_counter() - started:.1f} s")


def load_history(url, rows):
    """Fill todo_events with ``rows`` rows (five per todo) unless it holds them."""
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM todo_events").fetchone()[0]
        if have == rows:
            print(f"todo_events already holds {rows:,} rows; reusing them")
            return
        conn.execute("TRUNCATE todo_events")
        conn.execute("SET statement_timeout = 0")
        conn.execute("SET work_mem = '256MB'")
        started = time.perf_counter()
        conn.execute(HISTORY_SQL, {"todos": rows // 5})
        conn.execute("VACUUM (ANALYZE) todo_events")
        print(f"loaded {rows:,} history rows in {time.perf_counter() - started:.1f} s")


def roll_up_the_day(url):
    """Run the sweep loop's rollup from a day ago until it is current; return
    each pass's seconds (the last ones are the steady state: two minutes)."""
    from todos.store import stats

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todo_minutes, todo_transition_totals")
    stats.restart_rollup(seconds_back=86400)
    passes = []
    while True:
        started = time.perf_counter()
        result = stats.roll_up_minutes()
        passes.append(time.perf_counter() - started)
        if result.end - result.start < stats.MAX_WINDOW:
            break
    started = time.perf_counter()
    stats.roll_up_minutes()
    passes.append(time.perf_counter() - started)
    return passes


def ensure_endpoints_and_operator():
    from django.contrib.auth import get_user_model

    from todos.access import endpoints
    from todos.models import Endpoint

    users = get_user_model().objects
    operator, _ = users.get_or_create(
        username="board-bench", defaults={"is_staff": True}
    )
    for index in range(ENDPOINTS):
        name = f"board-bench-{index}"
        if not Endpoint.objects.filter(name=name).exists():
            endpoints.create(name, operator, ["*"])
    return operator


def ensure_owner(endpoint):
    """A non-staff owner of one bench endpoint: the Board in an owner's scope."""
    from django.contrib.auth import get_user_model

    owner, _ = get_user_model().objects.get_or_create(username="board-bench-owner")
    type(endpoint).objects.filter(id=endpoint.id).update(owner=owner)
    return owner


def measure(client, path, rounds, headers=None):
    """Return (median ms, p95 ms, status) of GET path, after one warm-up."""
    response = client.get(path, headers=headers or {})
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path, headers=headers or {})
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    return statistics.median(times), p95, response.status_code


def timed_sql(query, rounds):
    """Return (median ms, p95 ms) of a raw query: the baselines."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 0")
        cursor.execute(query)
        for _ in range(rounds):
            started = time.perf_counter()
            cursor.execute(query)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(round(0.95 * (len(times) - 1)))]


def explain(query, params):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS OFF, TIMING OFF) " + query, params)
        return [row[0] for row in cursor.fetchall()]


def row(label, median, p95, status=""):
    print(f"{label:<44} {median:>10.1f} {p95:>8.1f}  {status}")


def main():
    parse = benchlib.parser(__doc__)
    parse.set_defaults(database_url=board_url())
    parse.add_argument("--todos", type=int, default=1_000_000, help="(1000000)")
    parse.add_argument("--history", type=int, default=5_000_000, help="(5000000)")
    parse.add_argument("--rounds", type=int, default=30, help="renders per page (30)")
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, todos=20_000, history=100_000, rounds=3)
    result = benchlib.Result("board", args)

    benchlib.prepare_database(args.database_url)
    benchlib.setup_django(args.database_url)
    # The renders' request log lines would bury the table (made, not written).
    logging.getLogger("switchboard.request").propagate = False
    logging.getLogger("switchboard.request").handlers = [logging.NullHandler()]
    from django.conf import settings
    from django.test import Client

    from todos import store
    from todos.models import Endpoint
    from todos.store import stats

    operator = ensure_endpoints_and_operator()
    load(args.database_url, args.todos)
    load_history(args.database_url, args.history)
    passes = roll_up_the_day(args.database_url)
    print(
        f"rolled the last day up in {len(passes)} passes, {sum(passes):.1f} s"
        f" (the longest {max(passes) * 1000:.0f} ms); a steady pass"
        f" {passes[-1] * 1000:.0f} ms"
    )
    endpoint = Endpoint.objects.get(name="board-bench-1")
    for name in QUEUES:
        store.ensure_queue(store.Scope.for_endpoint(endpoint), name)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(operator)
    owner = Client(HTTP_HOST="127.0.0.1")
    owner.force_login(ensure_owner(endpoint))
    settings.SWITCHBOARD_METRICS_TOKEN = "board-bench-metrics-token"
    bearer = {"Authorization": "Bearer board-bench-metrics-token"}
    group = stats.dead_letter_groups(endpoint_ids=[str(endpoint.id)])[0]
    group_query = urlencode(
        {
            "endpoint": group.endpoint_id,
            "queue": group.queue,
            "state": "dead_letter",
            "fingerprint": group.fingerprint,
        }
    )
    queue_page = f"/board/queues/{endpoint.id}/reviews/"

    pages = [
        ("overview (counts + hour charts)", client, "/board/", None),
        (
            "overview counts (htmx poll)",
            client,
            "/board/",
            {"HX-Request": "true", "HX-Target": "counts"},
        ),
        ("overview, day charts", client, "/board/?range=day", None),
        ("overview as an owner (one endpoint)", owner, "/board/", None),
        ("dead-letter groups", client, "/board/dead-letters/", None),
        ("dead-letter groups as an owner", owner, "/board/dead-letters/", None),
        ("queue page (figures, settings, charts)", client, queue_page, None),
        ("queue page, day charts", client, queue_page + "?range=day", None),
        ("list, one dead-letter group", client, f"/board/todos/?{group_query}", None),
        (
            "retry-group preview",
            client,
            f"/board/todos/retry-matching/?{group_query}",
            None,
        ),
        ("list, no filter", client, "/board/todos/", None),
        (
            "list rows (htmx poll)",
            client,
            "/board/todos/",
            {"HX-Request": "true", "HX-Target": "rows"},
        ),
        ("list, dead letters", client, "/board/todos/?state=dead_letter", None),
        (
            "list, endpoint + queue + pending",
            client,
            f"/board/todos/?endpoint={endpoint.id}&queue=reviews&state=pending",
            None,
        ),
        ("list, text search", client, "/board/todos/?q=delivery-4242", None),
        ("list, text search matching nothing", client, "/board/todos/?q=zq9x", None),
        (
            "retry-matching preview (dead letters)",
            client,
            "/board/todos/retry-matching/?state=dead_letter",
            None,
        ),
        (
            "cancel-matching preview (pending)",
            client,
            "/board/todos/cancel-matching/?state=pending",
            None,
        ),
        ("/metrics (bearer token)", Client(HTTP_HOST="127.0.0.1"), "/metrics", bearer),
    ]
    print(
        f"\nServer time over {args.todos:,} todos and {args.history:,} history rows,"
        f" {args.rounds} rounds each"
    )
    print(f"{'page':<44} {'median ms':>10} {'p95 ms':>8}  status")
    timed_pages = []
    for label, the_client, path, headers in pages:
        median, p95, status = measure(the_client, path, args.rounds, headers)
        row(label, median, p95, status)
        timed_pages.append(
            {"page": label, "median_ms": median, "p95_ms": p95, "status": status}
        )

    print("\nBaselines: the naive queries the rollup and the indexes replace")
    baselines = []
    for label, query in BASELINES:
        median, p95 = timed_sql(query, max(3, args.rounds // 6))
        row(label, median, p95)
        baselines.append({"query": label, "median_ms": median, "p95_ms": p95})

    print("\nPlan of the dead-letter groups:")
    sql = stats.DEAD_LETTER_GROUPS_SQL.format(scope="TRUE")
    plan = explain(sql, {"limit": stats.GROUP_LIMIT})
    for line in plan:
        print("  " + line)
    result.write(
        {"todos": args.todos, "history": args.history, "rounds": args.rounds},
        benchlib.rounded(
            {
                "rollup": {
                    "passes": len(passes),
                    "seconds": sum(passes),
                    "steady_pass_ms": passes[-1] * 1000,
                },
                "pages": timed_pages,
                "baselines": baselines,
                "dead_letter_groups_plan": plan,
            }
        ),
    )


if __name__ == "__main__":
    main()
