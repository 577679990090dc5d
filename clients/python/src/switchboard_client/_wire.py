"""A lean HTTP/1.1 carrier for ``AsyncClient``'s calls: keep-alive
connections on asyncio streams, each answer parsed by httptools (llhttp, the
parser uvicorn serves with).

httpx's async client spends about half a millisecond of CPU on a small JSON
request (its request and response models, its cookie jar, anyio, httpcore's
pool and h11's pure-Python parsing); a worker sends two requests a todo, so on
a busy machine that CPU is a worker's throughput. This sends the same request
for a fifth of it. Its failures are httpx's own exceptions (``ConnectError``,
``ReadTimeout``, ``RemoteProtocolError``…) and its answers ``httpx.Response``,
so ``Retry`` and ``Call`` read them as they read httpx's.

``AsyncClient`` uses it for a plain ``http://`` or ``https://`` URL without a
proxy in the environment and without a transport of the caller's; httpx
carries everything else, and the event stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import ssl
from collections.abc import Mapping, Sequence
from urllib.parse import quote

import httptools
import httpx

# The environment variables that route httpx's requests through a proxy.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


# What a request target may hold unescaped (as httpx leaves a path).
TARGET_SAFE = "/!$&'()*+,;=:@-._~%?"


def usable(url: httpx.URL, headers: Sequence[tuple[str, str]]) -> bool:
    """Whether this carrier can send as httpx would: plain HTTP or TLS,
    straight to the host (no proxy from the environment), with headers that
    are printable ASCII (anything else is httpx's to refuse)."""
    if url.scheme not in ("http", "https"):
        return False
    if not all(_clean(k) and _clean(v) for k, v in headers):
        return False
    return not any(
        os.environ.get(name) or os.environ.get(name.upper()) for name in PROXY_VARIABLES
    )


def _clean(text: str) -> bool:
    return text.isascii() and text.isprintable()


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
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if default else f"{host}:{self.port}"
        self.prefix = url.raw_path.decode("ascii").split("?")[0].rstrip("/")
        fixed = [("Host", authority), ("Accept", "*/*"), *headers]
        self.head = "".join(f"{name}: {value}\r\n" for name, value in fixed)
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        timeout: httpx.Timeout,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request on an idle connection (or a new one), with
        ``headers`` beside the fixed ones; its answer, read whole. A connection
        a failure or a cancellation interrupts is closed, never reused."""
        target = quote(self.prefix + target, safe=TARGET_SAFE)
        head = f"{method} {target} HTTP/1.1\r\n{self.head}"
        if headers:
            # Only printable ASCII: a header must not end the head early.
            head += "".join(
                f"{name}: {value}\r\n"
                for name, value in headers.items()
                if _clean(name) and _clean(value)
            )
        if body is not None:
            head += "Content-Type: application/json\r\n"
            head += f"Content-Length: {len(body)}\r\n"
        request = (head + "\r\n").encode("ascii") + (body or b"")
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
                response = await connection.exchange(request, timeout)
            except BaseException:
                connection.close()
                raise
            if connection.reusable and not self._closed:
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
        """Close the idle connections; those in use close when their call ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


class _Connection:
    """One keep-alive connection."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.loop = loop
        self.reader = reader
        self.writer = writer
        self.reusable = False

    @property
    def stale(self) -> bool:
        """Whether the server closed it while it was idle: seen by the loop,
        or readable now though no answer is due (as httpcore checks, for a
        close the loop has not run since)."""
        if self.reader.at_eof() or self.writer.is_closing():
            return True
        sock = self.writer.get_extra_info("socket")
        return sock is not None and _readable(sock.fileno())

    async def exchange(self, request: bytes, timeout: httpx.Timeout) -> httpx.Response:
        """Write the request, read the whole response. The read timeout
        bounds the wait for the whole answer (a long poll's is lengthened)."""
        try:
            self.writer.write(request)
            # What the socket took at once needs no wait (nor its timer).
            if self.writer.transport.get_write_buffer_size():
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
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"reading the response: {exc}") from exc

    async def _response(self) -> httpx.Response:
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        answer.parser = parser
        while not answer.done:
            data = await self.reader.read(65536)
            if data:
                parser.feed_data(data)
            elif answer.until_closed():
                break
            else:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response."
                    if not answer.headers
                    else "Server disconnected before the end of the response."
                )
        self.reusable = answer.done and answer.keep_alive
        return httpx.Response(
            answer.status, headers=answer.headers, content=b"".join(answer.body)
        )

    def close(self) -> None:
        self.reusable = False
        # A connection of a loop that has ended is closed with it.
        with contextlib.suppress(RuntimeError):
            self.writer.close()


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read now (poll: any fd number)."""
    if not hasattr(select, "poll"):
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class _Answer:
    """httptools' callbacks: one response's status, headers and body (an
    informational 1xx before it is skipped)."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.head = False
        self.keep_alive = False
        self.done = False

    def on_message_begin(self) -> None:
        self.headers, self.body, self.head = [], [], False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        # llhttp knows it only until the message ends.
        self.keep_alive = self.parser.should_keep_alive()
        self.head = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = self.status >= 200

    def until_closed(self) -> bool:
        """Whether the server's closing the connection ends this answer: its
        head was read and it gave no length (a body read to the close)."""
        if not self.head:
            return False
        framing = {name.lower() for name, _ in self.headers}
        return not framing & {b"content-length", b"transfer-encoding"}
