"""Doorbell latency: how soon does a waiting agent get a todo after it is created?

Question: an agent waits in a long-poll claim on an empty queue; another
creates a todo. How long from sending the create to the claim's answer, next to
PostgreSQL's own LISTEN/NOTIFY wakeup?

    python bench/doorbell_latency.py
    python bench/doorbell_latency.py --samples 200

gunicorn serves Switchboard (gunicorn.conf.py) against the benchmark database.
A waiter thread holds ``POST /api/v1/todos/claim`` with ``wait_seconds=20`` on
an empty queue; once the server's LISTEN connection (one per process, the
doorbell hub) shows in ``pg_stat_activity`` and the claim has had 0.2 s to
start waiting, the producer creates a todo with ``POST /api/v1/todos`` on its
own keep-alive connection. The figure is the time from sending the create to
the claim's response. The baseline, in the same run, is PostgreSQL's own
wakeup: a bare psycopg connection LISTENs on the doorbell channel while another
runs the store's create SQL, timed from sending the create to the
notification's arrival.

It prints p50, p99 and mean (ms) of both, and of the create request alone.
Result: bench/results/latest/doorbell_latency.json (`python bench/report.py`).
"""

import json
import threading
import time

import benchlib
import psycopg

LISTENERS_SQL = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND query LIKE 'LISTEN %%'
   AND state = 'idle'
"""


def wait_for_listeners(conn, count, timeout=10):
    """Wait until ``count`` sessions of this database sit in LISTEN."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if conn.execute(LISTENERS_SQL).fetchone()[0] >= count:
            return
        time.sleep(0.002)
    raise RuntimeError("the long-poll claim never started listening")


def http_samples(url, port, token, samples):
    """Time create → the waiting claim's response, ``samples`` times.

    Returns those latencies and, for reference, the create requests' own.
    """
    producer = benchlib.Client(port, token)
    waiter = benchlib.Client(port, token)
    latencies, creates = [], []
    with psycopg.connect(url, autocommit=True) as monitor:
        idle_listeners = monitor.execute(LISTENERS_SQL).fetchone()[0]
        for number in range(samples):
            answer = {}

            def wait_for_work(answer=answer):
                answer["status"], answer["data"] = waiter.request(
                    "POST",
                    "/api/v1/todos/claim",
                    {"worker": "waiter", "wait_seconds": 20},
                )
                answer["at"] = time.perf_counter()

            thread = threading.Thread(target=wait_for_work)
            thread.start()
            # The server's one LISTEN connection (per process) is up ...
            wait_for_listeners(monitor, max(idle_listeners, 1))
            # ... and the claim has had its first try and is waiting on it.
            time.sleep(0.2)
            sent = time.perf_counter()
            status, _ = producer.request(
                "POST", "/api/v1/todos", {"queue": benchlib.QUEUE, "title": str(number)}
            )
            creates.append(time.perf_counter() - sent)
            thread.join(timeout=30)
            if status != 201 or answer.get("status") != 200:
                raise RuntimeError(f"create {status}, claim {answer.get('status')}")
            latencies.append(answer["at"] - sent)
            waiter.request(
                "POST",
                f"/api/v1/todos/{answer['data']['todo']['id']}/complete",
                {"worker": "waiter"},
            )
    return latencies, creates


def listen_samples(url, endpoint_id, samples, create_sql):
    """Time the store's create SQL → a bare LISTEN connection's notification."""
    from todos import store
    from todos.store import DOORBELL_CHANNEL

    latencies = []
    with (
        psycopg.connect(url, autocommit=True) as listener,
        psycopg.connect(url, autocommit=True) as producer,
    ):
        listener.execute(f"LISTEN {DOORBELL_CHANNEL}")
        for number in range(samples):
            params = store.bind_create(
                endpoint_id, queue=benchlib.QUEUE, title=str(number)
            )
            sent = time.perf_counter()
            producer.execute(create_sql, params)
            for notify in listener.notifies(timeout=10, stop_after=1):
                if json.loads(notify.payload)["id"] != params["id"]:
                    raise RuntimeError("a stray notification")
            latencies.append(time.perf_counter() - sent)
    return latencies


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument("--samples", type=int, default=100, help="per path (100)")
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, samples=5)
    result = benchlib.Result("doorbell_latency", args)

    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url)
    benchlib.setup_django(url)
    from todos.store import lifecycle

    benchlib.reset_todos(url)
    with benchlib.serve(url) as server:
        http, creates = http_samples(url, server.port, token, args.samples)
    listen = listen_samples(url, endpoint_id, args.samples, lifecycle.CREATE_SQL)
    figures = {
        "listen": benchlib.summary(listen),
        "http": benchlib.summary(http),
        "create": benchlib.summary(creates),
    }
    benchlib.print_table(
        f"doorbell latency (ms), {args.samples} samples each",
        ["path", "p50", "p99", "mean"],
        [
            ["create SQL → LISTEN notification (baseline)", *_cells(figures["listen"])],
            ["POST create → waiting POST claim returns", *_cells(figures["http"])],
            ["(the POST create request alone)", *_cells(figures["create"])],
        ],
    )
    result.write({"samples": args.samples}, benchlib.rounded(figures))


def _cells(summary):
    return [summary["p50"], summary["p99"], summary["mean"]]


if __name__ == "__main__":
    main()
