"""An SQS server that does nothing: the ceiling of boto3's rate on this machine.

    python -m gunicorn -k uvicorn_worker.UvicornWorker -w 2 bench.sqs_ceiling:app

bench/sqs_throughput.py's ``sqs_ceiling10`` runs the same boto3 loop as
``sqs10`` (ReceiveMessage of 10, DeleteMessageBatch of the 10) against this
raw ASGI app, served the way Switchboard is (gunicorn, two uvicorn workers,
uvloop, httptools), instead of against Switchboard. It verifies no signature,
touches no database and answers from memory: ten messages with their exact
MD5s (boto3 checks them) and receipt handles, and every delete as Successful.
What boto3 and the HTTP stack cost is all that is left, so no SQS server on
the same machine, with the same clients, can run faster than this.
"""

import hashlib
import inspect
import json
import uuid

BODY = json.dumps({"bench": "ceiling", "padding": "x" * 40})
MD5 = hashlib.md5(BODY.encode()).hexdigest()
HEADERS = [
    (b"content-type", b"application/x-amz-json-1.0"),
]


def receive(request):
    count = min(int(request.get("MaxNumberOfMessages", 1)), 10)
    messages = []
    for _ in range(count):
        message_id = str(uuid.uuid4())
        messages.append(
            {
                "MessageId": message_id,
                "ReceiptHandle": f"{message_id}:{uuid.uuid4().hex}",
                "MD5OfBody": MD5,
                "Body": BODY,
            }
        )
    return {"Messages": messages}


def delete_batch(request):
    return {"Successful": [{"Id": entry["Id"]} for entry in request["Entries"]]}


def queue_url(request):
    return {"QueueUrl": f"http://127.0.0.1/000000000000/{request['QueueName']}"}


ACTIONS = {
    "AmazonSQS.ReceiveMessage": receive,
    "AmazonSQS.DeleteMessageBatch": delete_batch,
    "AmazonSQS.CreateQueue": queue_url,
    "AmazonSQS.GetQueueUrl": queue_url,
}


def serve(actions):
    """A raw ASGI app answering ``actions`` (X-Amz-Target -> function of the
    decoded body; a coroutine function is awaited). bench/sqs_store.py serves
    its own actions with it."""

    async def app(scope, receive_message, send):
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive_message()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        headers = dict(scope["headers"])
        action = actions.get(headers.get(b"x-amz-target", b"").decode())
        if action is None:
            status, answer = 400, {"__type": "com.amazonaws.sqs#InvalidAction"}
        else:
            status, answer = 200, action(json.loads(b"".join(chunks) or b"{}"))
            if inspect.isawaitable(answer):
                answer = await answer
        body = json.dumps(answer, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *HEADERS,
                    (b"content-length", str(len(body)).encode()),
                    (b"x-amzn-requestid", str(uuid.uuid4()).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


app = serve(ACTIONS)
