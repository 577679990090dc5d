"""WAL bytes and index entries per claim+complete: the previous design beside this one.

    python bench/wal_per_transition.py --cycles 2000

Two databases on one cluster, side by side in one run:

- "v1": the schema of migration 0007 (the design before store v2) running that
  design's claim and complete statements, frozen below exactly as the store
  wrote them (commit c2d581b).
- "v2": the current schema running the store's own statements
  (``lifecycle.CLAIM_SQL`` and ``lifecycle.ACK_SQL``, bound by ``store.bind_claim`` and
  ``store.bind_acks``), one todo at a time and ten at a time.

Each design drains ``--cycles`` todos on one connection (claim, then complete,
one commit each) after ``--warmup`` untimed cycles. The WAL between the start
and end LSN is read back with ``pg_walinspect`` and counted for that database
only (by the relations its records touch, plus the commit records of its
transactions), so other activity on the cluster does not count. Per todo:
WAL records, record bytes, full-page-image bytes (they depend on when the last
checkpoint was, so they are shown apart), B-tree leaf inserts (= index entries
written) and the same by index.
"""

import json
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import benchlib
import psycopg
from psycopg import sql

V1_MIGRATION = "0007_drop_redundant_endpoint_index"

# The design before store v2 (migration 0007, commit c2d581b), frozen.
V1_CLAIM_SQL = """
WITH due AS (
    SELECT id, state AS from_state FROM todos
     WHERE endpoint_id = %(endpoint_id)s
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])) AND (
    (state = 'claimed' AND lease_expires_at < now() AND attempt < max_attempts)
 OR (state = 'failed' AND next_retry_at <= now())
)
       AND (assignee IS NULL OR assignee = %(worker)s)
     ORDER BY created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), fresh AS (
    SELECT id, state AS from_state FROM todos
     WHERE endpoint_id = %(endpoint_id)s
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
       AND state = 'pending'
       AND (assignee IS NULL OR assignee = %(worker)s)
       AND NOT EXISTS (SELECT 1 FROM due)
     ORDER BY created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
), candidate AS (
    SELECT * FROM due UNION ALL SELECT * FROM fresh
), moved AS (
    UPDATE todos t
       SET state = 'claimed', owner = %(worker)s, attempt = t.attempt + 1,
           claimed_at = now(),
           lease_expires_at = now() + make_interval(secs => %(lease)s::int),
           next_retry_at = NULL, updated_at = now()
      FROM candidate c
     WHERE t.id = c.id
 RETURNING t.id, t.endpoint_id, t.queue, t.title, t.payload, t.state, t.assignee,
           t.owner, t.attempt, t.max_attempts, t.lease_expires_at, t.claimed_at,
           t.next_retry_at, t.idempotency_key, t.last_error, t.result,
           t.created_at, t.updated_at, c.from_state
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, from_state, state, attempt, %(worker)s, '', now()
      FROM moved
)
SELECT id FROM moved
"""

V1_COMPLETE_SQL = """
WITH moved AS (
    UPDATE todos SET state = 'done', result = NULL, lease_expires_at = NULL,
                     next_retry_at = NULL, updated_at = now()
     WHERE id = %(id)s AND endpoint_id = %(endpoint_id)s
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
       AND state = 'claimed' AND owner = %(worker)s
 RETURNING id, endpoint_id, queue, state, attempt, 'claimed'::text AS from_state
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, from_state, state, attempt, %(worker)s, '', now()
      FROM moved
)
SELECT id, CASE WHEN state = 'pending' THEN pg_notify('switchboard_todo_ready',
    json_build_object('id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text)
    END FROM moved
"""

FILL_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at)
SELECT gen_random_uuid(), %s, %s, 'bench ' || n, '{}'::jsonb, 'pending', 0, 5, '',
       clock_timestamp(), now()
  FROM generate_series(1, %s) AS n
"""

ENDPOINT_SQL = """
WITH owner AS (
    INSERT INTO auth_user (password, is_superuser, username, first_name, last_name,
                           email, is_staff, is_active, date_joined)
    VALUES ('!', FALSE, 'wal-bench-' || gen_random_uuid(), '', '', '', FALSE, TRUE,
            now())
    RETURNING id
)
INSERT INTO endpoints (id, name, owner_id, queues, token_hash, token_prefix,
                       created_at)
SELECT gen_random_uuid(), 'wal-bench', owner.id, '["*"]'::jsonb,
       md5(random()::text), 'wal', now()
  FROM owner
RETURNING id
"""

# This database's WAL between two LSNs: its relations' records, and the commit
# records of the transactions that wrote them.
WAL_SQL = """
WITH mine AS (
    SELECT * FROM pg_get_wal_records_info(%(start)s, %(end)s)
     WHERE block_ref LIKE %(db_pattern)s
), xids AS (SELECT DISTINCT xid FROM mine WHERE xid <> 0)
SELECT resource_manager, record_type, count(*), sum(record_length),
       sum(fpi_length)
  FROM (SELECT * FROM mine
        UNION ALL
        SELECT w.* FROM pg_get_wal_records_info(%(start)s, %(end)s) w
         WHERE w.resource_manager = 'Transaction'
           AND w.xid IN (SELECT xid FROM xids)) records
 GROUP BY 1, 2
"""

# B-tree leaf inserts by index: one per index entry written.
INDEX_ENTRIES_SQL = """
SELECT c.relname, count(*)
  FROM pg_get_wal_records_info(%(start)s, %(end)s) w
  JOIN pg_class c
    ON w.block_ref LIKE '%%/' || %(db_oid)s || '/' || c.relfilenode || ' %%'
 WHERE w.resource_manager = 'Btree' AND w.record_type LIKE 'INSERT_LEAF%%'
 GROUP BY c.relname
 ORDER BY c.relname
