"""ASGI entry point: what gunicorn's uvicorn workers serve (gunicorn.conf.py).

One decision serves every request (``Handler.dispatch``): its view, as
Django's URL resolver finds it, is either

- **an ``async def`` view, served in the loop** — the agent surfaces' hot
  path: claims (long polls), acknowledgements, ``/api/v1/events``, a todo's
  result wait, MCP and SQS. It is async all through
  (board.serving.middleware.WaitingViewsMiddleware takes it past the sync
  middleware) and awaits its statements on the async store (todos.db.pool);
  what it needs that is only sync goes through ``todos.web.threads.run_pooled``. A
  waiting agent parks no thread and holds no connection;
- **or a sync view, served in a thread** — the agent API's other calls, the
  Board, webhooks, ``/healthz``, ``/metrics``, static files (and any path
  that resolves to no view) — sync Django as a threaded WSGI server serves
  it: the whole request (its signals, the sync middleware chain, the view)
  runs in one hop to the bounded, long lived threads of todos.web.threads.

Before any of them, the front door (board.serving.frontdoor) refuses a body over its
surface's limit: a declared Content-Length at once, a chunked body when it
passes the limit; the body is never spooled to disk.

Django's own handler would give each of those a new thread (asgiref's
ThreadSensitiveContext) and hop to it and back for every sync middleware and
each request signal: a ``/healthz`` cost 4.8 ms of CPU that way, a create 2.2.
The requests in the loop skip the request signals, which only reset the query log
and close the thread's connections (their pooled calls hand connections back
themselves), and Django's 4xx log line, a thread hop of its own
(todos.web.middleware.RequestLogMiddleware logs every request once).
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
)
from typing import IO, Any

import django
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import Resolver404, set_script_prefix, set_urlconf

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")
django.setup(set_prefix=False)

from board.serving import frontdoor  # noqa: E402 (needs the settings)
from board.serving.frontdoor import Receive, Scope, Send  # noqa: E402
from board.serving.middleware import routes  # noqa: E402
from todos.web import threads  # noqa: E402

# How ``Handler.serve`` answers a request it made: in the loop, or in a thread.
type How = Callable[[ASGIRequest, Receive, Send], Awaitable[None]]

request_logger = logging.getLogger("switchboard.request")


def in_loop(path: str) -> bool:
    """Whether the path's view is ``async def``: served in the event loop."""
    try:
        match = routes.resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


class SyncChain(BaseHandler):
    """Django's sync request handling, as WSGIHandler runs it, for a thread."""

    def __init__(self) -> None:
        super().__init__()
        self.load_middleware()

    def serve(self, request: ASGIRequest, script_prefix: str) -> HttpResponseBase:
        set_script_prefix(script_prefix)
        signals.request_started.send(sender=self.__class__, scope=request.scope)
        response = self.get_response(request)
        if not response.streaming:
            # Closed in this thread (request_finished gives its connection
            # back to the pool); the content is already bytes.
            response.close()
        return response


