"""The front door under a flood: a worker's memory and disk stay flat.

Starts the real serving (gunicorn, the project's config, one worker) on a free
loopback port, then for ``--seconds``:

- ``--clients`` clients (20) each POST 200 MiB bodies to the agent API and to
  SQS, again and again, half of them with a declared ``Content-Length`` and
  half chunked, sending as fast as the server reads;
- ``--idle`` connections (200) are held half-open: a request head begun and
  never finished, each reopened when the server closes it;
- ``/healthz`` is probed every 0.2 s on a new connection, from a process of
  its own;

while the worker's RSS and the bytes under its temp dir (``TMPDIR``, files
and the deleted ones it holds open) are sampled every 0.1 s. Prints the
figures: RSS before, the highest during and after; the most temp-dir bytes;
what the flooding clients sent and were answered; how long the half-open
connections lived; the /healthz answers and their slowest latency.

Run with the database the server should use (``make db`` starts the local
one): ``SB_PG_PORT=54329 .venv/bin/python scripts/front_door.py``. Bounded
(about ``--seconds`` + 5 s) and loopback only.
"""

import argparse
import multiprocessing
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY_BYTES = 200 * 1024 * 1024
PIECE = b"x" * (1024 * 1024)
MiB = 1024 * 1024


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port, temp_dir):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "board.settings",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(48),
        "TMPDIR": temp_dir,
    }
    process = subprocess.Popen(
        [
            sys.executable,
            *("-m", "gunicorn", "-c", "gunicorn.conf.py"),
            *("--bind", f"127.0.0.1:{port}", "--workers", "1"),
            *("--log-level", "warning"),
        ],
        cwd=ROOT,
        env={**env, "LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit("front_door: gunicorn did not start")
            time.sleep(0.1)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    while not children.read_text().split():
        time.sleep(0.05)
    return process, int(children.read_text().split()[0])


def cpu_seconds(pid):
    """The process's CPU time so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def temp_dir_bytes(pid, temp_dir):
    """Bytes of the files under ``temp_dir`` and of those the worker holds
    open there (Python's temporary files are deleted at once: no name)."""
    total = 0
    for path in Path(temp_dir).rglob("*"):
        if path.is_file():
            total += path.stat().st_size
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(temp_dir) and "(deleted)" in os.readlink(fd):
                total += os.stat(fd).st_size
        except OSError:
            continue
    return total


def read_status(sock):
    """The status of the answer on ``sock``, or None when it was closed unanswered."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return int(data.split()[1])


class Flood:
    """One client POSTing 200 MiB bodies until ``stop`` is set."""

    def __init__(self, port, chunked, path, stop):
        self.port, self.chunked, self.path, self.stop = port, chunked, path, stop
        self.sent = 0
        self.requests = 0
        self.answers = {}

    def head(self):
        framing = (
            "Transfer-Encoding: chunked"
            if self.chunked
            else f"Content-Length: {BODY_BYTES}"
        )
        target = "X-Amz-Target: AmazonSQS.SendMessage\r\n" if self.path == "/" else ""
        return (
            f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\n{target}{framing}\r\n\r\n"
        ).encode()

    def run(self):
        piece = b"%x\r\n%s\r\n" % (len(PIECE), PIECE) if self.chunked else PIECE
        while not self.stop.is_set():
            self.requests += 1
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                try:
                    sock.sendall(self.head())
                    for _ in range(BODY_BYTES // len(PIECE)):
                        if self.stop.is_set():
                            break
                        sock.sendall(piece)
                        self.sent += len(PIECE)
                except OSError:
                    pass  # the server stopped reading and closed
                status = read_status(sock)
            self.answers[status] = self.answers.get(status, 0) + 1


class HalfOpen:
    """``count`` connections with a request head begun and never finished."""

    def __init__(self, port, count, stop):
        self.port, self.count, self.stop = port, count, stop
        self.selector = selectors.DefaultSelector()
        self.lifetimes = []

    def open_one(self):
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, time.monotonic())

    def run(self):
        for _ in range(self.count):
            self.open_one()
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                try:
                    closed = key.fileobj.recv(4096) == b""
                except ConnectionError:
                    closed = True
                if closed:
                    self.lifetimes.append(time.monotonic() - key.data)
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self.open_one()
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()


def probe_health(port, stop, answers, once=False):
    while not stop.is_set():
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                status = read_status(sock)
        except OSError:
            status = None
        answers.append((status, time.monotonic() - started))
        if once:
            return
        stop.wait(0.2)


def probe_into(port, stop, queue):
    answers = []
    probe_health(port, stop, answers)
    queue.put(answers)


def main():
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--seconds", type=float, default=15)
    parse.add_argument("--clients", type=int, default=20)
    parse.add_argument("--idle", type=int, default=200)
    args = parse.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="front-door-") as temp_dir:
        process, worker = start_server(port, temp_dir)
        try:
            run(args, port, worker, temp_dir)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def run(args, port, worker, temp_dir):
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        read_status(sock)
    quiet = []
    for _ in range(10):
        probe_health(port, threading.Event(), quiet, once=True)
    rss_before = rss_bytes(worker)
    cpu_before = cpu_seconds(worker)

    floods = [
        Flood(
            port,
            chunked=i % 2 == 1,
            path="/" if i % 4 >= 2 else "/api/v1/todos",
            stop=stop,
        )
        for i in range(args.clients)
    ]
    half_open = HalfOpen(port, args.idle, stop)
    threads = [threading.Thread(target=flood.run) for flood in floods]
    threads.append(threading.Thread(target=half_open.run))
    # The probe runs in a process of its own: not behind the floods' threads
    # for this process's GIL.
    probe_stop = multiprocessing.Event()
    probe_answers = multiprocessing.Queue()
    prober = multiprocessing.Process(
        target=probe_into, args=(port, probe_stop, probe_answers)
    )
    prober.start()
    for thread in threads:
        thread.start()

    rss_during = temp_most = 0
    ends = time.monotonic() + args.seconds
    while time.monotonic() < ends:
        rss_during = max(rss_during, rss_bytes(worker))
        temp_most = max(temp_most, temp_dir_bytes(worker, temp_dir))
        time.sleep(0.1)
    stop.set()
    probe_stop.set()
    cpu_during = cpu_seconds(worker) - cpu_before
    health = probe_answers.get(timeout=15)
    prober.join(15)
    for thread in threads:
        thread.join(15)
    time.sleep(1)
    rss_after = rss_bytes(worker)

    sent = sum(flood.sent for flood in floods)
    requests = sum(flood.requests for flood in floods)
    answers = {}
    for flood in floods:
        for status, count in flood.answers.items():
            answers[status] = answers.get(status, 0) + count
    healthy = sum(1 for status, _ in health if status == 200)
    lives = sorted(half_open.lifetimes)

    print(
        f"front door: {args.seconds:g} s, {args.clients} clients POSTing 200 MiB "
        f"bodies (declared and chunked, API and SQS), {args.idle} half-open "
        "connections, one worker"
    )
    print(
        f"worker RSS: before {rss_before / MiB:.1f} MiB, highest during "
        f"{rss_during / MiB:.1f} MiB, after {rss_after / MiB:.1f} MiB"
    )
    print(f"temp dir: at most {temp_most} bytes")
    print(
        f"flood: {requests} requests, {sent / MiB:.0f} MiB sent in all "
        f"(at most {max(f.sent for f in floods) / MiB:.0f} MiB by one client); "
        "answers: "
        + ", ".join(
            f"{'closed unanswered' if status is None else status}: {count}"
            for status, count in sorted(answers.items(), key=lambda kv: str(kv[0]))
        )
    )
    if lives:
        print(
            f"half-open connections: {len(lives)} closed by the server, after "
            f"{lives[0]:.1f}-{lives[-1]:.1f} s"
        )
    else:
        print("half-open connections: none closed by the server")
    print(
        f"worker CPU during the flood: {cpu_during:.1f} s in {args.seconds:g} s "
        f"({os.cpu_count()} cores on this machine, load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    print(
        f"/healthz: {healthy} of {len(health)} answered 200 during, median "
        f"{median_ms(health):.0f} ms, slowest {slowest_ms(health):.0f} ms "
        f"(before: median {median_ms(quiet):.0f} ms, slowest "
        f"{slowest_ms(quiet):.0f} ms)"
    )


def median_ms(answers):
    latencies = sorted(seconds for _, seconds in answers)
    return latencies[len(latencies) // 2] * 1000


def slowest_ms(answers):
    return max(seconds for _, seconds in answers) * 1000


if __name__ == "__main__":
    main()
