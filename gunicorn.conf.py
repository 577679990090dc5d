"""gunicorn settings for Switchboard (override any with GUNICORN_CMD_ARGS).

gunicorn manages the processes; each runs uvicorn's event loop serving Django's
ASGI application (``board.serving.workers.Worker``). The waiting surfaces — long-poll
claims (JSON API, SQS, MCP), ``/api/v1/events`` and MCP GET streams — are async
views that hold no thread and no database connection while they wait, so one
process serves thousands of waiting agents; every other view is sync and runs
in a thread.
See docs/scaling.md for the figures and the connection budget.
"""

import os

wsgi_app = "board.serving.asgi:application"
worker_class = "board.serving.workers.Worker"
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
# A request may wait up to 20 s for work; the timeout must exceed that by far.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "120"))
# On SIGTERM the waiters end at once (board/serving/workers.py); others get this.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "25"))
keepalive = 75
# Connections waiting to be accepted, for bursts of agents (re)connecting.
backlog = 4096
accesslog = None
errorlog = "-"
# gunicorn 27's control socket lives at ~/.gunicorn/gunicorn.ctl, shared by every
# instance a user starts; Switchboard does not use it.
control_socket_disable = True
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
