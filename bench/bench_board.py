"""Server time of the Board's overview and list pages over 1 000 000 todos.

Loads the todos with one generate_series INSERT into the Board benchmark's own
database (``switchboard_board_bench`` unless --database-url says otherwise),
mostly terminal, as a long-lived queue is: 90 % done, 5 % dead letters, 2 %
parked retries, 2 % pending, 1 % claimed, over 3 endpoints x 4 queues. Then it
renders each page through Django's full stack (middleware, session, views,
templates) in this process and reports the median and p95 server time, plus
each query's plan at the top.

    .venv/bin/python bench/bench_board.py [--todos 1000000] [--rounds 30]

A reload skips the load when the table already holds the requested count.
"""

import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

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
                   idempotency_key, last_error, result, created_at, updated_at)
SELECT gen_random_uuid(),
       endpoint.ids[1 + n %% %(endpoints)s],
       (%(queues)s::text[])[1 + (n / 7) %% %(queue_count)s],
       'Bench todo #' || n,
       jsonb_build_object('n', n),
       s.state,
       CASE WHEN s.state IN ('claimed', 'done', 'failed') THEN 'worker-' || n %% 16 END,
       CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.kind = 'dead' THEN 1 ELSE 5 END,
       CASE WHEN s.state = 'claimed' THEN now() + interval '5 minutes' END,
       CASE WHEN s.state <> 'pending' THEN now() - n * interval '1 second' END,
       CASE WHEN s.kind = 'retry' THEN now() + interval '10 minutes' END,
       'delivery-' || n,
       CASE WHEN s.state = 'failed' THEN 'TimeoutError: upstream did not answer'
            ELSE '' END,
       CASE WHEN s.state = 'done' THEN '{"ok": true}'::jsonb END,
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


def board_url():
    """Return the Board benchmark's database: switchboard_board_bench by default."""
    parts = urlsplit(benchlib.default_url())
    return urlunsplit(parts._replace(path="/switchboard_board_bench"))


def load(url, count):
    """Fill todos with ``count`` rows unless it already holds exactly that many."""
    with psycopg.connect(url, autocommit=True) as conn:
        have = conn.execute("SELECT count(*) FROM todos").fetchone()[0]
        if have == count:
            print(f"todos already holds {count:,} rows; reusing them")
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


def ensure_endpoints_and_operator():
    from django.contrib.auth import get_user_model

    from todos import endpoints
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


def explain(query, params):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS OFF, TIMING OFF) " + query, params)
        return [row[0] for row in cursor.fetchall()]


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.set_defaults(database_url=board_url())
    parse.add_argument("--todos", type=int, default=1_000_000)
    parse.add_argument("--rounds", type=int, default=30)
    args = parse.parse_args()

    benchlib.prepare_database(args.database_url)
    benchlib.setup_django(args.database_url)
    from django.test import Client

    from todos import store
    from todos.models import Endpoint

    operator = ensure_endpoints_and_operator()
    load(args.database_url, args.todos)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(operator)
    endpoint = Endpoint.objects.get(name="board-bench-1")

    pages = [
        ("overview", "/board/", None),
        (
            "overview counts (htmx poll)",
            "/board/",
            {"HX-Request": "true", "HX-Target": "counts"},
        ),
        ("list, no filter", "/board/todos/", None),
        (
            "list rows (htmx poll)",
            "/board/todos/",
            {"HX-Request": "true", "HX-Target": "rows"},
        ),
        ("list, dead letters", "/board/todos/?state=dead_letter", None),
        (
            "list, endpoint + queue + pending",
            f"/board/todos/?endpoint={endpoint.id}&queue=reviews&state=pending",
            None,
        ),
        ("list, text search", "/board/todos/?q=delivery-4242", None),
        (
            "retry-matching preview (dead letters)",
            "/board/todos/retry-matching/?state=dead_letter",
            None,
        ),
    ]
    print(f"\nServer time over {args.todos:,} todos, {args.rounds} rounds each")
    print(f"{'page':<42} {'median ms':>10} {'p95 ms':>8}  status")
    for label, path, headers in pages:
        median, p95, status = measure(client, path, args.rounds, headers)
        print(f"{label:<42} {median:>10.1f} {p95:>8.1f}  {status}")

    print("\nPlan of the overview's live counts:")
    for line in explain(store.LIVE_OVERVIEW_SQL.format(scope="TRUE"), {}):
        print("  " + line)


if __name__ == "__main__":
    main()
