"""Tracing's overhead: what does OpenTelemetry cost a create and a claim+complete?

Question: with tracing exported at sampling 1.0, and with tracing off (the
shipped default), how much slower are a create and a claim+complete than in
a build without the instrumentation, measured in the same run? The targets:
at most 5% slower on, at most 1% off.

    python bench/tracing.py              # 2 processes, 10 s a phase, 3 repetitions
    python bench/tracing.py --quick

Three modes, on one PostgreSQL, each served by its own gunicorn
(gunicorn.conf.py, as `make run` serves; the three up at once):

  on    tracing exported over OTLP/HTTP to a receiver in a process of its
        own, as a collector runs (tests/tracing/receiver.py, which decodes
        every export and keeps its connections alive as a collector does):
        OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER=always_on (sampling
        1.0), OTEL_BSP_SCHEDULE_DELAY=100 (the batch of a turn is exported
        within it, not in another mode's turn)
        (with --request-spans, OTEL_PYTHON_DJANGO_INSTRUMENT=true too: a
        server span per HTTP request, board.serving.requestspans)
  off   nothing set: tracing off, as shipped
  bare  "a build without the instrumentation": the same code with every
        tracing hook the rest of the code calls (``tracing.send``,
        ``tracing.ended``, ``tracing.from_request``, ``tracing.enabled``…)
        replaced by a no-op before the workers fork (bench/tracing_bare.py):
        no context read from a request, none stored or handed on, no span.
        Left of the instrumentation: a call of an empty function at each
        hook, the trace columns written as NULL, and the three columns a claim
        returns for a lapsed lease's span, all in one statement as before.

Worker processes (--workers) take turns of --slice seconds on the wall clock,
the mode of each turn shuffled, so the three modes see the same load. Two
phases of --seconds each, over HTTP and then through the store:

  create  each step creates one todo in its mode's queue, carrying a
          ``traceparent`` (a caller inside a trace); the create's p50 (the
          HTTP one from the client, the request's whole round trip)
  drain   each mode's queue is filled first (each todo with a stored
          context, as if created in a trace); each step claims and completes
          one todo; todos/s over the mode's turns

Through the store, the worker processes call the store's functions and switch
tracing's state at each change of turn: on (a tracer exporting to the same
receiver), off, or the hooks stripped.

Repeated --reps times; the medians, and each mode's slowdown against bare
(create: p50 over bare's p50; drain: bare's todos/s over the mode's, minus
one), taken in each rep and then the median over the reps. Result:
bench/results/latest/tracing.json (`python bench/report.py`).

What the on mode's figures count: everything tracing costs in the process
that serves (or, through the store, runs) the request: the context read, the
spans made, queued and ended on the request's path, and the batch
processor's thread, which encodes and posts each batch in the same process
(on the same two cores as the requests). The receiver's CPU is not in the
servers' but it runs on the same machine: it competes for the cores in every
turn it is busy (mostly the on mode's, a batch is exported within 100 ms), as
a collector beside the servers would; it is reported apart, as its CPU per
todo of the on mode (a collector elsewhere would not cost this machine).
"""

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import benchlib
import psycopg
import tracing_bare

MODES = ("on", "off", "bare")
SERVICE = "switchboard-bench"
TARGETS = {"on": 0.05, "off": 0.01}
# Untimed steps of each mode in each process before the measured window.
WARM_UP_STEPS = 10
# A rough ceiling of a mode's todos/s while it holds the turn, to size the fill.
CEILING = 2_500

FILL_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at, trace_context)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'bench ' || n, '{}'::jsonb,
       'pending', 0, 5, '', clock_timestamp(), now(),
       jsonb_build_object('traceparent', '00-' || md5(n::text || %(queue)s) || '-'
                          || left(md5(n::text), 16) || '-01')
  FROM generate_series(1, %(count)s) AS n
