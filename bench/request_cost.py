"""Server CPU per request, by kind, through a real `make run`-style server.

    python bench/request_cost.py [--requests 300] [--streams 150]
                                 [--servings new,before] [--before REF]

For each serving — "new" (this checkout) and "before" (a `git worktree` of
REF, by default the commit before the serving of board/serving/asgi.py's
``SyncChain``) — it starts gunicorn (GUNICORN_WORKERS=2) and the sweep loop
as bench/waiters.py does, sends each kind of request one after another, and
divides the CPU the server's processes used by the number sent:

- healthz: ``GET /healthz``;
- create: ``POST /api/v1/todos``;
- claim (empty): ``POST /api/v1/todos/claim`` with nothing to claim, no wait;
- long poll (empty): the same with ``wait_seconds`` 1, 40 at once;
- overview: the Board's ``GET /board/`` (a logged-in operator);
- stream event: with ``--streams`` ``/api/v1/events`` streams open on the
  endpoint, a create, less a create's own cost, per stream (one event each).

Results: bench/results/request-cost-*.json; the figures in docs/scaling.md.
"""

import contextlib
import selectors
import socket
import sys
import threading
import time

import benchlib
import waiters

KINDS = ("healthz", "create", "claim (empty)", "long poll (empty)", "overview")


def requests_of(serving, seeds):
    api = waiters.Probe(
        serving.port, {"Authorization": f"Bearer {seeds['probe']['token']}"}
    )
    board = waiters.Probe(serving.port, {"Cookie": f"sessionid={seeds['session']}"})
    plain = waiters.Probe(serving.port, {})
    claim = {"worker": "w", "queue": "nothing-here"}
    return {
        "healthz": lambda: plain.call("GET", "/healthz"),
        "create": lambda: api.call(
            "POST", "/api/v1/todos", {"queue": "cost", "title": "probe"}
        ),
        "claim (empty)": lambda: api.call("POST", "/api/v1/todos/claim", claim),
        "long poll (empty)": lambda: api.call(
            "POST", "/api/v1/todos/claim", {**claim, "wait_seconds": 1}
        ),
        "overview": lambda: board.call("GET", "/board/"),
    }


def cost(serving, call, count, together=False):
    for _ in range(5):
        call()
    before = serving.server.cpu_seconds()
    if together:
        threads = [threading.Thread(target=call) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for _ in range(count):
            status, _, _ = call()
            assert status and status < 500, status
    return (serving.server.cpu_seconds() - before) / count * 1000


@contextlib.contextmanager
def open_streams(port, token, count):
    """``count`` event streams, read (and dropped) by one thread."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        socks.append(sock)
    stop = threading.Event()

    def drain():
        with selectors.DefaultSelector() as selector:
            for sock in socks:
                selector.register(sock, selectors.EVENT_READ)
            while not stop.is_set():
                for key, _ in selector.select(0.2):
                    with contextlib.suppress(OSError):
                        key.fileobj.recv(65536)

    reader = threading.Thread(target=drain)
    reader.start()
    time.sleep(2)
    try:
        yield
    finally:
        stop.set()
        reader.join()
        for sock in socks:
            sock.close()


def measure(name, tree, url, args, extra_env=None):
    print(f"\n== {name}: {tree}", flush=True)
    waiters.prepare_tree_database(url, tree)
    seeds = waiters.seeded(url, tree)
    benchlib.reset_todos(url)
    figures = {}
    with waiters.Serving(name, tree, url, extra_env) as serving:
        calls = requests_of(serving, seeds)
        for kind in KINDS:
            polls = kind == "long poll (empty)"
            figures[kind] = round(
                cost(serving, calls[kind], 40 if polls else args.requests, polls), 2
            )
            print(f"  {kind}: {figures[kind]} ms", flush=True)
        with open_streams(serving.port, seeds["probe"]["token"], args.streams):
            creates = 100
            before = serving.server.cpu_seconds()
            for _ in range(creates):
                calls["create"]()
                time.sleep(0.01)
            time.sleep(1)
            per_create = (serving.server.cpu_seconds() - before) / creates * 1000
        event = (per_create - figures["create"]) / args.streams * 1000
        figures["stream event (µs)"] = round(event, 1)
        print(f"  stream event: {figures['stream event (µs)']} µs", flush=True)
    return {"name": name, "tree": str(tree), "cpu_ms": figures}


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--requests", type=int, default=300)
    parse.add_argument("--streams", type=int, default=150)
    parse.add_argument("--servings", default="new,before")
    parse.add_argument(
        "--before",
        default="9b9e689^",
        help="the previous serving's git ref (Django's ASGI handler for the Board)",
    )
    args = parse.parse_args()
    waiters.raise_fd_limit()
    url = args.database_url
    info = benchlib.machine(url)
    info["uptime_before"] = waiters.uptime()
    servings = args.servings.split(",")
    results = []
    if "new" in servings:
        results.append(measure("new", waiters.ROOT, url, args))
    if "before" in servings:
        # A database of its own: a tree migrates its database to its own schema.
        before_url = url + "_cost_before"
        with benchlib.before_tree(args.before) as tree:
            results.append(measure(f"before ({args.before})", tree, before_url, args))
    info["uptime_after"] = waiters.uptime()
    kinds = [*KINDS, "stream event (µs)"]
    benchlib.print_table(
        "server CPU per request (ms; a stream event in µs)",
        ["request", *(result["name"] for result in results)],
        [[kind, *(result["cpu_ms"][kind] for result in results)] for kind in kinds],
    )
    print(f"uptime: {info['uptime_before']} / {info['uptime_after']}")
    benchlib.write_results(
        "request-cost",
        {
            "benchmark": "request_cost",
            "machine": info,
            "command": " ".join(sys.argv),
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
