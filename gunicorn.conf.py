"""gunicorn settings for Switchboard (override any with GUNICORN_CMD_ARGS).

Long-poll claims (up to 20 s) and event streams hold a thread each while they
wait, not a process: gthread workers with many threads serve many waiting
agents at once. Capacity for concurrent waiting agents = workers x threads.
"""

import os

wsgi_app = "board.wsgi"
worker_class = "gthread"
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "64"))
# A request may wait up to 20 s for work; the timeout must exceed that by far.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "120"))
graceful_timeout = 25
keepalive = 75
accesslog = None
errorlog = "-"
# gunicorn 27's control socket lives at ~/.gunicorn/gunicorn.ctl, shared by every
# instance a user starts; Switchboard does not use it.
control_socket_disable = True
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
