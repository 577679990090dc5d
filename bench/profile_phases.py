"""Switchboard's ASGI application with CPU meters on the SQS path's phases.

bench/profile_served.py ``--tool phases`` serves this module's ``application``
(``bench.profile_phases:application``) instead of board.serving.asgi's: the
same application, with the functions of the SQS path's phases wrapped so that
the event loop thread's CPU time (``time.thread_time_ns``) between their
entries and exits is charged to the phase on top of a stack, each phase's own
time without the phases it calls (``PHASES`` names them). The charge is only
right while one request at a time is served: profile_served.py runs one
client process, whose calls are sequential.

``GET /__phases__`` answers the meters so far as JSON; ``POST /__phases__``
with ``{"on": true}`` or ``{"on": false}`` turns the metering on or off (off,
the wrappers only pass the call on) and zeroes the meters. Not a part of
Switchboard: a reading of where a served request's CPU goes.
"""

import contextlib
import functools
import inspect
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from board.serving import asgi, frontdoor
from todos import store
from todos.access import auth
from todos.db import pool
from todos.sqs import actions, messages, protocol, sigv4
from todos.store import rows
from todos.waiting import longpoll
from todos.web import middleware

PATH = "/__phases__"
now = time.thread_time_ns


class Meters:
    """Own CPU nanoseconds and calls per phase, charged on a stack."""

    def __init__(self) -> None:
        self.on = False
        self.reset()

    def reset(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.stack: list[str] = []
        self.mark = now()
        self.misnested = 0

    def enter(self, name: str) -> None:
        moment = now()
        if self.stack:
            self.ns[self.stack[-1]] += moment - self.mark
        self.stack.append(name)
        self.calls[name] += 1
        self.mark = moment

    def leave(self, name: str) -> None:
        moment = now()
        if not self.stack or self.stack[-1] != name:
            self.misnested += 1
            if name in self.stack:
                self.stack.remove(name)
            return
        self.ns[self.stack.pop()] += moment - self.mark
        self.mark = moment

    def report(self) -> dict[str, Any]:
        return {
            "ns": dict(self.ns),
            "calls": dict(self.calls),
            "misnested": self.misnested,
        }


meters = Meters()


def metered(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its time charged to ``name`` while metering is on."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            if not meters.on:
                return await function(*args, **kwargs)
            meters.enter(name)
            try:
                return await function(*args, **kwargs)
            finally:
                meters.leave(name)

        return run_async

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not meters.on:
            return function(*args, **kwargs)
        meters.enter(name)
        try:
            return function(*args, **kwargs)
        finally:
            meters.leave(name)

    return run


def metered_context(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """An async context manager factory with its entry and exit charged to
    ``name`` (the block's own statements are charged where they run)."""

    @contextlib.asynccontextmanager
    async def run(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        manager = function(*args, **kwargs)
        if meters.on:
            meters.enter(name)
        try:
            value = await manager.__aenter__()
        finally:
            if meters.on:
                meters.leave(name)
        try:
            yield value
        except BaseException as exc:
            if meters.on:
                meters.enter(name)
            try:
                if not await manager.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            finally:
                if meters.on:
                    meters.leave(name)
        else:
            if meters.on:
                meters.enter(name)
            try:
                await manager.__aexit__(None, None, None)
            finally:
                if meters.on:
                    meters.leave(name)

    return run


# Each phase: the functions whose own time is its (module or class, attribute).
PHASES: dict[str, list[tuple[Any, str]]] = {
    "serving: Django request, middleware, routing, answer": [
        (asgi.Handler, "__call__")
    ],
    "serving: socket writes": [(frontdoor.OneWrite, "write")],
    "long poll machinery": [(longpoll, "claim")],
    "parse: headers, Authorization": [(protocol, "_authorization")],
    "parse: host, body, JSON": [
        (protocol, "check_host"),
        (protocol, "read_body"),
        (protocol, "parse_body"),
    ],
    "credential lookup": [(auth, "aendpoint_for_access_key")],
    "SigV4: key, caller": [(protocol, "_caller")],
    "SigV4: canonical request, signature": [(sigv4, "check_signature")],
    "action: members, receipt handles": [
        (actions.ASYNC_ACTIONS, "ReceiveMessage"),
        (actions.ASYNC_ACTIONS, "DeleteMessageBatch"),
    ],
    "store: steps, pool": [
        (store, "aclaim_many"),
        (store, "aacknowledge_many"),
        (store, "arun_steps"),
        (store, "acknowledge_many_steps"),
    ],
    "store: psycopg (execute, fetch, loaders)": [(pool, "_fetch")],
    "store: rows to Todo": [(rows.Todo, "from_row")],
    "response: messages (MD5s, handles, attributes)": [(actions.Receive, "render")],
    "response: MD5 of body": [(messages, "md5_of_body")],
    "response: receipt handle": [(messages, "receipt_handle")],
    "response: JSON encoding": [(protocol, "json_response")],
    "logging": [(middleware.RequestLogMiddleware, "_log")],
}
CONTEXTS = {"store: transaction": [(pool, "transaction")]}


def install() -> None:
    for name, places in PHASES.items():
        for owner, attribute in places:
            if isinstance(owner, dict):
                owner[attribute] = metered(name, owner[attribute])
            else:
                setattr(owner, attribute, metered(name, getattr(owner, attribute)))
    for name, places in CONTEXTS.items():
        for owner, attribute in places:
            setattr(owner, attribute, metered_context(name, getattr(owner, attribute)))


install()


async def application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http" or scope["path"] != PATH:
        await asgi.application(scope, receive, send)
        return
    if scope["method"] == "POST":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        meters.on = bool(json.loads(body or b"{}").get("on"))
        meters.reset()
    answer = json.dumps({"on": meters.on, **meters.report()}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": answer})
