"""``AsyncClient``: the same calls as ``Client`` over an async httpx client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlencode

import httpx

from switchboard_client import _core, _wire
from switchboard_client._core import Call, EventParser, Retry, raise_error, wait_slice
from switchboard_client.client import Client, default_worker, user_agent
from switchboard_client.errors import TransportError
from switchboard_client.models import Event, Todo

P = ParamSpec("P")
T = TypeVar("T")


def _method(
    op: Callable[P, Call[T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The core operation ``op`` as a coroutine method: build its call, send it."""

    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.send(op(*args, **kwargs))

    method.__name__ = op.__name__
    method.__doc__ = op.__doc__
    return method


class AsyncClient:
    """Switchboard's agent API for one endpoint token, for asyncio
    (the arguments are ``Client``'s)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        worker: str | None = None,
        timeout: float = 30.0,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.worker = worker or default_worker()
        self.retry = retry or Retry()
        self._timeout = httpx.Timeout(timeout)
        headers = {"Authorization": f"Bearer {token}", "User-Agent": user_agent()}
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=self._timeout,
            transport=transport,
        )
        # The calls go over the lean carrier unless a transport or a proxy
        # is in play (httpx carries those, and the event stream, always).
        origin = httpx.URL(self.url)
        self._wire = (
            _wire.Wire(origin, list(headers.items()))
            if transport is None and _wire.usable(origin, list(headers.items()))
            else None
        )
        self._timeouts: dict[float, httpx.Timeout] = {}

    @classmethod
    def like(cls, client: Client | AsyncClient) -> AsyncClient:
        """An async client with the same server, token, worker name and retries."""
        return cls(client.url, client._token, worker=client.worker, retry=client.retry)

    async def send(self, call: Call[T]) -> T:
        """Send one call, retried as ``self.retry`` allows; read its answer."""
        call = call.bind(self.worker)
        started, tries = time.monotonic(), 0
        while True:
            tries += 1
            try:
                response = await self._request(call)
            except httpx.TransportError as exc:
                if not self.retry.again(call, exc, tries, time.monotonic() - started):
                    raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
            else:
                if not self.retry.again(
                    call, response, tries, time.monotonic() - started
                ):
                    return call.answer(response)
            await asyncio.sleep(self.retry.delay(tries))

    async def _request(self, call: Call[Any]) -> httpx.Response:
        """One sending of ``call``: over the lean carrier when there is one."""
        timeout = self._timeouts.get(call.wait)
        if timeout is None:
            timeout = self._timeouts[call.wait] = call.timeout(self._timeout)
        if self._wire is None:
            return await self._http.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params,
                headers=call.headers,
                timeout=timeout,
            )
        target = call.path
        if call.params:
            target += "?" + urlencode(call.params)
        body = None
        if call.body is not None:
            # As httpx encodes a json= body.
            text = json.dumps(
                call.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            )
            body = text.encode("utf-8")
        return await self._wire.request(
            call.method, target, body, timeout, call.headers
        )

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

    async def wait(self, todo: Todo | str, *, timeout: float | None = None) -> Todo:
        """Wait until the todo is done, canceled, dead-lettered or held for an
        answer (or ``timeout`` seconds pass); return it as it is then."""
        todo_id = todo.id if isinstance(todo, Todo) else todo
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = wait_slice(deadline)
            current = await self.get(todo_id, wait_seconds=left)
            if current.finished or current.held or left < _core.WAIT_SLICE_SECONDS:
                return current

    async def iter_todos(self, **filters: Any) -> AsyncIterator[Todo]:
        """Every todo matching ``queue``/``state``, page after page."""
        cursor = None
        while True:
            page = await self.list_todos(cursor=cursor, **filters)
            for todo in page.todos:
                yield todo
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def events(
        self, *, read_timeout: float | None = 120.0
    ) -> AsyncIterator[Event]:
        """The endpoint's event stream, as ``Client.events``."""
        timeout = httpx.Timeout(self._timeout.connect, read=read_timeout)
        try:
            async with self._http.stream(
                "GET", "/api/v1/events", timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise_error(resp)
                parser = EventParser()
                async for line in resp.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TransportError as exc:
            raise TransportError(f"GET /api/v1/events: {exc}") from exc

    async def aclose(self) -> None:
        if self._wire is not None:
            self._wire.close()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
