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

"api before the #13 cuts" runs the same requests through a second WSGI handler
built the way the app was served before issue #13: every Board middleware on
API paths too, and Django's ``SELECT 1`` health check before every request
(board.serving.pgbackend skips it for a connection used within the last second). The
modes take turns (``--reps`` rounds), and the median of each is reported.
"""

import contextlib
import cProfile
import io
import json
import logging
import pstats
import statistics
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


# board/settings.py's MIDDLEWARE before issue #13 (the Board's on every path).
MIDDLEWARE_BEFORE = [
    "todos.middleware.RequestLogMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]


def application_before_cuts():
    """A WSGI handler whose middleware chain is MIDDLEWARE_BEFORE."""
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.utils import override_settings

    with override_settings(MIDDLEWARE=MIDDLEWARE_BEFORE):
        return WSGIHandler()


@contextlib.contextmanager
def health_check_every_request():
    """Django's CONN_HEALTH_CHECKS as it is: a SELECT 1 before every request."""
    from board.serving.pgbackend import base

    saved = base.HEALTH_CHECK_AFTER_IDLE_SECONDS
    base.HEALTH_CHECK_AFTER_IDLE_SECONDS = 0
    try:
        yield
    finally:
        base.HEALTH_CHECK_AFTER_IDLE_SECONDS = saved


def wsgi_caller(token, application=None):
    """Return call(method, path, body) that runs one request through the WSGI app."""
    if application is None:
        from django.core.wsgi import get_wsgi_application

        application = get_wsgi_application()

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
    parse.add_argument("--reps", type=int, default=3, help="rounds of the modes")
    args = parse.parse_args()

    url = args.database_url
    benchlib.prepare_database(url)
    info = benchlib.machine(url)
    endpoint_id, token = benchlib.ensure_endpoint(url)
    benchlib.reset_todos(url)
    benchlib.fill_pending(url, endpoint_id, (3 * args.reps + 2) * args.todos + 1000)
    benchlib.setup_django(url)
    from todos import store

    call = wsgi_caller(token)
    call_before = wsgi_caller(token, application_before_cuts())
    # The request log is written as in production, to a file-like sink rather
    # than this terminal (after the WSGI app's setup, which configures logging).
    for handler in logging.getLogger("switchboard").handlers:
        handler.setStream(io.StringIO())
    scope = store.Scope(endpoint_id, None)

    def through_api(count, call=call):
        for _ in range(count):
            todo = call("POST", "/api/v1/todos/claim", {"worker": "w"})["todo"]
            call(
                "POST",
                f"/api/v1/todos/{todo['id']}/complete",
                {"worker": "w", "lease_token": todo["lease_token"]},
            )

    def through_api_before(count):
        with health_check_every_request():
            through_api(count, call_before)

    def through_store(count):
        for _ in range(count):
            todo = store.claim_next(scope, "s")
            store.complete_todo(scope, todo.id, "s")

    modes = {
        "store": through_store,
        "api": through_api,
        "api_before": through_api_before,
    }
    samples = {name: [] for name in modes}
    for loop in modes.values():
        loop(100)
    for _ in range(args.reps):
        for name, loop in modes.items():
            started = time.process_time()
            loop(args.todos)
            samples[name].append((time.process_time() - started) / args.todos * 1000)
    cpu = {name: statistics.median(values) for name, values in samples.items()}

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
        ["WSGI app before the #13 cuts", cpu["api_before"], ""],
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
            "reps": args.reps,
            "cpu_ms_per_todo": cpu,
            "samples": samples,
            "shares": shares,
        },
    )


if __name__ == "__main__":
    main()
