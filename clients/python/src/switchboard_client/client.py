"""``Client``: the API over a synchronous httpx client.

Each operation is the core's (``_core``), carried by ``send``; the async
client (``aio.py``) carries the same calls over an async httpx client.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from switchboard_client import _core
from switchboard_client._core import Call, EventParser, Retry, raise_error, wait_slice
from switchboard_client.errors import TransportError
from switchboard_client.models import Event, Todo

P = ParamSpec("P")
T = TypeVar("T")


def default_worker() -> str:
    """A worker name unique on this host: ``<hostname>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def user_agent() -> str:
    return f"switchboard-client/0.1 httpx/{httpx.__version__}"


def _method(op: Callable[P, Call[T]]) -> Callable[Concatenate[Client, P], T]:
    """The core operation ``op`` as a method: build its call, send it."""

    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.send(op(*args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method


class Client:
    """Switchboard's agent API for one endpoint token.

    ``worker`` names this caller on claims and owner calls that carry no lease
    token (default ``<hostname>-<pid>``). ``retry`` decides what is sent again
    after a 503 or a lost connection (see ``Retry``).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        worker: str | None = None,
        timeout: float = 30.0,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.worker = worker or default_worker()
        self.retry = retry or Retry()
        self._timeout = httpx.Timeout(timeout)
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": user_agent()},
            timeout=self._timeout,
            transport=transport,
        )

    def send(self, call: Call[T]) -> T:
        """Send one call, retried as ``self.retry`` allows; read its answer."""
        call = call.bind(self.worker)
        started, tries = time.monotonic(), 0
        while True:
            tries += 1
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    params=call.params,
                    headers=call.headers,
                    timeout=call.timeout(self._timeout),
                )
            except httpx.TransportError as exc:
                if not self.retry.again(call, exc, tries, time.monotonic() - started):
                    raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
            else:
                if not self.retry.again(
                    call, response, tries, time.monotonic() - started
                ):
                    return call.answer(response)
            time.sleep(self.retry.delay(tries))

    create = _method(_core.create)
    create_many = _method(_core.create_many)
    get = _method(_core.get)
    list_todos = _method(_core.list_todos)
    claim = _method(_core.claim)
    claim_many = _method(_core.claim_many)
    claim_todo = _method(_core.claim_todo)
    heartbeat = _method(_core.heartbeat)
    complete = _method(_core.complete)
    fail = _method(_core.fail)
    release = _method(_core.release)
    ask = _method(_core.ask)
    answer = _method(_core.answer)
    cancel = _method(_core.cancel)
    retry_todo = _method(_core.retry)
    batch = _method(_core.batch)
    queues = _method(_core.queues)

    def wait(self, todo: Todo | str, *, timeout: float | None = None) -> Todo:
        """Wait until the todo is done, canceled, dead-lettered or held for an
        answer (or ``timeout`` seconds pass); return it as it is then."""
        todo_id = todo.id if isinstance(todo, Todo) else todo
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = wait_slice(deadline)
            current = self.get(todo_id, wait_seconds=left)
            if current.finished or current.held or left < _core.WAIT_SLICE_SECONDS:
                return current

    def iter_todos(self, **filters: Any) -> Iterator[Todo]:
        """Every todo matching ``queue``/``state``, page after page."""
        cursor = None
        while True:
            page = self.list_todos(cursor=cursor, **filters)
            yield from page.todos
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def events(self, *, read_timeout: float | None = 120.0) -> Iterator[Event]:
        """The endpoint's event stream (``todo.ready``, ``todo.done``…), until
        the caller stops iterating or the server ends it. Events are hints:
        claim the todo and expect a Conflict when another worker was faster."""
        timeout = httpx.Timeout(self._timeout.connect, read=read_timeout)
        try:
            with self._http.stream("GET", "/api/v1/events", timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise_error(resp)
                parser = EventParser()
                for line in resp.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as exc:
            raise TransportError(f"GET /api/v1/events: {exc}") from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
