"""The HTTP floor: the least a Python server on Switchboard's serving stack can do
for a claim and a complete, for bench/peers.py's ``httpfloor`` paths.

It is served as Switchboard is (gunicorn, uvicorn's worker, uvloop, httptools,
psycopg's async pool, as many processes) and answers the two routes the HTTP
single path calls, ``POST /api/v1/todos/claim`` and
``POST /api/v1/todos/<id>/complete`` (and, for the store's statements, the
batch path's ``max_todos`` claim and ``POST /api/v1/todos/batch`` of
completes), each with one statement and nothing else:
no framework, no middleware, no log line, no validation but the bearer token
compared with one string. Two sets of statements:

- ``/api/v1/...``: the bare loop's (peers.BARE_CLAIM_SQL and
  peers.BARE_COMPLETE_SQL on peers' bare table: no history row, no doorbell);
- ``/store/api/v1/...``: the store's own (``CLAIM_PLAIN_SQL`` and the one
  acknowledgement, bound by ``store.bind_claim`` and ``store.bind_acks``, as
  benchlib.plain_step runs them), so PostgreSQL does exactly the work it does
  for Switchboard's HTTP single path.

What it costs per claim+complete pair is what any HTTP surface on this stack
pays before it does any of Switchboard's own work.

    FLOOR_DATABASE_URL=... FLOOR_ENDPOINT_ID=... FLOOR_TOKEN=... \\
        gunicorn -k uvicorn_worker.UvicornWorker -w 2 floor_server:app
"""

import hmac
import os
import sys

import benchlib
import orjson
from peers import BARE_CLAIM_SQL, BARE_COMPLETE_SQL
from psycopg_pool import AsyncConnectionPool

DATABASE_URL = os.environ.get("FLOOR_DATABASE_URL", "")
ENDPOINT_ID = os.environ.get("FLOOR_ENDPOINT_ID", "")
AUTHORIZATION = f"Bearer {os.environ.get('FLOOR_TOKEN', '')}".encode()
STORE_PREFIX = "/store"
CLAIM_PATH = "/api/v1/todos/claim"
BATCH_PATH = "/api/v1/todos/batch"
TODO_PREFIX, COMPLETE_SUFFIX = "/api/v1/todos/", "/complete"
HEADERS = [(b"content-type", b"application/json")]
# TODO_COLUMNS' place of lease_token (as benchlib.plain_step reads it).
LEASE_TOKEN_COLUMN = 18

pool = AsyncConnectionPool(
    DATABASE_URL, min_size=2, max_size=4, kwargs={"autocommit": True}, open=False
)
store = lifecycle = store_scope = None


def setup_store():
    """The store's statements and binders (Django configured, no connection)."""
    global store, lifecycle, store_scope
    # Served from bench/, whose board.py would hide Switchboard's board package.
    sys.path.insert(0, str(benchlib.ROOT))
    benchlib.setup_django(DATABASE_URL)
    from todos import store
    from todos.store import lifecycle

    store_scope = store.Scope(ENDPOINT_ID)


async def answer(send, status, body):
    data = orjson.dumps(body)
    headers = [*HEADERS, (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def fetch_one(sql, params):
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, params)
        return await cursor.fetchone()


async def fetch_all(sql, params):
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, params)
        return await cursor.fetchall()


async def claim(data, from_store):
    worker = data["worker"]
    if from_store and "max_todos" in data:
        limit = data["max_todos"]
        params = store.bind_claim(store_scope, worker, limit=limit)
        rows = await fetch_all(lifecycle.CLAIM_PLAIN_SQL, params)
        todos = [{"id": row[0], "lease_token": row[LEASE_TOKEN_COLUMN]} for row in rows]
        return 200, {"todos": todos}
    if from_store:
        row = await fetch_one(
            lifecycle.CLAIM_PLAIN_SQL, store.bind_claim(store_scope, worker)
        )
        token = None if row is None else row[LEASE_TOKEN_COLUMN]
    else:
        params = {"worker": worker, "endpoint_id": ENDPOINT_ID, "queue": benchlib.QUEUE}
        row, token = await fetch_one(BARE_CLAIM_SQL, params), None
    if row is None:
        return 404, {"error": "not_found"}
    return 200, {"todo": {"id": row[0], "lease_token": token}}


async def complete(todo_id, data, from_store):
    worker = data["worker"]
    if from_store:
        ack = store.Ack("complete", todo_id, worker, data.get("lease_token"))
        row = await fetch_one(*store.bind_acks(store_scope, [ack]))
    else:
        params = {"id": todo_id, "worker": worker, "result": None}
        row = await fetch_one(BARE_COMPLETE_SQL, params)
    if row is None:
        return 409, {"error": "conflict"}
    return 200, {"todo": {"id": row[0], "state": "done"}}


async def batch(data):
    """The store's acknowledgement of a batch of completes (store only)."""
    acks = [
        store.Ack("complete", action["id"], data["worker"], action.get("lease_token"))
        for action in data["actions"]
    ]
    moved = len(await fetch_all(*store.bind_acks(store_scope, acks)))
    statuses = [200] * moved + [409] * (len(acks) - moved)
    return 200, {"results": [{"status": status} for status in statuses]}


async def lifespan(receive, send):
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                setup_store()
                await pool.open()
            except Exception as exc:
                failed = {"type": "lifespan.startup.failed", "message": repr(exc)}
                await send(failed)
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(receive, send)
    path = scope["path"]
    if path == "/healthz":
        return await answer(send, 200, {"status": "ok"})
    authorization = dict(scope["headers"]).get(b"authorization", b"")
    if not hmac.compare_digest(authorization, AUTHORIZATION):
        return await answer(send, 401, {"error": "unauthorized"})
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    data = orjson.loads(body or b"{}")
    from_store = path.startswith(STORE_PREFIX)
    if from_store:
        path = path[len(STORE_PREFIX) :]
    if path == CLAIM_PATH:
        return await answer(send, *await claim(data, from_store))
    if path == BATCH_PATH and from_store:
        return await answer(send, *await batch(data))
    if path.startswith(TODO_PREFIX) and path.endswith(COMPLETE_SUFFIX):
        todo_id = path[len(TODO_PREFIX) : -len(COMPLETE_SUFFIX)]
        return await answer(send, *await complete(todo_id, data, from_store))
    return await answer(send, 404, {"error": "not_found"})
