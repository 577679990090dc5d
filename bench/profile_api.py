"""Where the agent API spends its CPU: one claim+complete through the WSGI app.

    python bench/profile_api.py --todos 1000

Calls Switchboard's WSGI application in this process (no HTTP server, no
network: only what gunicorn's worker threads run per request) for
``POST /api/v1/todos/claim`` then ``POST /api/v1/todos/<id>/complete``, and
reports the CPU per todo, measured without a profiler, then the share of it
each part takes under cProfile: the bearer-token lookup (``todos.auth``), the
store calls, the request log, and everything else (Django's request handling,
middleware, JSON). The baseline is the store alone: the same two calls, made
directly, in the same run.
"""

import cProfile
import io
import json
import logging
import pstats
import sys
import time

import benchlib

PARTS = {
    "token lookup (todos.auth.endpoint_for_token)": (
        "todos/auth.py",
        "endpoint_for_token",
    ),
    "store calls (todos.store._run)": ("todos/store/sql.py", "_run"),
    "request log (logging.Logger.handle)": ("logging/__init__.py", "handle"),
}


def wsgi_caller(token):
    """Return call(method, path, body) that runs one request through the WSGI app."""
    from board.wsgi import application

    def call(method, path, body):
        raw = json.dumps(body).encode()
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8000",
            "HTTP_AUTHORIZATION": f"Bearer {token}",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(raw)),
            "wsgi.input": io.BytesIO(raw),
            "wsgi.errors": sys.stderr,
            "wsgi.url_scheme": "http",
        }
        status = []
        body = b"".join(application(environ, lambda s, h, e=None: status.append(s)))
        if not status[0].startswith("200"):
            raise RuntimeError(f"{method} {path} answered {status[0]}: {body[:200]!r}")
        return json.loads(body)

    return call


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--todos", type=int, default=1000)
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    info = benchlib.machine(url)
    endpoint_id, token = benchlib.ensure_endpoint(url)
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, 4 * args.todos + 1000)
    benchlib.setup_django(url)
    from todos import store

    call = wsgi_caller(token)
    # The request log is written as in production, to a file-like sink rather
    # than this terminal (after the WSGI app's setup, which configures logging).
    for handler in logging.getLogger("switchboard").handlers:
        handler.setStream(io.StringIO())
    scope = store.Scope(endpoint_id, None)

    def through_api(count):
        for _ in range(count):
            todo = call("POST", "/api/v1/todos/claim", {"worker": "w"})["todo"]
            call("POST", f"/api/v1/todos/{todo['id']}/complete", {"worker": "w"})

    def through_store(count):
        for _ in range(count):
            todo = store.claim_next(scope, "s")
            store.complete_todo(scope, todo.id, "s")

    cpu = {}
    for name, loop in (("store", through_store), ("api", through_api)):
        loop(100)
        started = time.process_time()
        loop(args.todos)
        cpu[name] = (time.process_time() - started) / args.todos * 1000

    # A CPU clock, so the shares are of CPU, not of time spent waiting on PostgreSQL.
    profiler = cProfile.Profile(time.process_time)
    profiler.runcall(through_api, args.todos)
    stats = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values())
    shares = {}
    for label, (path, function) in PARTS.items():
        cumulative = sum(
            entry[3]
            for (filename, _, name), entry in stats.items()
            if filename.endswith(path) and name == function
        )
        shares[label] = cumulative / total
    shares["everything else"] = 1 - sum(shares.values())

    rows = [
        ["store alone (baseline)", cpu["store"], ""],
        ["WSGI app: claim + complete requests", cpu["api"], "100 %"],
    ] + [
        [f"  {label}", cpu["api"] * share, f"{share:.0%}"]
        for label, share in shares.items()
    ]
    benchlib.print_table(
        f"CPU per todo in this process (ms), {args.todos} todos",
        ["path", "CPU ms/todo", "share"],
        rows,
    )
    benchlib.write_results(
        "profile_api",
        {
            "benchmark": "profile_api",
            "machine": info,
            "todos": args.todos,
            "cpu_ms_per_todo": cpu,
            "shares": shares,
        },
    )


if __name__ == "__main__":
    main()