"""


def options():
    parse = benchlib.parser(__doc__)
    add = parse.add_argument
    add("--workers", type=int, default=2, help="client processes (2)")
    add("--seconds", type=float, default=10, help="seconds of each phase (10)")
    add("--slice", type=float, default=0.5, help="seconds of one turn (0.5)")
    add("--reps", type=int, default=3, help="repetitions (3)")
    add("--port", type=int, default=0, help="the first of 3 server ports (0: free)")
    add(
        "--request-spans",
        action="store_true",
        help="the on mode's servers also make a server span per HTTP request "
        "(OTEL_PYTHON_DJANGO_INSTRUMENT=true)",
    )
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, workers=1, seconds=1.5, slice=0.25, reps=1)
    if args.reps < 1 or args.workers < 1:
        parse.error("--reps and --workers must be at least 1")
    return args


def queue_of(mode):
    return f"trace-{mode}"


def traceparent():
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


# --- The servers ----------------------------------------------------------------


def server_env(url, **extra):
    """The servers' environment: no OTEL_* variable but those given."""
    env = benchlib.django_env(url, GUNICORN_LOG_LEVEL="warning")
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    return {**env, **extra}


def exporting(receiver):
    """The environment that turns tracing on, exporting every span to ``receiver``."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


@contextlib.contextmanager
def servers(url, receiver, first_port, request_spans=False):
    """One gunicorn per mode; yield {mode: port}."""
    gunicorn = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
    bare = [sys.executable, "bench/tracing_bare.py", "-c", "gunicorn.conf.py"]
    on = exporting(receiver)
    if request_spans:
        on["OTEL_PYTHON_DJANGO_INSTRUMENT"] = "true"
    setups = {
        "on": (gunicorn, server_env(url, **on)),
        "off": (gunicorn, server_env(url)),
        "bare": (bare, server_env(url)),
    }
    ports = {}
    with contextlib.ExitStack() as stack:
        for number, (mode, (command, env)) in enumerate(setups.items()):
            port = first_port + number if first_port else benchlib.free_port()
            bound = [*command, "--bind", f"127.0.0.1:{port}"]
            stack.enter_context(
                benchlib.run_server([bound], port, env, url, f"tracing-{mode}")
            )
            ports[mode] = port
        yield ports


# --- Steps over HTTP ------------------------------------------------------------


def http_create(port, token, queue):
    client = benchlib.Client(port, token)
    body = {"queue": queue}

    def step():
        headers = {"traceparent": traceparent()}
        start = time.perf_counter()
        status, answer = client.request("POST", "/api/v1/todos", body, headers)
        took = time.perf_counter() - start
        if status != 201:
            raise RuntimeError(f"create answered {status}: {answer}")
        return {"create": took}

    return step


def http_worker(index, phase, ports, token, slice_seconds):
    worker = f"w{index}"
    modes = {
        mode: (
            http_create(ports[mode], token, queue_of(mode))
            if phase == "create"
            else benchlib.timed_http_step(ports[mode], token, worker, queue_of(mode))
        )
        for mode in MODES
    }
    warm_up(modes)
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def warm_up(modes):
    """A few untimed steps of each mode before the start (a worker's first
    requests load what it imports lazily)."""
    for _ in range(WARM_UP_STEPS):
        for step in modes.values():
            step()


# --- Steps through the store ----------------------------------------------------


class Switch:
    """Tracing's state in a store worker process, set to each turn's mode:
    on (a tracer exporting to the receiver), off, or the hooks stripped."""

    def __init__(self, receiver):
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        from todos.telemetry import tracing
        from todos.telemetry.batching import BatchSpanProcessor
        from todos.telemetry.otlp import SpanExporter

        # The servers' name for the spans (the receiver checks it).
        os.environ["OTEL_SERVICE_NAME"] = SERVICE
        self.tracing = tracing
        # The processor and exporter tracing.configure() sets up in a server.
        exporter = SpanExporter(endpoint=f"{receiver}/v1/traces")
        tracing.enable(
            BatchSpanProcessor(exporter, schedule_delay_millis=100), ALWAYS_ON
        )
        self.exporting = (tracing._tracer, tracing._provider, tracing._recorder)
        tracing._tracer = tracing._provider = tracing._recorder = None
        self.hooks = None
        self.mode = "off"

    def to(self, mode):
        if mode == self.mode:
            return
        tracing = self.tracing
        if self.hooks is not None:
            tracing_bare.restore(self.hooks)
            self.hooks = None
        tracing._tracer, tracing._provider, tracing._recorder = (
            self.exporting if mode == "on" else (None, None, None)
        )
        if mode == "bare":
            self.hooks = tracing_bare.strip()
        self.mode = mode

    def flush(self):
        """Export what the on mode still holds."""
        self.to("on")
        self.tracing.flush()


def store_worker(index, phase, url, endpoint_id, receiver, slice_seconds):
    benchlib.setup_django(url)
    from todos import store

    switch = Switch(receiver)
    scope = store.Scope(endpoint_id)
    worker = f"w{index}"

    def create(mode):
        def step():
            switch.to(mode)
            carried = traceparent()
            start = time.perf_counter()
            context = switch.tracing.parse(carried)
            store.create_todo(scope, queue=queue_of(mode), trace_context=context)
            return {"create": time.perf_counter() - start}

        return step

    def drain(mode):
        def claim():
            switch.to(mode)
            try:
                todo = store.claim_next(scope, worker, queue=queue_of(mode))
            except store.NotFound:
                return None
            # What a claim's answer renders (the JSON API's, and its context).
            todo.to_dict()
            return todo

        def complete(todo):
            store.complete_todo(scope, todo.id, worker, lease_token=todo.lease_token)

        return lambda: benchlib.timed(claim, complete)

    modes = {mode: (create if phase == "create" else drain)(mode) for mode in MODES}
    warm_up(modes)

    def run(stop_at):
        outcome = benchlib.alternate(stop_at, slice_seconds, modes)
        switch.flush()
        return outcome

    return run


# --- The run --------------------------------------------------------------------


def fill(url, endpoint_id, count):
    with psycopg.connect(url, autocommit=True) as conn:
        for mode in MODES:
            params = {"endpoint_id": endpoint_id, "queue": queue_of(mode)}
            conn.execute(FILL_SQL, {**params, "count": count})
        benchlib.settle(conn, url, "todos", "todo_events")


CONTEXTS_SQL = """
SELECT queue, count(*) FILTER (WHERE trace_context IS NOT NULL), count(*)
  FROM todos GROUP BY queue
