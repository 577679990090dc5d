"""How Switchboard is served, and every patch of a framework's private API.

gunicorn (gunicorn.conf.py) runs ``workers.Worker``: uvicorn's event loop
serving ``asgi.application``. Everything here that reaches into Django,
uvicorn, gunicorn or psycopg past their documented API is listed below, with
what it touches, the versions it was verified with (Django 6.0.10, asgiref
3.13.0, uvicorn 0.54.0, uvicorn-worker 0.4.0, gunicorn 27.0.1, httptools
0.9.0, psycopg 3.3.9, Python 3.12) and the evidence that it pays. The pins in
pyproject.toml keep each dependency inside the range verified here.

- ``asgi.Handler`` (subclass of ``django.core.handlers.asgi.ASGIHandler``):
  overrides ``__call__``, ``read_body``, ``create_request``,
  ``listen_for_disconnect`` and ``send_response`` (which reads the answer's
  headers from ``ResponseHeaders._store``), calls ``_middleware_chain`` and
  ``get_script_prefix``; ``asgi.SyncChain`` (a ``BaseHandler``) runs
  ``load_middleware`` and sends ``request_started`` itself, as
  ``WSGIHandler`` does. Pays: a request that does not wait costs one thread hop, not one
  per sync middleware and signal — ``/healthz`` 4.2–5.1 → 1.4–1.5 ms of
  server CPU (bench/request_cost.py, docs/scaling.md "How it is served").
- ``middleware.WaitingViewsMiddleware``: resolves the path itself, calls a
  waiting view directly (setting ``request.resolver_match``) and applies
  ``SecurityMiddleware``/``XFrameOptionsMiddleware``'s ``process_response``
  out of their chain, once per process on a probe answer, then copying what
  they added into each answer's ``ResponseHeaders._store``. Pays: a waiting
  request holds no thread (the waiting agents' figures, docs/scaling.md
  "Waiting agents, measured").
- ``pgbackend.base.DatabaseWrapper`` (subclass of Django's PostgreSQL
  backend): overrides ``close_if_health_check_failed``,
  ``close_if_unusable_or_obsolete``, ``_commit``, ``get_new_connection``,
  ``get_connection_params`` and ``pool``; sets ``health_check_done`` and
  psycopg_pool's private ``ConnectionPool._check`` (the pool check, skipped
  for a connection borrowed under 1 s ago). Pays: the
  ``SELECT 1`` health check runs only after 1 s idle, one query of three per
  agent call (bench/profile_api.py: 4.93 → 4.49 ms of CPU per claim+complete
  pair with the Board-middleware cut, docs/benchmarks.md "CPU per request").
- ``pgbackend.base.UtcTimestampLoader``: gives each connection an adapters
  map whose ``timestamptz`` loader is psycopg's compiled one, with the
  ``timezone`` attribute Django's ``create_cursor`` compares. Evidence: 5.1 → 0.8 µs
  a value in process, but SQS throughput within noise (docs/benchmarks.md,
  "SQS surface"): a pure speed patch whose end-to-end gain is not shown.
- ``templating.DjangoTemplates``: renders as Django's backend and then clears
  ``context.dicts`` and each form's ``_bound_fields_cache``. Pays: a Board
  page leaves no reference cycle (tests/system/test_garbage.py); the young
  collections of 20 ms or more fell from 9 a run to 0–3 (docs/scaling.md,
  "The Board's pages").
- ``workers.Worker._serve`` (uvicorn-worker's private coroutine): starts the
  hub and the collector in the worker's loop, wraps ``Server.handle_exit`` so
  SIGTERM ends the waiters, calls ``_install_sigquit_handler`` and exits
  with ``Arbiter.WORKER_BOOT_ERROR``. Not a speed patch: the hub has no other
  place in the worker's loop (tests/system/test_serving.py).
- ``frontdoor.FrontDoorProtocol`` (subclass of uvicorn's
  ``HttpToolsProtocol``; the methods and attributes it uses are listed in
  its module). Not a speed patch: bounded heads, a head timeout and a
  connection cap (tests/system/test_front_door.py).
- ``workers.ClockedCollector``: runs ``gc.collect(0/1/2)`` on the event
  loop's clock beside Python's thresholds. Pays in pauses, not p99s: the
  slowest young collection 30–110 → 10–23 ms of CPU with the waiters open,
  create p99 unchanged (bench/waiters.py --gc-probe, docs/scaling.md
  "Garbage collection").
"""
