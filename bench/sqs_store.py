"""The store's own work behind a bare SQS server: the floor of Switchboard's SQS path.

    DATABASE_URL=… SQS_STORE_ENDPOINT_ID=… python -m gunicorn \\
        -k uvicorn_worker.UvicornWorker -w 2 --pythonpath bench sqs_store:app

bench/sqs_throughput.py's ``sqs_store10`` drains this server with the same
boto3 loop as ``sqs10``. It is bench/sqs_ceiling.py's raw ASGI app with the
two store calls Switchboard makes for those requests, run as Switchboard runs
them (todos.aio's bounded pool, a pooled connection per call):
``store.claim_many`` for ReceiveMessage, rendered with the SQS surface's own
receipt handles and MD5s, and ``store.acknowledge_many`` for
DeleteMessageBatch. Left out is everything else a request to Switchboard
costs: Django's request, middleware and response, the SigV4 check and its
key lookup, the request's log line. So:

- ceiling → store: what the database work itself costs (the statements,
  psycopg, the rows);
- store → sqs10: what serving it as an authenticated Django request costs.

``async_app`` (``sqs_store_async10``) runs the same two statements, bound by
the store's own ``bind_claim``/``bind_acks`` and read back by ``Todo.from_row``,
on psycopg's AsyncConnectionPool in the event loop instead: no thread hop,
no Django database layer. It measures what that serving would give, not a
path Switchboard has.
"""

import os

import django
from psycopg_pool import AsyncConnectionPool

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")
django.setup()

from sqs_ceiling import queue_url, serve  # noqa: E402 (after django.setup)

from todos import aio, store  # noqa: E402
from todos.sqs import messages  # noqa: E402
from todos.store import lifecycle  # noqa: E402

# The bench's endpoint is granted every queue: Scope.for_endpoint would give
# the same scope, without reading the endpoint first.
SCOPE = store.Scope(os.environ.get("SQS_STORE_ENDPOINT_ID", ""))


def _queue(request):
    return request["QueueUrl"].rstrip("/").rpartition("/")[2]


def _limit(request):
    return min(int(request.get("MaxNumberOfMessages", 1)), 10)


def _acks(entries):
    """The completes of a DeleteMessageBatch's entries, by their receipt handles."""
    acks = []
    for entry in entries:
        todo_id, token = messages.parse_receipt_handle(entry["ReceiptHandle"])
        acks.append(store.Ack("complete", todo_id, lease_token=token))
    return acks


def _claim(name, limit):
    return store.claim_many(SCOPE, "sqs", limit=limit, queue=name)


def _complete(entries):
    return store.acknowledge_many(SCOPE, _acks(entries))


async def receive(request):
    return _render(await aio.run_pooled(_claim, _queue(request), _limit(request)))


def _render(claimed):
    answer = []
    for todo in claimed:
        body, _ = messages.body_and_attributes(todo.payload)
        answer.append(
            {
                "MessageId": str(todo.id),
                "ReceiptHandle": messages.receipt_handle(todo),
                "MD5OfBody": messages.md5_of_body(body),
                "Body": body,
            }
        )
    return {"Messages": answer} if answer else {}


async def delete_batch(request):
    entries = request["Entries"]
    return _deleted(entries, await aio.run_pooled(_complete, entries))


def _deleted(entries, results):
    successful, failed = [], []
    for entry, result in zip(entries, results, strict=True):
        if isinstance(result, Exception):
            failed.append(
                {"Id": entry["Id"], "Code": type(result).__name__, "SenderFault": True}
            )
        else:
            successful.append({"Id": entry["Id"]})
    return {"Successful": successful, "Failed": failed}


def actions(receive, delete_batch):
    return {
        "AmazonSQS.ReceiveMessage": receive,
        "AmazonSQS.DeleteMessageBatch": delete_batch,
        "AmazonSQS.CreateQueue": queue_url,
        "AmazonSQS.GetQueueUrl": queue_url,
    }


app = serve(actions(receive, delete_batch))

# --- The same statements on an async pool, in the event loop -------------------

_pool = None


async def _execute(sql, params):
    global _pool
    if _pool is None:
        _pool = AsyncConnectionPool(
            os.environ["DATABASE_URL"],
            min_size=2,
            max_size=16,
            kwargs={"autocommit": True, "prepare_threshold": 5},
            open=False,
        )
        await _pool.open()
    async with _pool.connection() as conn:
        cursor = await conn.execute(sql, params)
        return await cursor.fetchall()


async def async_receive(request):
    params = store.bind_claim(
        SCOPE, "sqs", limit=_limit(request), queue=_queue(request)
    )
    rows = await _execute(lifecycle.CLAIM_SQL, params)
    return _render([store.Todo.from_row(row) for row in rows])


async def async_delete_batch(request):
    entries = request["Entries"]
    rows = await _execute(lifecycle.ACK_SQL, store.bind_acks(SCOPE, _acks(entries)))
    # The moved rows by position, as store.acknowledge_many reads them; the
    # bench's deletes all hold their leases, so the misses are not classified.
    moved = {row[len(row) - 2] - 1: store.Todo.from_row(row) for row in rows}
    results = [moved.get(i, store.NotFound()) for i in range(len(entries))]
    return _deleted(entries, results)


async_app = serve(actions(async_receive, async_delete_batch))