class Handler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.sync_chain = SyncChain()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] != "http":
                await super().__call__(scope, receive, send)
                return
            # The front door: no body over its surface's limit is read.
            surface = frontdoor.surface_of(scope)
            declared = frontdoor.declared_length(scope)
            if declared > surface.limit:
                await self.refuse(surface, scope, receive, send, declared)
                return
            try:
                await self.dispatch(
                    scope, frontdoor.BoundedReceive(receive, surface.limit), send
                )
            except frontdoor.BodyOverLimit as over:
                await self.refuse(surface, scope, receive, send, complete=over.complete)
        finally:
            release(scope.pop(REQUEST, None))

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if in_loop(scope["path"]):
            await self.serve(scope, receive, send, self.serve_waiting)
        else:
            await self.serve(scope, receive, send, self.serve_in_thread)

    async def refuse(
        self,
        surface: frontdoor.Surface,
        scope: Scope,
        receive: Receive,
        send: Send,
        declared: int | None = None,
        **how: bool,
    ) -> None:
        """Answer 413 for ``surface``, logged as a request (board.serving.frontdoor)."""
        response = await frontdoor.refuse(
            surface, scope, receive, send, declared, **how
        )
        request_logger.info(
            "request",
            extra={
                "fields": {
                    "method": scope["method"],
                    "route": None,
                    "status": response.status_code,
                    "outcome": "payload_too_large",
                    "surface": surface.name,
                }
            },
        )

    async def read_body(self, receive: Receive) -> IO[bytes]:
        """Read the body, bounded by the front door (in memory, never spooled)."""
        return await frontdoor.read_body(receive)

    def create_request(
        self, scope: Mapping[str, Any], body_file: IO[bytes]
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        made = super().create_request(scope, body_file)
        if made[0] is not None:
            # Django's handler passes the scope dict it was called with.
            scope[REQUEST] = made[0]  # type: ignore[index]  # the dict __call__ was given
        return made

    async def serve(self, scope: Scope, receive: Receive, send: Send, how: How) -> None:
        """Django's ``handle``: read the body, make the request, answer."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            request, response = self.create_request(scope, body_file)
            if request is not None:
                await how(request, receive, send)
            elif response is not None:
                await self.send_response(response, send)
                close_resources(response)
        finally:
            body_file.close()

    async def serve_in_thread(
        self, request: ASGIRequest, receive: Receive, send: Send
    ) -> None:
        response = await threads.run_in_thread(
            self.sync_chain.serve, request, get_script_prefix(request.scope)
        )
        if response.streaming and not response.is_async:  # type: ignore[attr-defined]  # streaming: a StreamingHttpResponse
            # A sync view's stream (a static file's, whitenoise's) is read
            # where sync code runs: Django's async send would read it whole
            # in one thread call and warn that it must.
            response.streaming_content = read_in_threads(response.streaming_content)  # type: ignore[attr-defined]  # streaming: a StreamingHttpResponse
        with contextlib.suppress(asyncio.CancelledError):
            await self.send_response(response, send)
        if response.streaming:
            await threads.run_in_thread(response.close)

    async def serve_waiting(
        self, request: ASGIRequest, receive: Receive, send: Send
    ) -> None:
        # A waiting view ends when its client goes (as in Django's handle),
        # less the request signals, thread hops and 4xx log line (see above).
        response = await self.until_disconnect(self.respond(request, send), receive)
        if response is not None:
            close_resources(response)

    async def respond(self, request: ASGIRequest, send: Send) -> HttpResponseBase:
        set_urlconf(settings.ROOT_URLCONF)
        response: HttpResponseBase = await self._middleware_chain(request)  # type: ignore[attr-defined]  # load_middleware sets it; not in its stubs
        response._resource_closers.append(request.close)  # type: ignore[attr-defined]  # HttpResponseBase sets it; not in its stubs
        with contextlib.suppress(asyncio.CancelledError):
            # The client went while the answer was being sent.
            await self.send_response(response, send)
        return response

    async def listen_for_disconnect(self, receive: Receive) -> None:
        """Return when the client disconnects.

        Django's raises RequestAborted, and the task keeps it; its traceback
        then ties the task, the handler's frame and the whole request into a
        reference cycle that only a full garbage collection frees. A waiting
        request lives long enough to reach that generation, so this returns.
        """
        message = await receive()
        if message["type"] != "http.disconnect":
            raise AssertionError(f"unexpected ASGI message {message['type']!r}")

    async def until_disconnect(
        self,
        responding: Coroutine[object, object, HttpResponseBase],
        receive: Receive,
    ) -> HttpResponseBase | None:
        """Run ``responding`` until it ends or the client disconnects.

        Return its response, or None when the client left first (the view is
        cancelled, so a waiter leaves the hub at once).
        """
        listening = asyncio.create_task(self.listen_for_disconnect(receive))
        task = asyncio.create_task(responding)
        await asyncio.wait((listening, task), return_when=asyncio.FIRST_COMPLETED)
        for other in (listening, task):
            if not other.done():
                other.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await other
        if not listening.cancelled():
            listening.result()
        if task.cancelled():
            return None
        return task.result()


# Where create_request leaves the request for __call__ to release.
REQUEST = "switchboard.request"


def release(request: HttpRequest | None) -> None:
    """Let go of what an answered ``request`` holds.

    A Django request is the hub of reference cycles: the session's lazy user,
    the messages storage, django-htmx's details and a long poll's state each
    hold it back. Refcounting cannot free a cycle; only the garbage collector
    can, and a request that lives past its first collections (a long poll,
    any request in a busy process) reaches the oldest generation, whose
    collections walk every object in the process while the event loop stands
    still (see docs/scaling.md, "Garbage collection"). Emptied once the answer
    is sent, nothing in the request holds it back, and it is freed at once.
    """
    if request is not None:
        request.__dict__.clear()


async def read_in_threads(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A sync stream's chunks, each read in the bounded pool (a file read may
    block), as an async iterator: sent as read, never held whole."""
    iterator = iter(chunks)
    while (chunk := await threads.run_in_thread(next, iterator, None)) is not None:
        yield chunk


def close_resources(response: HttpResponseBase) -> None:
    """``response.close()`` without its request_finished signal (see above)."""
    closers: list[Callable[[], object]] = response._resource_closers  # type: ignore[attr-defined]  # HttpResponseBase sets it; not in its stubs
    for closer in closers:
        with contextlib.suppress(Exception):
            closer()
    closers.clear()
    response.closed = True


application = Handler()
