"""How Switchboard is served, and the one catalogue of private APIs it uses.

gunicorn (gunicorn.conf.py) runs ``workers.Worker``: uvicorn's event loop
serving ``asgi.application``. Every site in todos/ and board/ that reaches
into Django, psycopg, psycopg_pool, uvicorn, uvicorn-worker, gunicorn,
whitenoise, OpenTelemetry's Django instrumentation or its OTLP/HTTP exporter
past their documented API is listed here: where, the private name, the version
verified (``pip show`` in the project's environment, with the tests named
below passing on it) and the evidence that exists for it.
pyproject.toml pins each of those packages to the verified minor, so an
upgrade is a deliberate act that rereads this list.

Verified with Django 6.0.10, psycopg 3.3.9, psycopg-pool 3.3.3, uvicorn
0.55.0, uvicorn-worker 0.4.0, gunicorn 27.0.1, whitenoise 6.12.0, httptools
0.9.0, opentelemetry-instrumentation-django 0.66b2,
opentelemetry-exporter-otlp-proto-http 1.45.2, Python 3.12. "Gain"
cites a committed result (bench/results/profiles/cuts.md,
bench/results/latest/); "no committed result" says none shows it.

Django 6.0.10
- ``asgi.Handler`` (subclass of ``django.core.handlers.asgi.ASGIHandler``):
  overrides ``__call__``, ``read_body``, ``create_request`` and
  ``listen_for_disconnect``; ``Handler.respond`` calls
  ``_middleware_chain``; ``serve`` calls the module's ``get_script_prefix``.
  ``asgi.SyncChain`` (a ``BaseHandler``) runs ``load_middleware`` and sends
  ``request_started`` itself, as ``WSGIHandler`` does. Tests:
  tests/system/test_served_path.py (a claim+complete pair makes no thread hop),
  tests/system/test_garbage.py, tests/system/test_front_door.py. Gain:
  cuts.md, claims and acknowledgements from the loop (HTTP single 461 → 690
  pairs/s). The one-hop sync chain: no committed result.
- ``HttpResponseBase._resource_closers``: ``asgi.Handler.respond``,
  ``asgi.close_resources``, ``todos.web.sse.event_stream`` (closers run without
  the ``request_finished`` signal). Tests: tests/system/test_garbage.py,
  tests/api/test_events.py.
- ``asgi.release``: empties an answered request's ``__dict__`` (what Django's
  request and its middleware hang on it). Tests: tests/system/test_garbage.py.
- ``todos.web.http.JsonResponse``: calls ``HttpResponse.__init__`` in place of
  ``django.http.JsonResponse.__init__``, which only encodes. Tests:
  tests/api/test_api.py. Gain: cuts.md, orjson's answers, 9 → 0.4 µs a body,
  a claim+complete pair 0.963.
- ``StreamingHttpResponse._iterator``: ``todos.web.sse.EventStreamResponse.__aiter__``
  (the stream closed as soon as the server stops iterating). Tests:
  tests/api/test_events.py.
- ``middleware.Routes.resolve`` / ``_with_todo_id``: a ``ResolverMatch`` made
  with ``object.__new__`` and its ``__dict__`` (``captured_kwargs``). Tests:
  tests/api/test_api.py, tests/system/test_served_path.py. Gain: cuts.md, one
  resolve 21 → 1.6 µs; a claim+complete pair 0.956 (quartiles 0.91–1.06).
- ``middleware.WaitingViewsMiddleware``: calls ``SecurityMiddleware`` and
  ``XFrameOptionsMiddleware``'s ``process_response`` outside their chain.
  Tests: tests/system/test_serving.py (the skipped middlewares' headers,
  each once). Gain: a waiting request holds no thread (4,000 waiters on 42
  worker threads, bench/results/latest/waiting_agents.json).
- ``templating.Template.render`` / ``let_go``: clears ``Context.dicts`` and
  each form's ``BaseForm._bound_fields_cache``; calls the backend module's
  ``reraise``. Tests: tests/system/test_garbage.py (no page leaves a
  reference cycle).
- ``pgbackend.base.DatabaseWrapper`` (subclass of Django's PostgreSQL
  backend): overrides ``_commit``, ``get_new_connection``,
  ``close_if_health_check_failed``, ``close_if_unusable_or_obsolete``,
  ``close`` and ``pool``; sets ``health_check_done``; appends to
  ``execute_wrappers``. Tests: tests/system/test_failover.py (an
  unconfirmed commit is a 503), tests/api/test_http.py::
  test_a_connection_idle_across_a_backend_kill_is_replaced_before_use. The
  health check skipped after a recent request: no committed result.
- ``DatabaseWrapper.get_connection_params``: ``todos.db.params.django_params``
  (the async pool's and the hub's connections made as Django's). Tests:
  tests/system/test_served_path.py::test_pool_connections_are_made_as_djangos,
  tests/system/test_pgbackend.py, tests/system/test_hub.py.
- ``django.db.utils.DatabaseErrorWrapper``: ``todos.db.pool._django_errors``
  (the async pool's statements' errors leave as Django's). Tests:
  tests/system/test_served_path.py::test_a_lost_pool_connection_answers_503_and_the_next_call_works,
  tests/store/test_runners.py.

psycopg 3.3.9
- ``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``, raised at import by
  ``pgbackend.base`` to ``PARSED_STATEMENT_BYTES``. Tests:
  tests/system/test_pgbackend.py::test_the_claim_and_the_acknowledgement_are_parsed_once
  (which reads ``_queries._query2pg``'s cache). Gain: cuts.md, ~40 µs per
  statement → cached.

psycopg-pool 3.3.3
- ``ConnectionPool._check``, replaced in ``pgbackend.base.DatabaseWrapper.pool``
  by ``check_after_idle`` (Django makes the pool and passes it psycopg_pool's
  own check). Tests: tests/system/test_serving.py::
  test_the_pool_checks_a_connection_only_after_it_sat_idle. Gain: no
  committed result. ``todos.db.idle.due_for_check`` stamps each borrowed
  connection with an attribute of ours, ``_switchboard_borrowed_at`` (psycopg's
  connections take attributes; a rename there would only check more often).

uvicorn 0.55.0 (httptools 0.9.0)
- ``frontdoor.FrontDoorProtocol`` (subclass of
  ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol``; the methods and
  attributes it uses are listed in its module) and ``frontdoor.OneWrite``
  (set as ``cycle.transport``). Tests: tests/system/test_front_door.py. Not a
  speed patch (bounded heads, a head timeout, a connection cap), but for
  ``OneWrite``: cuts.md, write calls per request 3.76 → 2.78.
- ``uvicorn.server.Server.handle_exit`` (wrapped by assignment) and
  ``Server.started``: ``workers.Worker._serve``. Tests:
  tests/system/test_serving.py::test_a_clean_stop_logs_no_socket_error.

uvicorn-worker 0.4.0
- ``UvicornWorker._serve`` (overridden by ``workers.Worker._serve``: the hub
  and the collector start in the worker's loop) and
  ``_install_sigquit_handler``. Not a speed patch: the hub has no other place
  in the worker's loop. Tests: tests/system/test_serving.py.

gunicorn 27.0.1
- ``gunicorn.arbiter.Arbiter.WORKER_BOOT_ERROR``: ``workers.Worker._serve``
  exits with it when the server did not start, as uvicorn-worker does.
  No test makes a worker fail its boot.

whitenoise 6.12.0
- ``WhiteNoiseMiddleware``'s ``autorefresh``, ``files``, ``find_file`` and
  ``serve``: ``todos.web.middleware.StaticFilesMiddleware`` (whitenoise made
  async capable). Tests: tests/system/test_serving.py::
  test_a_static_file_is_served_whole,
  test_a_served_static_file_is_logged_with_its_path_and_no_warning.

opentelemetry-instrumentation-django 0.66b2
- ``requestspans.middleware_class`` subclasses its ``_DjangoMiddleware``
  (made async capable): calls its ``process_request``, ``process_view`` and
  ``process_response``, overrides ``_get_span_name`` (the kept matches of
  ``middleware.Routes``), and pops its ``_environ_activation_key``,
  ``_environ_span_key`` and ``_environ_token`` entries of ``request.META`` to
  end the span of a request whose client left.
  ``todos.telemetry.tracing._instrument_django`` reads
  ``DjangoInstrumentor._opentelemetry_middleware`` to take the instrumentor's
  own sync-only entry back out of ``MIDDLEWARE``. Tests:
  tests/tracing/test_requests.py. Not a speed patch: the waiting views keep
  being served in the loop with request spans on (a sync-only middleware
  would serve them in a thread).

opentelemetry-exporter-otlp-proto-http 1.45.2
- ``todos.telemetry.otlp.SpanExporter`` (subclass of its ``OTLPSpanExporter``)
  overrides ``export`` to send our own encoding of the spans: it reads the
  exporter's ``_shutdown`` and ``_metrics`` (``export_operation``) and posts
  through its ``_client`` (``export``), as its own ``export`` does. Tests:
  tests/tracing/test_encoding.py (the encoding equals the SDK's
  ``encode_spans``; the exporter posts it and reports a failed post),
  tests/tracing/test_otlp.py. Gain: a Switchboard span's encoding 25-37 →
  5-7 µs of the exporter thread's CPU (a microbenchmark of 512-span batches,
  the SDK's encoder beside ours); end to end, bench/tracing.py.
- ``todos.telemetry.otlp._urllib3_transport``: the exporter is given the
  SDK's ``Urllib3HTTPTransport`` (its private module
  ``opentelemetry.exporter.http.transport._urllib3``) through its
  constructor's private ``_transport`` argument, with the certificates its
  ``_build_transport`` would read; a requests session or credential provider
  keeps its requests transport. Tests: tests/tracing/test_otlp.py (the wire,
  and which transport). Gain: a post 481 → 212 µs of CPU (a microbenchmark
  of 30-span exports to tests/tracing/receiver.py); no committed result.

Python's own, for completeness: ``logging._srcfile = None`` (board/settings.py;
the logging HOWTO's "Optimization" switch). Gain: cuts.md, a request's log
line 13–17 → 9–13 µs.

History: the compiled ``timestamptz`` loader (``UtcTimestampLoader``) and the
copies of headers through ``ResponseHeaders._store`` (the waiting views'
security headers; ``Handler.send_response``) were removed: their own evidence
was a microbenchmark whose end-to-end effect was within the noise. Django's
loaders read the same instants in UTC (tests/system/test_pgbackend.py) and
the skipped middlewares add the same headers (tests/system/test_serving.py).
The async pool's connections read timestamps with psycopg's own loader again,
through its public adapters API only (``todos.db.params.utc_timestamps``; not
a site of this list), with a served measurement (cuts.md).
``workers.ClockedCollector`` is not a private API and left this list; it is
measured in docs/scaling.md ("Garbage collection").
"""
