"""Settings for Switchboard, read from environment variables with safe defaults.

Every knob is documented in the README ("Configuration").
"""

import logging
import os
import re
import warnings
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name, default):
    return os.environ.get(name, default)


def env_bool(name, default=False):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(
        f"{name} must be a boolean (1/0, true/false), not {raw!r}"
    )


def env_int(name, default, minimum=None, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum
    ):
        raise ImproperlyConfigured(
            f"{name} must be between {minimum} and {maximum}, not {value}"
        )
    return value


def env_trace_url(name):
    """A link template for a trace viewer: an http(s) URL holding {trace_id}."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ImproperlyConfigured(f"{name} must be an http:// or https:// URL")
    if "{trace_id}" not in raw:
        raise ImproperlyConfigured(f"{name} must hold {{trace_id}} where the id goes")
    return raw


def env_list(name, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_gc_thresholds(name, default):
    """Three garbage-collector thresholds (``10000,5,100``), or None for "python"."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw == "python":
        return None
    try:
        values = tuple(int(part) for part in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise ImproperlyConfigured(
            f"{name} must be three integers >= 0 (like 10000,5,100) or python, "
            f"not {raw!r}"
        )
    return values


def _host_and_port(item):
    """Split one ``host[:port]`` (or ``[v6]:port``) of a URL's host list."""
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ImproperlyConfigured(f"DATABASE_URL has a malformed host: {item!r}")
        port = rest[1:]
    else:
        host, _, port = item.partition(":")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ImproperlyConfigured(
            f"DATABASE_URL has a port that is not 1-65535: {port!r}"
        )
    return unquote(host), port


def database_from_url(url):
    """Turn a postgres:// URL into a Django DATABASES entry.

    The URL may name several servers, ``postgres://u:p@h1:5432,h2:5432/db``,
    as libpq's own URLs do: HOST and PORT then hold comma-separated lists,
    which psycopg tries in turn (with ``?target_session_attrs=read-write`` it
    takes the one that accepts writes: the primary of a failover pair).
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        # The message leaves the URL out: it may carry a password.
        raise ImproperlyConfigured("DATABASE_URL is not a valid URL") from None
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL must start with postgres://, not {parts.scheme!r}"
        )
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    options = {key: value for key, value in query.items() if key != "conn_max_age"}
    # urlsplit reads one host and port; the netloc after the credentials is
    # the host list.
    credentials, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    servers = [_host_and_port(item) for item in hostlist.split(",")]
    ports = [port for _, port in servers]
    if any(ports) and not all(ports):
        # libpq pairs hosts and ports one to one: a host without a port gets
        # PostgreSQL's default.
        ports = [port or "5432" for port in ports]
    return {
        # Django's PostgreSQL backend, health-checking only after idleness.
        "ENGINE": "board.serving.pgbackend",
        "NAME": unquote(parts.path.lstrip("/")) or "switchboard",
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": ",".join(host for host, _ in servers),
        "PORT": ",".join(ports) if any(ports) else "",
        "OPTIONS": options,
    }


def secret_key_from_file(path):
    """The key `make` keeps in the checkout (its first line), or "" without one.

    `make run` exports the key it generated into .switchboard-secret-key; a
    command run by hand afterwards (``manage.py create_endpoint``) reads the
    same file, so it signs and decrypts as the served instance does.
    """
    try:
        return Path(path).read_text().strip()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot read the SECRET_KEY file {path}: {exc}"
        ) from None


DEBUG = env_bool("DEBUG", False)
SECRET_KEY_FILE = env_str(
    "SWITCHBOARD_SECRET_KEY_FILE", str(BASE_DIR / ".switchboard-secret-key")
)
SECRET_KEY = env_str("SECRET_KEY", "") or secret_key_from_file(SECRET_KEY_FILE)
if not SECRET_KEY:
    if not DEBUG:
        # Never run on a key published with the source: sessions, CSRF tokens
        # and signed values would be forgeable.
        raise ImproperlyConfigured(
            f"SECRET_KEY is not set and {SECRET_KEY_FILE} holds none. Set it in "
            "the environment (`make run` keeps a local one in "
            ".switchboard-secret-key), or set DEBUG=1 to develop with a "
            "throwaway key."
        )
    # DEBUG only: a development key.
    SECRET_KEY = "switchboard-development-key-not-for-production-use-0123456789"

# Earlier SECRET_KEYs, comma-separated, newest first (Django's key rotation):
# what they signed (sessions, password-reset links) stays valid, and the
# secrets encrypted at rest under keys derived from them stay readable until
# `manage.py reencrypt_secrets` has moved them (docs/operations.md).
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Django's form templates, for the Board's renderer (FORM_RENDERER below).
    "django.forms",
    "django_htmx",
    "todos",
]

MIDDLEWARE = [
    # The request's span while tracing is on (else it drops out): first, so the
    # log line and everything below run in it.
    "board.serving.requestspans.request_spans",
    # So its one log line per request times and sees everything below.
    "todos.web.middleware.RequestLogMiddleware",
    # The waiting (async) views skip the rest: see the middleware's docstring.
    "board.serving.middleware.WaitingViewsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The Board's middleware, each wrapped to skip /api/: agent requests carry a
    # bearer token, never a session or a CSRF cookie (todos/web/middleware.py).
    "todos.web.middleware.BoardWhiteNoise",
    "todos.web.middleware.BoardSessions",
    "django.middleware.common.CommonMiddleware",
    "todos.web.middleware.BoardCsrf",
    "todos.web.middleware.BoardAuthentication",
    "todos.web.middleware.BoardMessages",
    "todos.web.middleware.BoardFrameOptions",
    "todos.web.middleware.BoardHtmx",
    "todos.web.middleware.BoardCsp",
]

ROOT_URLCONF = "board.urls"
# Forms render through the project's templates, help text as text (CONTRACT §16).
FORM_RENDERER = "todos.ui.renderer.BoardRenderer"
ASGI_APPLICATION = "board.serving.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "board.serving.templating.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The database: DATABASE_URL, or the project-local cluster that `make` starts.
_default_url = "postgres://postgres@127.0.0.1:{}/{}".format(
    env_int("SB_PG_PORT", 54329, 1, 65535), env_str("SB_PG_DB", "switchboard")
)
DATABASES = {"default": database_from_url(env_str("DATABASE_URL", _default_url))}
_db = DATABASES["default"]
# Server-side binding plus prepared statements let PostgreSQL reuse the store's
# plans (PERF-NOTES §3). PgBouncer in transaction mode needs 1.21+ for prepared
# statements; set SWITCHBOARD_DB_PREPARE=0 behind an older pooler.
if env_bool("SWITCHBOARD_DB_PREPARE", True):
    _db["OPTIONS"].setdefault("server_side_binding", True)
    _db["OPTIONS"].setdefault("prepare_threshold", 5)
# Every statement, the store's included, runs under a timeout so that a stuck
# query answers an error instead of holding a worker thread forever.
STATEMENT_TIMEOUT_MS = env_int("SWITCHBOARD_STATEMENT_TIMEOUT_MS", 5000, 0)
_db["OPTIONS"]["options"] = (
    _db["OPTIONS"].get("options", "") + f" -c statement_timeout={STATEMENT_TIMEOUT_MS}"
).strip()
_db["OPTIONS"].setdefault(
    "connect_timeout", env_int("SWITCHBOARD_DB_CONNECT_TIMEOUT", 3, 1)
)
# Request work borrows a connection from a bounded pool of its process
# (psycopg_pool through Django's OPTIONS["pool"]) and gives it back when the
# request, or an async view's database call, ends: the number of PostgreSQL
# connections is bounded by workers x SWITCHBOARD_DB_POOL_MAX, whatever the
# number of waiting agents (docs/scaling.md). A pool takes the place of
# persistent connections, so CONN_MAX_AGE then stays 0.
SWITCHBOARD_DB_POOL = env_bool("SWITCHBOARD_DB_POOL", True)
SWITCHBOARD_DB_POOL_MAX = env_int("SWITCHBOARD_DB_POOL_MAX", 16, 1)
if SWITCHBOARD_DB_POOL:
    _db["OPTIONS"]["pool"] = {
        "min_size": env_int("SWITCHBOARD_DB_POOL_MIN", 2, 0, SWITCHBOARD_DB_POOL_MAX),
        "max_size": SWITCHBOARD_DB_POOL_MAX,
        # Seconds a request waits for a connection before answering 503 (as
        # long as a connection attempt may take, by default).
        "timeout": env_int(
            "SWITCHBOARD_DB_POOL_TIMEOUT",
            _db["OPTIONS"]["connect_timeout"],
            1,
        ),
        # Idle connections above min_size close after this many seconds.
        "max_idle": 120,
        "name": "switchboard",
    }
    _db["CONN_MAX_AGE"] = 0
else:
    _db["CONN_MAX_AGE"] = env_int("CONN_MAX_AGE", 60, 0)
# Checked when borrowed, so a pooled connection from before a database restart
# is replaced instead of failing the request.
_db["CONN_HEALTH_CHECKS"] = True
# Threads (per process) that run the async views' database calls.
SWITCHBOARD_DB_THREADS = env_int(
    "SWITCHBOARD_DB_THREADS", SWITCHBOARD_DB_POOL_MAX, 1, 1000
)
# The agent surfaces' async views await their statements in the event loop on
# a pool of async connections of their own (todos/db/pool.py), with no thread:
# at most this many more connections per process.
SWITCHBOARD_DB_ASYNC_POOL_MAX = env_int("SWITCHBOARD_DB_ASYNC_POOL_MAX", 4, 1)
# The served processes' garbage collector (board/serving/workers.py, tune_gc): Python's
# thresholds are (700, 10, 10); "python" keeps them and skips the freeze.
SWITCHBOARD_GC_THRESHOLDS = env_gc_thresholds(
    "SWITCHBOARD_GC_THRESHOLDS", (10_000, 5, 100)
)
# How often a served process's event loop collects its young generations
# (board/serving/workers.py, ClockedCollector); 0 leaves it to the thresholds alone.
SWITCHBOARD_GC_TICK_MS = env_int("SWITCHBOARD_GC_TICK_MS", 100, 0, 60_000)
# The doorbell's LISTEN connections; empty = the same server as DATABASE_URL.
SWITCHBOARD_LISTEN_DATABASE_URL = env_str("SWITCHBOARD_LISTEN_DATABASE_URL", "")
_db["TEST"] = {"NAME": env_str("SWITCHBOARD_TEST_DB", "") or None}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/board/login/"
LOGIN_REDIRECT_URL = "/board/"
LOGOUT_REDIRECT_URL = "/board/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from static/ too, so tests and `make run` need no collectstatic.
WHITENOISE_USE_FINDERS = True
# Before collectstatic has run (tests, a fresh clone) STATIC_ROOT does not
# exist yet, which is expected: the finders above serve every file meanwhile.
warnings.filterwarnings("ignore", message=re.escape(f"No directory at: {STATIC_ROOT}"))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
X_FRAME_OPTIONS = "DENY"
# What the Board's pages and the answer link may load and run (CONTRACT §16):
# their own scripts and styles as files, nothing inline, no eval, no plugin,
# no frame around them, forms posted only to the server itself. An agent's
# text that slipped through as markup would still run nothing.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}
SECURE_CONTENT_TYPE_NOSNIFF = True

# The agent API's body limit (CONTRACT §5): larger bodies answer 413.
SWITCHBOARD_MAX_BODY_BYTES = 256 * 1024

# Fernet key(s) for the secrets kept encrypted at rest (SQS secret keys, webhook
# signing secrets): comma-separated, the first encrypts. Empty = derived from
# SECRET_KEY; the keys derived from SECRET_KEY and its fallbacks always decrypt
# too (see todos/access/crypto.py). A malformed value fails `manage.py check`.
SWITCHBOARD_ENCRYPTION_KEY = env_str("SWITCHBOARD_ENCRYPTION_KEY", "")
# How far a timestamped webhook delivery (Stripe, Standard Webhooks) may be from
# the server's clock, in seconds; an older one is refused as stale, and a
# replay within the window is refused because its signature was seen.
SWITCHBOARD_WEBHOOK_TOLERANCE_SECONDS = env_int(
    "SWITCHBOARD_WEBHOOK_TOLERANCE_SECONDS", 300, 1, 86400
)

# The SQS surface (docs/sqs.md): a whole request may be larger than one
# message (a batch of ten, JSON-escaped); message sizes are checked after.
SWITCHBOARD_SQS_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# The largest body Django itself may hold in memory: the largest any surface
# accepts. Each surface checks its own, smaller limit first (todos/web/http.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = SWITCHBOARD_SQS_MAX_REQUEST_BYTES

# The front door (board/serving/frontdoor.py), bounds the served process keeps before
# it reads a request: the body limit of every path that is not an agent
# surface (the Board's forms, /healthz, static files; Django's own default
# DATA_UPLOAD_MAX_MEMORY_SIZE), the size of a request head (431 past it), the
# seconds a head may take to arrive (then the connection is closed), and the
# connections each worker holds at once (503 past them; far above the
# thousands of waiting agents a worker serves, docs/scaling.md).
SWITCHBOARD_BOARD_MAX_BODY_BYTES = env_int(
    "SWITCHBOARD_BOARD_MAX_BODY_BYTES", 2_621_440, 1024
)
SWITCHBOARD_MAX_HEAD_BYTES = env_int(
    "SWITCHBOARD_MAX_HEAD_BYTES", 64 * 1024, 1024, 16 * 1024 * 1024
)
SWITCHBOARD_HEAD_TIMEOUT_SECONDS = env_int(
    "SWITCHBOARD_HEAD_TIMEOUT_SECONDS", 10, 1, 300
)
SWITCHBOARD_MAX_CONNECTIONS = env_int("SWITCHBOARD_MAX_CONNECTIONS", 10_000, 1)

# Queue defaults.
SWITCHBOARD_LEASE_SECONDS = env_int("SWITCHBOARD_LEASE_SECONDS", 300, 1, 43200)
SWITCHBOARD_MAX_ATTEMPTS = env_int("SWITCHBOARD_MAX_ATTEMPTS", 5, 1, 1000)
SWITCHBOARD_SWEEP_INTERVAL = env_int("SWITCHBOARD_SWEEP_INTERVAL", 5, 1, 3600)
SWITCHBOARD_MAX_WAIT_SECONDS = 20
# How often a process's waiting long polls look for work that turned claimable
# without a ring (a lapsed lease the reaper has not swept yet): one claim try
# per waiting scope, not per waiter.
SWITCHBOARD_LONG_POLL_RECHECK_SECONDS = env_int(
    "SWITCHBOARD_LONG_POLL_RECHECK_SECONDS", 5, 1, 3600
)
# The bearer token a Prometheus scraper sends to GET /metrics; unset = only
# staff Board sessions may read it.
SWITCHBOARD_METRICS_TOKEN = env_str("SWITCHBOARD_METRICS_TOKEN", "")
# Where the Board links a todo's trace: a URL template with {trace_id}
# (Jaeger's /trace/{trace_id}, Tempo's or Honeycomb's search); unset = the id
# is shown without a link. Tracing itself is set up by the OTEL_* variables.
SWITCHBOARD_TRACE_URL = env_trace_url("SWITCHBOARD_TRACE_URL")
# An MCP session unused this long has expired (404; the client initializes anew).
SWITCHBOARD_MCP_SESSION_IDLE_SECONDS = env_int(
    "SWITCHBOARD_MCP_SESSION_IDLE_SECONDS", 7 * 86400, 60, 365 * 86400
)
# Seconds of silence after which an event stream sends a keep-alive comment;
# it is also how soon a stream notices that its client has gone.
SWITCHBOARD_SSE_KEEPALIVE_SECONDS = env_int(
    "SWITCHBOARD_SSE_KEEPALIVE_SECONDS", 15, 1, 300
)

# How long a ring may wait to reach the event streams (SSE, MCP GET) of its
# scope: the streams a moment's rings wake are woken together, once, and each
# sends those rings in one write (todos.waiting.doorbell). 0 = each ring at once.
SWITCHBOARD_STREAM_BATCH_MS = env_int("SWITCHBOARD_STREAM_BATCH_MS", 20, 0, 1000)

LOG_FORMAT = env_str("LOG_FORMAT", "text")
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "todos.telemetry.logs.TextFormatter"},
        "json": {"()": "todos.telemetry.logs.JsonFormatter"},
    },
    # No credential reaches a log line: answer links' tokens are redacted
    # from every record these handlers write (todos.telemetry.logs.RedactCredentials).
    "filters": {"redact": {"()": "todos.telemetry.logs.RedactCredentials"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["redact"],
        },
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "switchboard": {
            "handlers": ["console"],
            "level": LOG_LEVEL,
            "propagate": False,
        },
        "django.request": {
            "handlers": ["console"],
            "level": "ERROR",
            "propagate": False,
        },
    },
}
# What a log record gathers that no formatter here shows (todos.telemetry.logs): the
# calling frame (a walk up the stack), the thread's and the multiprocessing
# process's names, the asyncio task's. These are the logging HOWTO's
# "Optimization" switches; the process id, which gunicorn's own lines show,
# is kept. Every request logs a line: a call took 13-17 µs, 9-13 without these
# and with todos.telemetry.logs' timestamp made once a second.
logging._srcfile = None
logging.logThreads = False
logging.logMultiprocessing = False
logging.logAsyncioTasks = False