"""


def sibling(url, name):
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def prepare(url, migration):
    """Create the database when missing and migrate it to ``migration``."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    env = benchlib.django_env(url, SWITCHBOARD_STATEMENT_TIMEOUT_MS="0")
    command = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
    subprocess.run(command, cwd=benchlib.ROOT, env=env, check=True)
    if migration:
        subprocess.run(
            [*command, "todos", migration], cwd=benchlib.ROOT, env=env, check=True
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute("TRUNCATE todos, todo_events")
        endpoint_id = str(conn.execute(ENDPOINT_SQL).fetchone()[0])
    return endpoint_id


def v1_steps(conn, endpoint_id, batch):
    params = {"endpoint_id": endpoint_id, "queues": None, "worker": "w1", "lease": 300}

    def cycle():
        row = conn.execute(V1_CLAIM_SQL, params).fetchone()
        if row is None:
            raise RuntimeError("the queue ran dry")
        done = conn.execute(V1_COMPLETE_SQL, {**params, "id": row[0]}).fetchone()
        if done is None:
            raise RuntimeError("complete matched no row")
        return 1

    return cycle


def v2_steps(conn, endpoint_id, batch):
    from todos import store
    from todos.store import lifecycle

    scope = store.Scope(endpoint_id)
    claim_params = store.bind_claim(scope, "w1", limit=batch)

    def cycle():
        rows = conn.execute(lifecycle.CLAIM_SQL, claim_params).fetchall()
        if not rows:
            raise RuntimeError("the queue ran dry")
        acks = [store.Ack("complete", str(r[0]), lease_token=r[18]) for r in rows]
        done = conn.execute(lifecycle.ACK_SQL, store.bind_acks(scope, acks)).fetchall()
        if len(done) != len(rows):
            raise RuntimeError("a complete matched no row")
        return len(rows)

    return cycle


def measure(url, endpoint_id, steps, cycles, warmup, batch):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL_SQL, [endpoint_id, benchlib.QUEUE, (cycles + warmup) + 100])
        conn.execute("VACUUM ANALYZE todos")
        conn.execute("VACUUM ANALYZE todo_events")
        conn.execute("CHECKPOINT")
        db_oid = conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()[0]
        cycle = steps(conn, endpoint_id, batch)
        done = 0
        while done < warmup:
            done += cycle()
        start = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        started = time.perf_counter()
        done = 0
        while done < cycles:
            done += cycle()
        seconds = time.perf_counter() - started
        end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        bound = {
            "start": start,
            "end": end,
            "db_pattern": f"%/{db_oid}/%",
            "db_oid": str(db_oid),
        }
        kinds = conn.execute(WAL_SQL, bound).fetchall()
        indexes = dict(conn.execute(INDEX_ENTRIES_SQL, bound).fetchall())
    records = sum(row[2] for row in kinds)
    record_bytes = sum(row[3] for row in kinds) - sum(row[4] for row in kinds)
    fpi_bytes = sum(row[4] for row in kinds)
    entries = sum(indexes.values())
    return {
        "todos": done,
        "seconds": seconds,
        "records_per_todo": records / done,
        "bytes_per_todo": record_bytes / done,
        "fpi_bytes_per_todo": fpi_bytes / done,
        "index_entries_per_todo": entries / done,
        "index_entries_by_index": {name: n / done for name, n in indexes.items()},
        "records_by_kind": {
            f"{rm}/{kind}": {"records": count / done, "bytes": size / done}
            for rm, kind, count, size, _ in kinds
        },
    }


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--cycles", type=int, default=2000)
    parse.add_argument("--warmup", type=int, default=200)
    args = parse.parse_args()
    v1_url = sibling(args.database_url, "switchboard_bench_wal_v1")
    v2_url = sibling(args.database_url, "switchboard_bench_wal_v2")
    designs = [
        ("v1 (0007) single", v1_url, V1_MIGRATION, v1_steps, 1),
        ("v2 single", v2_url, None, v2_steps, 1),
        ("v2 batch 10", v2_url, None, v2_steps, 10),
    ]
    benchlib.setup_django(v2_url)
    info = benchlib.machine(args.database_url)
    runs = []
    for label, url, migration, steps, batch in designs:
        endpoint_id = prepare(url, migration)
        figures = measure(url, endpoint_id, steps, args.cycles, args.warmup, batch)
        runs.append({"design": label, **figures})
        print(f"  {label}: {json.dumps(figures['index_entries_by_index'])}")
    base = runs[0]
    rows = [
        [
            run["design"],
            f"{run['records_per_todo']:.1f}",
            f"{run['bytes_per_todo']:,.0f}",
            f"{run['bytes_per_todo'] / base['bytes_per_todo']:.2f}",
            f"{run['fpi_bytes_per_todo']:,.0f}",
            f"{run['index_entries_per_todo']:.1f}",
        ]
        for run in runs
    ]
    benchlib.print_table(
        f"WAL per todo claimed and completed ({args.cycles} todos each, one "
        "connection; bytes without full-page images, FPI bytes apart)",
        [
            "design",
            "records",
            "bytes",
            "bytes/v1",
            "FPI bytes",
            "index entries",
        ],
        rows,
    )
    benchlib.write_results(
        "wal_per_transition",
        {"benchmark": "wal_per_transition", "machine": info, "runs": runs},
    )


if __name__ == "__main__":
    main()
