"""A lean HTTP/1.1 carrier for ``AsyncClient``'s calls: keep-alive
connections on asyncio streams, the protocol spoken by h11 (the HTTP/1.1
library under httpx itself).

httpx's async client spends about half a millisecond of CPU on a small JSON
request (its request and response models, its cookie jar, anyio and httpcore's
pool around h11); a worker sends two requests a todo, so on a busy machine that
CPU is a worker's throughput. This sends the same request with a fraction of
it. Its failures are httpx's own exceptions (``ConnectError``, ``ReadTimeout``,
``RemoteProtocolError``…) and its answers ``httpx.Response``, so ``Retry`` and
``Call`` read them as they read httpx's.

``AsyncClient`` uses it for a plain ``http://`` or ``https://`` URL without a
proxy in the environment and without a transport of the caller's; httpx
carries everything else, and the event stream.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Sequence

import h11
import httpx

# The environment variables that route httpx's requests through a proxy.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def usable(url: httpx.URL) -> bool:
    """Whether this carrier can reach ``url`` as httpx would: plain HTTP or
    TLS, straight to the host (no proxy from the environment)."""
    if url.scheme not in ("http", "https"):
        return False
    return not any(
        os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARIABLES
    )


class Wire:
    """Keep-alive connections to one origin, at most ``limit`` at once (as
    httpx's default pool), the idle ones reused last-in first-out."""

    def __init__(
        self, url: httpx.URL, headers: Sequence[tuple[str, str]], limit: int = 100
    ) -> None:
        self.host = url.host
        self.tls = url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        default = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        name = f"[{self.host}]" if ":" in self.host else self.host
        authority = name if default else f"{name}:{self.port}"
        self.prefix = url.raw_path.decode("ascii").split("?")[0].rstrip("/")
        self.headers = [("Host", authority), ("Accept", "*/*"), *headers]
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)

    async def request(
        self, method: str, target: str, body: bytes | None, timeout: httpx.Timeout
    ) -> httpx.Response:
        """Send one request on an idle connection (or a new one); its answer,
        read whole. A connection a failure or a cancellation interrupts is
        closed, never reused."""
        headers = self.headers
        if body is not None:
            headers = [
                *headers,
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
            ]
        if self._slots.locked():
            try:
                async with asyncio.timeout(timeout.pool):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no connection free in time") from None
        else:
            await self._slots.acquire()
        try:
            connection = await self._connection(timeout)
            try:
                response = await connection.exchange(
                    method, self.prefix + target, headers, body, timeout
                )
            except BaseException:
                connection.close()
                raise
            if connection.reusable:
                self._idle.append(connection)
            else:
                connection.close()
            return response
        finally:
            self._slots.release()

    async def _connection(self, timeout: httpx.Timeout) -> _Connection:
        loop = asyncio.get_running_loop()
        while self._idle:
            connection = self._idle.pop()
            if connection.loop is loop and not connection.stale:
                return connection
            connection.close()
        try:
            async with asyncio.timeout(timeout.connect):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._context() if self.tls else None,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}: timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {self.host}: {exc}") from exc
        return _Connection(loop, reader, writer)

    def _context(self) -> ssl.SSLContext:
        """httpx's default TLS context (its certificates, SSL_CERT_FILE…)."""
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


class _Connection:
    """One keep-alive connection and h11's view of it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.loop = loop
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.reusable = False

    @property
    def stale(self) -> bool:
        """Whether the server closed it while it was idle."""
        return self.reader.at_eof() or self.writer.is_closing()

    async def exchange(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        timeout: httpx.Timeout,
    ) -> httpx.Response:
        """Write the request, read the whole response. The read timeout
        bounds the wait for the whole answer (a long poll's is lengthened)."""
        conn = self.h11
        try:
            request = h11.Request(method=method, target=target, headers=headers)
            data = conn.send(request) or b""
            if body:
                data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        try:
            self.writer.write(data)
            async with asyncio.timeout(timeout.write):
                await self.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("sending the request: timed out") from exc
        except OSError as exc:
            raise httpx.WriteError(f"sending the request: {exc}") from exc
        try:
            async with asyncio.timeout(timeout.read):
                return await self._response()
        except TimeoutError as exc:
            raise httpx.ReadTimeout("reading the response: timed out") from exc
        except OSError as exc:
            raise httpx.ReadError(f"reading the response: {exc}") from exc
        except h11.RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc

    async def _response(self) -> httpx.Response:
        conn = self.h11
        head: h11.Response | None = None
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response."
                )
        assert head is not None
        self.reusable = conn.our_state is h11.DONE and conn.their_state is h11.DONE
        if self.reusable:
            conn.start_next_cycle()
        return httpx.Response(
            head.status_code, headers=list(head.headers), content=b"".join(chunks)
        )

    def close(self) -> None:
        self.reusable = False
        self.writer.close()