"""


def contexts_kept(url):
    """Each mode's created todos, and how many keep a trace context (bare
    keeps none: its hooks are stripped)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(CONTEXTS_SQL).fetchall()
    counts = {queue: {"kept": kept, "todos": todos} for queue, kept, todos in rows}
    return {mode: counts.get(queue_of(mode)) for mode in MODES}


def phase_figures(merged, phase):
    """Each mode's figure of a phase: the create p50 (ms) or todos/s."""
    if phase == "create":
        return {mode: merged[mode]["latency_ms"]["create"]["p50"] for mode in MODES}
    return {mode: merged[mode]["rate"] for mode in MODES}


def slowdown(figures, phase):
    """How much slower each mode is than bare (0.03: 3% slower)."""
    bare = figures["bare"]
    if phase == "create":
        return {mode: figures[mode] / bare - 1 for mode in ("on", "off")}
    return {mode: bare / figures[mode] - 1 for mode in ("on", "off")}


def run_phase(args, url, endpoint_id, token, path, phase, ports, receiver):
    benchlib.reset_todos(url)
    if phase == "drain":
        count = WARM_UP_STEPS * args.workers + CEILING * args.seconds
        fill(url, endpoint_id, int(max(2_000, count)))
    if path == "http":
        target, extra = http_worker, (phase, ports, token, args.slice)
    else:
        target, extra = store_worker, (phase, url, endpoint_id, receiver, args.slice)
    outcomes = benchlib.run_processes(target, args.workers, args.seconds, extra)
    merged = benchlib.merge_modes(outcomes)
    figures = phase_figures(merged, phase)
    return {
        "contexts_kept": contexts_kept(url) if phase == "create" else None,
        "figures": figures,
        "slowdown": slowdown(figures, phase),
        "done": {mode: merged[mode]["done"] for mode in MODES},
        "dry": {mode: merged[mode]["dry"] for mode in MODES},
        "latency_ms": {mode: merged[mode]["latency_ms"] for mode in MODES},
    }


PARTS = [(path, phase) for path in ("http", "store") for phase in ("create", "drain")]


def one_rep(args, url, endpoint_id, token, ports, receiver, number):
    load = benchlib.load_average()
    benchlib.progress(f"rep {number + 1}/{args.reps}: load {load[0]:.2f}")
    rep = {"load_before": load}
    for path, phase in PARTS:
        part = run_phase(args, url, endpoint_id, token, path, phase, ports, receiver)
        rep[f"{path}_{phase}"] = part
        shown = ", ".join(f"{m} {part['figures'][m]:,.2f}" for m in MODES)
        benchlib.progress(f"  {path} {phase}: {shown}")
    rep["load_after"] = benchlib.load_average()
    return rep


