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
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")
django.setup()

from sqs_ceiling import queue_url, serve  # noqa: E402 (after django.setup)

from todos import aio, store  # noqa: E402
from todos.models import Endpoint  # noqa: E402
from todos.sqs import messages  # noqa: E402

_scope = None


def scope():
    global _scope
    if _scope is None:
        endpoint = Endpoint.objects.get(id=os.environ["SQS_STORE_ENDPOINT_ID"])
        _scope = store.Scope.for_endpoint(endpoint)
    return _scope


def _queue(request):
    return request["QueueUrl"].rstrip("/").rpartition("/")[2]


def _claim(name, limit):
    return store.claim_many(scope(), "sqs", limit=limit, queue=name)


def _complete(handles):
    actions = []
    for handle in handles:
        todo_id, token = messages.parse_receipt_handle(handle)
        actions.append(store.Ack("complete", todo_id, lease_token=token))
    return store.acknowledge_many(scope(), actions)


async def receive(request):
    limit = min(int(request.get("MaxNumberOfMessages", 1)), 10)
    claimed = await aio.run_pooled(_claim, _queue(request), limit)
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
    results = await aio.run_pooled(
        _complete, [entry["ReceiptHandle"] for entry in entries]
    )
    successful, failed = [], []
    for entry, result in zip(entries, results, strict=True):
        if isinstance(result, Exception):
            failed.append(
                {"Id": entry["Id"], "Code": type(result).__name__, "SenderFault": True}
            )
        else:
            successful.append({"Id": entry["Id"]})
    return {"Successful": successful, "Failed": failed}


app = serve(
    {
        "AmazonSQS.ReceiveMessage": receive,
        "AmazonSQS.DeleteMessageBatch": delete_batch,
        "AmazonSQS.CreateQueue": queue_url,
        "AmazonSQS.GetQueueUrl": queue_url,
    }
)
