"""The front door (board/serving/frontdoor.py) on the real serving: gunicorn's uvicorn
worker, no proxy in front. What a connection may send before Switchboard
reads it is bounded: bodies by their surface's limit (refused before they
are stored, in the surface's own error format), request heads by size and by
time, and the worker's connections by a cap.
"""

import asyncio
import contextlib
import json
import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest

from board.serving import frontdoor
from tests.support import database_url, start_gunicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HEAD_TIMEOUT_SECONDS = 1
MAX_CONNECTIONS = 20
HUGE = 200 * 1024 * 1024
API_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def front_door(django_db_setup, django_db_blocker, tmp_path_factory):
    """A gunicorn with a short head timeout, a small connection cap and its own
    temp dir: (port, the worker's pid, the temp dir)."""
    temp_dir = tmp_path_factory.mktemp("server-tmp")
    with django_db_blocker.unblock():
        process, port = start_gunicorn(
            database_url(),
            SWITCHBOARD_HEAD_TIMEOUT_SECONDS=str(HEAD_TIMEOUT_SECONDS),
            SWITCHBOARD_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
            TMPDIR=str(temp_dir),
        )
    try:
        yield port, worker_pid(process.pid), temp_dir
    finally:
        stop(process)


def worker_pid(master_pid):
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children")
    deadline = time.monotonic() + 10
    while not (pids := children.read_text().split()):
        assert time.monotonic() < deadline, "gunicorn started no worker"
        time.sleep(0.05)
    return int(pids[0])


def files_under(pid, directory):
    """The files under ``directory`` the process holds open (deleted ones too:
    Python's temporary files have no name in the directory)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        # gunicorn's own heartbeat file (WorkerTmp) lives there too.
        name = target.removeprefix(f"{directory}/")
        if name != target and not name.startswith("wgunicorn-"):
            found.append(target)
    return found


def connect(port, timeout=5):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(method, path, headers):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def read_response(sock):
    """(status, headers, body) of one response on ``sock``, or None when the
    server closed the connection without one."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body[:length]