def medians(reps):
    """Each part's median figures over the reps, and each mode's slowdown: the
    median of the reps' own slowdowns (each rep's modes ran in turns, under
    the same load; the medians of the figures come from different reps, and
    a ratio of them carries the load's swings from one rep to the next), with
    every rep's."""
    out = {}
    for path, phase in PARTS:
        name = f"{path}_{phase}"
        figures = {
            mode: statistics.median(rep[name]["figures"][mode] for rep in reps)
            for mode in MODES
        }
        each = {
            mode: [rep[name]["slowdown"][mode] for rep in reps]
            for mode in ("on", "off")
        }
        out[name] = {
            "figures": figures,
            "slowdown": {mode: statistics.median(each[mode]) for mode in each},
            "reps": each,
        }
    return out


class Collector:
    """The receiver in a process of its own (tests/tracing/receiver.py): its
    URL, its CPU so far, and at the end the spans it got by kind."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "tests/tracing/receiver.py", SERVICE],
            cwd=benchlib.ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self.process.stdout.readline().strip()
        self.spans = None

    def cpu_seconds(self):
        return benchlib.Server(None, self.process.pid, None, None).cpu_seconds()

    def stop(self):
        """Stop it; return its CPU seconds."""
        cpu = self.cpu_seconds()
        self.process.stdin.close()
        self.spans = json.loads(self.process.stdout.readline())
        self.process.wait(timeout=30)
        return cpu


@contextlib.contextmanager
def collector():
    running = Collector()
    try:
        yield running
    finally:
        if running.spans is None:
            running.process.kill()


def main():
    args = options()
    url = args.database_url
    result = benchlib.Result("tracing", args)
    benchlib.progress(f"preparing {url}")
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url, name="tracing")
    benchlib.progress(
        f"{args.workers} processes, {args.seconds:g} s a phase, turns of "
        f"{args.slice:g} s, {args.reps} rep(s)"
    )
    with collector() as receiving:
        receiver = receiving.url
        with (
            servers(url, receiver, args.port, args.request_spans) as ports,
            benchlib.autovacuum_held(),
        ):
            cpu = receiving.cpu_seconds()
            reps = [
                one_rep(args, url, endpoint_id, token, ports, receiver, n)
                for n in range(args.reps)
            ]
        # The servers flushed their spans as they stopped.
        receiver_cpu = receiving.stop() - cpu
        spans = receiving.spans
    benchlib.reset_todos(url)
    on_todos = {
        "created": sum(
            rep[f"{p}_create"]["done"]["on"] for rep in reps for p in ("http", "store")
        ),
        "drained": sum(
            rep[f"{p}_drain"]["done"]["on"] for rep in reps for p in ("http", "store")
        ),
    }
    on_total = on_todos["created"] + on_todos["drained"]
    receiver_cpu_per_todo = receiver_cpu / on_total * 1e6 if on_total else None
    results = benchlib.rounded(
        {
            "reps": reps,
            "median": medians(reps),
            "targets": TARGETS,
            "spans_received": spans,
            "on_todos": on_todos,
            "receiver_cpu_seconds": receiver_cpu,
            "receiver_cpu_us_per_on_todo": receiver_cpu_per_todo,
        },
        4,
    )
    rows = []
    for path, phase in PARTS:
        row = results["median"][f"{path}_{phase}"]
        label = "create p50 ms" if phase == "create" else "claim+complete todos/s"
        rows.append(
            [
                f"{path} {label}",
                *(row["figures"][mode] for mode in MODES),
                f"{row['slowdown']['on']:+.1%}",
                f"{row['slowdown']['off']:+.1%}",
            ]
        )
    benchlib.print_table(
        "Tracing's overhead (slower than bare in each rep, the median over the "
        "reps; targets: on ≤ +5%, off ≤ +1%)",
        ["figure", "on", "off", "bare", "on vs bare", "off vs bare"],
        rows,
    )
    print(
        f"\nspans received: {spans}; on-mode todos {on_todos}; receiver CPU "
        f"{receiver_cpu:.1f} s, {receiver_cpu_per_todo or 0:.0f} µs per on-mode todo"
    )
    parameters = {
        name: getattr(args, name) for name in ("workers", "seconds", "slice", "reps")
    }
    result.write(parameters, results)


if __name__ == "__main__":
    main()
