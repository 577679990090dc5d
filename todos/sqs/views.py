"""``POST /``: the SQS endpoint. ``GET /`` still leads to the Board.

One view serves every action: read the body (bounded), verify its SigV4
signature, pick the action from ``X-Amz-Target``, decode the JSON members and
run the action. Every failure leaves in SQS's error shape, never as a 500
page; authentication comes first, so an unsigned caller learns nothing else.
"""

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.views.decorators.csrf import csrf_exempt

from todos import store
from todos.sqs import actions, protocol
from todos.sqs.protocol import Caller, SqsError, SqsRequest
from todos.waiting import longpoll
from todos.web import threads

# What a call runs first: ``handle``, or ``misaddressed``.
type Handler = Callable[[SqsRequest], Awaitable[actions.Body | actions.Receive]]

logger = logging.getLogger("switchboard.sqs")


@csrf_exempt
async def root(request: SqsRequest) -> HttpResponse:
    """Answer an SQS call (POST), or lead a browser to the Board.

    An async view: a send's, a receive's and an acknowledgement's statements
    are awaited in the event loop (the async store), the queue
    administration's run in the bounded pool of todos.web.threads; a waiting
    ReceiveMessage is a long poll (todos.waiting.longpoll) like the JSON API's
    claim, holding no thread and no connection.
    """
    if request.method != "POST":
        return HttpResponseRedirect("/board/")
    return await _answer(request, handle)


async def _answer(request: SqsRequest, handler: Handler) -> HttpResponse:
    """Run ``handler(request)`` and answer its outcome, or its failure in SQS's
    error shape."""
    call = Call(request, handler)
    try:
        claimed = await longpoll.claim(call)
        if call.receive is not None:
            assert isinstance(claimed, list)  # a receive claims a batch
            return protocol.json_response(call.receive.render(claimed))
        assert call.outcome is not None  # start answered the call
        return protocol.json_response(call.outcome)
    except Exception as exc:
        error = protocol.error_for(exc)
        if error is None:
            logger.exception(
                "sqs: request failed",
                extra={"fields": {"error": type(exc).__name__}},
            )
            error = SqsError("InternalFailure", "The request processing has failed.")
        return protocol.error_response(error.shape, error.message)


class Call(longpoll.LongPoll):
    """An SQS call: answered in ``start``, but a ReceiveMessage, which claims
    as a long poll."""

    def __init__(self, request: SqsRequest, handler: Handler) -> None:
        self.request, self.handler = request, handler
        self.receive: actions.Receive | None = None
        self.outcome: actions.Body | None = None

    async def start(self) -> store.Scope | None:
        outcome = await self.handler(self.request)
        if not isinstance(outcome, actions.Receive):
            self.outcome = outcome
            return None
        self.receive, self.queue, self.wait = outcome, outcome.queue.name, outcome.wait
        return outcome.queue.scope

    def _receive(self) -> actions.Receive:
        assert self.receive is not None  # start gave a scope for a receive only
        return self.receive

    async def revalidate(self) -> store.Scope:
        return await self._receive().revalidate()

    async def attempt(self, scope: store.Scope) -> list[store.Todo]:
        return await self._receive().attempt(scope)

    async def hand_back(self, scope: store.Scope, todo: store.Todo) -> None:
        """SQS's rule: a ReceiveMessage whose answer was lost still counts a
        receive (``ApproximateReceiveCount``). The message is visible again at
        once, with the receive spent."""
        await store.arelease_todo(
            scope, todo.id, todo.owner, lease_token=todo.lease_token
        )


@csrf_exempt
async def queue_path(request: SqsRequest, account_id: str, queue: str) -> HttpResponse:
    """Answer an SQS call sent to a queue URL in SQS's error shape.

    The AWS JSON protocol posts every action to the endpoint URL (``/``); a
    client that posts to a queue URL is told so, not given an HTML 404.
    """
    if request.method != "POST" or "X-Amz-Target" not in request.headers:
        raise Http404
    return await _answer(request, misaddressed)


async def misaddressed(request: SqsRequest) -> NoReturn:
    await _verified(request)
    raise SqsError(
        "InvalidAddress",
        "Send SQS requests to the endpoint URL (POST /): the queue URL is the "
        "QueueUrl member of the request.",
    )


async def _verified(request: SqsRequest) -> tuple[bytes, Caller]:
    """The request's raw body and its authenticated Caller."""
    protocol.check_host(request)
    raw = protocol.read_body(request)
    return raw, await protocol.aauthenticate(request, raw)


async def handle(request: SqsRequest) -> actions.Body | actions.Receive:
    """Run the action the request names: an async one awaited here, a sync
    one (queue administration) in a pooled thread."""
    raw, caller = await _verified(request)
    # From META: request.headers would map every header of the request for it.
    target: str = request.META.get("HTTP_X_AMZ_TARGET", "")
    name = target.removeprefix(protocol.TARGET_PREFIX)
    known = target.startswith(protocol.TARGET_PREFIX)
    awaited = actions.ASYNC_ACTIONS.get(name) if known else None
    if awaited is not None:
        request.sqs_action = name
        return await awaited(request, caller, protocol.parse_body(raw))
    action = actions.ACTIONS.get(name) if known else None
    if action is None:
        if name in actions.UNSUPPORTED:
            raise SqsError(
                "UnsupportedOperation", f"{name} is not supported by Switchboard."
            )
        raise SqsError(
            "InvalidAction",
            f"The action {name or '(none)'} is not valid for this endpoint.",
        )
    request.sqs_action = name
    return await threads.run_pooled(action, request, caller, protocol.parse_body(raw))