def closed_by_server(sock):
    """True when the server has closed ``sock`` (EOF or reset)."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


# What each surface answers a body over its limit with.
def json_error(body):
    return json.loads(body)["error"]


def mcp_error(body):
    return json.loads(body)["error"]["data"]["error"]


SURFACES = [
    ("/api/v1/todos", ["Content-Type: application/json"], json_error),
    ("/hooks/github", ["Content-Type: application/json"], json_error),
    (
        "/mcp",
        ["Content-Type: application/json", "Accept: application/json"],
        mcp_error,
    ),
]


@pytest.mark.parametrize(
    ("path", "headers", "code_of"), SURFACES, ids=["api", "hooks", "mcp"]
)
def test_a_declared_oversized_body_is_refused_before_it_is_sent(
    front_door, path, headers, code_of
):
    port, pid, temp_dir = front_door
    with connect(port, timeout=3) as sock:
        sock.sendall(head("POST", path, [*headers, f"Content-Length: {HUGE}"]))
        status, answer_headers, body = read_response(sock)

        assert status == 413
        assert code_of(body) == "payload_too_large"
        # The body was never read: the connection ends with the answer.
        assert answer_headers["connection"] == "close"
        assert closed_by_server(sock)
    assert files_under(pid, temp_dir) == []


def test_a_declared_oversized_sqs_call_is_refused_in_sqss_error_shape(front_door):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        sock.sendall(
            head(
                "POST",
                "/",
                [
                    "Content-Type: application/x-amz-json-1.0",
                    "X-Amz-Target: AmazonSQS.SendMessage",
                    f"Content-Length: {HUGE}",
                ],
            )
        )
        status, headers, body = read_response(sock)

    assert status == 413
    assert json.loads(body)["__type"] == "com.amazonaws.sqs#RequestEntityTooLarge"
    assert headers["x-amzn-query-error"] == "RequestEntityTooLarge;Sender"


def test_a_declared_oversized_board_form_is_refused(front_door):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        sock.sendall(
            head(
                "POST",
                "/board/login/",
                [
                    "Content-Type: application/x-www-form-urlencoded",
                    f"Content-Length: {HUGE}",
                ],
            )
        )
        status, headers, body = read_response(sock)

    assert status == 413
    assert headers["content-type"].startswith("text/plain")
    assert b"2621440 bytes" in body


def test_a_client_waiting_to_send_is_refused_without_a_100_continue(front_door):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        sock.sendall(
            head(
                "POST",
                "/api/v1/todos",
                [
                    "Content-Type: application/json",
                    "Expect: 100-continue",
                    f"Content-Length: {API_LIMIT + 1}",
                ],
            )
        )
        status, headers, _ = read_response(sock)

    assert status == 413
    assert headers["connection"] == "close"


def upload(port, pid, temp_dir, chunked, total=64 * 1024 * 1024):
    """POST ``total`` bytes to the API from a thread, as fast as the server
    reads them, while watching the worker's open files under ``temp_dir``.

    Return (status, bytes sent, temp files seen).
    """
    sock = connect(port, timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sock.sendall(
        head("POST", "/api/v1/todos", ["Content-Type: application/json", framing])
    )
    sent = [0]
    piece = b"x" * (64 * 1024)

    def send_body():
        try:
            while sent[0] < total:
                sock.sendall(
                    b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
                )
                sent[0] += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass

    sender = threading.Thread(target=send_body)
    sender.start()
    seen = []
    answered = []
    reader = threading.Thread(target=lambda: answered.append(read_response(sock)))
    reader.start()
    while reader.is_alive():
        seen += files_under(pid, temp_dir)
        reader.join(0.05)
    # The answer is in; whatever the server still reads is dropped, bounded.
    sender.join(15)
    sock.close()
    answer = answered[0]
    return (answer[0] if answer else None), sent[0], seen


def test_a_declared_oversized_body_sent_anyway_is_neither_read_nor_stored(
    front_door,
):
    port, pid, temp_dir = front_door

    status, sent, temp_files = upload(port, pid, temp_dir, chunked=False)

    assert status == 413
    assert temp_files == []
    # Refused unread and closed: the client could not send its 64 MiB.
    assert sent < 32 * 1024 * 1024


def test_a_chunked_oversized_body_is_cut_at_the_limit(front_door):
    port, pid, temp_dir = front_door

    status, sent, temp_files = upload(port, pid, temp_dir, chunked=True)

    assert status == 413
    assert temp_files == []
    # Answered at the limit; what follows is dropped (up to 8 MiB), then the
    # connection closes: the client could not send its 64 MiB.
    assert sent < 32 * 1024 * 1024


def test_a_request_head_over_64_kib_is_answered_431(front_door):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        huge_header = "X-Padding: " + "a" * (1024 * 1024)
        with contextlib.suppress(OSError):  # closed while sending: refused too
            sock.sendall(head("GET", "/healthz", [huge_header]))
        answer = read_response(sock)

        # The whole head was sent; without the bound it would be served (200).
        assert answer is None or answer[0] == 431
        if answer is not None:
            assert json.loads(answer[2])["error"] == "request_header_fields_too_large"
        assert closed_by_server(sock)


def test_a_request_head_over_64_kib_that_arrives_at_once_is_answered_431(
    front_door,
):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        # Small enough to be read whole in one read: measured once parsed.
        sock.sendall(head("GET", "/healthz", ["X-Padding: " + "a" * (80 * 1024)]))
        answer = read_response(sock)

        assert answer is not None and answer[0] == 431
        assert closed_by_server(sock)


def test_a_request_head_under_the_limit_is_served_however_it_arrives(front_door):
    port, _, _ = front_door
    with connect(port, timeout=3) as sock:
        padding = "X-Padding: " + "a" * (60 * 1024)
        raw = head("GET", "/healthz", [padding])
        for start in range(0, len(raw), 1024):
            sock.sendall(raw[start : start + 1024])
        assert read_response(sock)[0] == 200
        # The bound is per head: a kept-alive connection's heads add up to more.
        for _ in range(3):
            sock.sendall(raw)
            assert read_response(sock)[0] == 200


def test_a_request_head_that_does_not_arrive_in_time_is_closed(front_door):
    port, _, _ = front_door
    with connect(port) as silent, connect(port) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # A byte at a time does not keep the connection: the head must arrive.
        for _ in range(3):
            time.sleep(0.3)
            slow.sendall(b"a")

        assert closed_by_server(slow)
        assert closed_by_server(silent)
        assert time.monotonic() - started < HEAD_TIMEOUT_SECONDS + 2


def test_a_kept_alive_connection_outlives_the_head_timeout_between_requests(
    front_door,
):
    port, _, _ = front_door
    with connect(port) as sock:
        for _ in range(2):
            sock.sendall(head("GET", "/healthz", []))
            status, _, _ = read_response(sock)
            assert status == 200
            # Idle after an answer is kept alive (gunicorn's keepalive), not a
            # head that is late.
            time.sleep(HEAD_TIMEOUT_SECONDS + 0.5)


def test_the_worker_holds_no_more_connections_than_its_cap(front_door):
    port, _, _ = front_door
    held = []
    refused = None
    try:
        for _ in range(MAX_CONNECTIONS + 1):
            sock = connect(port)
            # A connection over the cap is answered at once, unasked.
            if select.select([sock], [], [], 0.1)[0]:
                refused = read_response(sock)
                sock.close()
                break
            sock.sendall(head("GET", "/healthz", []))
            assert read_response(sock)[0] == 200
            held.append(sock)  # kept alive, still open

        assert refused is not None and refused[0] == 503
        assert refused[1]["connection"] == "close"
        assert json.loads(refused[2])["error"] == "unavailable"
        # The connections of the tests before may still be closing.
        assert MAX_CONNECTIONS - 3 <= len(held) < MAX_CONNECTIONS + 1
        # One goes, and a new one is served.
        held.pop().close()
        time.sleep(0.2)
        with connect(port) as sock:
            sock.sendall(head("GET", "/healthz", []))
            assert read_response(sock)[0] == 200
    finally:
        for sock in held:
            sock.close()


class RecordedTransport:
    """A transport that records its writes and its close."""

    def __init__(self):
        self.writes = []
        self.closed = False

    def write(self, data):
        self.writes.append(data)

    def is_closing(self):
        return self.closed

    def close(self):
        self.writes.append("closed")
        self.closed = True


def test_a_response_head_leaves_with_its_body_in_one_write():
    async def answer():
        transport = RecordedTransport()
        cycle_transport = frontdoor.OneWrite(transport, asyncio.get_running_loop())
        cycle_transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert transport.writes == []
        cycle_transport.write(b"{}")
        await asyncio.sleep(0)
        return transport.writes

    assert asyncio.run(answer()) == [b"HTTP/1.1 200 OK\r\n\r\n{}"]


def test_a_stream_head_leaves_at_the_next_turn_of_the_loop():
    async def stream():
        transport = RecordedTransport()
        cycle_transport = frontdoor.OneWrite(transport, asyncio.get_running_loop())
        cycle_transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        await asyncio.sleep(0)
        head_only = list(transport.writes)
        cycle_transport.write(b"data: 1\n\n")
        return head_only, transport.writes

    head_only, writes = asyncio.run(stream())
    assert head_only == [b"HTTP/1.1 200 OK\r\n\r\n"]
    assert writes == [b"HTTP/1.1 200 OK\r\n\r\n", b"data: 1\n\n"]


def test_a_waiting_head_is_written_before_the_connection_closes():
    async def head_then_close():
        transport = RecordedTransport()
        cycle_transport = frontdoor.OneWrite(transport, asyncio.get_running_loop())
        cycle_transport.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
        cycle_transport.close()
        await asyncio.sleep(0)
        return transport.writes

    assert asyncio.run(head_then_close()) == [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
        "closed",
    ]
