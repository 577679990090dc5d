"""boto3 through the SQS surface next to the JSON API's batches and pgqueuer, one run.

    python bench/sqs_throughput.py --workers 1,4 --seconds 10

For each worker count, N processes run each system in turn, all in the same run,
behind the same gunicorn (gunicorn.conf.py) and on the same PostgreSQL cluster:

  sqs10         boto3: ReceiveMessage (MaxNumberOfMessages 10) + DeleteMessageBatch
                of the 10, draining a pre-filled queue
  sqs10_before  the same against the server of ``--before REF`` (a git worktree
                of that commit, default HEAD: the previous design), same run
  sqs_ceiling10 the same boto3 loop against bench/sqs_ceiling.py, an SQS server
                that answers from memory (no Django, no database, no signature
                check) behind the same gunicorn and uvicorn: what boto3 and the
                HTTP stack alone allow on this machine, the bare loop of sqs10
  sqs_store10   the same against bench/sqs_store.py: that bare server plus the
                two store calls Switchboard makes for these requests (claim_many,
                acknowledge_many, in todos.aio's pool) and nothing else: no
                Django request, no SigV4 check, no key lookup, no log line
  sqs_store_async10  the same two statements on psycopg's async pool in the
                event loop (bench/sqs_store.py's async_app): no thread hop, no
                Django database layer
  http10        the JSON API: one claim with max_todos 10 + one POST
                /api/v1/todos/batch of 10 completes (bench/peers.py's runner)
  pgqueuer10    pgqueuer's QueueManager, batch_size 10 (bench/peers.py's runner)
  sqs_send10    boto3: SendMessageBatch of 10 (enqueue rate)
  http_send10   the JSON API: POST /api/v1/todos with {"todos": [10 items]}

All but the two ``send`` ones are claim+acknowledge throughput and compare with
each other; the ``send`` ones are enqueue throughput. Every process counts only
what it finishes inside the measurement window (after ``--warmup``). The order
of the systems is shuffled per worker count, anew each run unless ``--seed`` is
given: a shared machine gets busier as a run goes on, and a fixed order would
favour the same systems every time (the order is printed and stored). The load
average and ``uptime`` are printed and stored with the results
(bench/results/sqs-<time>.json): the machine is shared, and the ratios are
what to compare. The CPU table splits each todo's CPU into the server's
(gunicorn's processes), the clients' own, and the whole machine's
(``/proc/stat``, the measurement window only): machine less server less client
is mostly PostgreSQL. Goal (issue #14): sqs10 ≥ 0.6× pgqueuer10 at 4 workers.
"""

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time

import benchlib
import peers

BATCH = 10
SYSTEMS = {
    # A rough ceiling of each rate (todos/s), to size the pre-filled queues.
    "sqs10": 6_000,
    "sqs10_before": 6_000,
    "sqs_ceiling10": 0,
    "sqs_store10": 6_000,
    "sqs_store_async10": 6_000,
    "http10": 10_000,
    "pgqueuer10": 15_000,
    "sqs_send10": 0,
    "http_send10": 0,
}
LABELS = {
    "sqs10": "SQS receive 10 + delete batch",
    "sqs10_before": "the same, the --before tree's server",
    "sqs_ceiling10": "the same against a do-nothing SQS server",
    "sqs_store10": "the same against the store behind a bare server",
    "sqs_store_async10": "the same, its statements on an async pool",
    "http10": "HTTP batch 10",
    "pgqueuer10": "pgqueuer batch 10",
    "sqs_send10": "SQS SendMessageBatch 10",
    "http_send10": "HTTP create batch 10",
}
# The systems that run sqs_receive_step against one of the SQS servers.
RECEIVING = (
    "sqs10",
    "sqs10_before",
    "sqs_ceiling10",
    "sqs_store10",
    "sqs_store_async10",
)
GOALS = (
    ("sqs10", "pgqueuer10", 0.6),
    ("sqs10", "http10", None),
    ("sqs_ceiling10", "pgqueuer10", None),
    ("sqs_store10", "pgqueuer10", None),
    ("sqs_store_async10", "pgqueuer10", None),
    ("sqs10", "sqs_store10", None),
    ("sqs10", "sqs_ceiling10", None),
    ("sqs10", "sqs10_before", None),
)


def sqs_credentials(url, endpoint_id):
    issued = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "sqs_credentials",
            endpoint_id,
            "--rotate",
            "--json",
        ],
        cwd=benchlib.ROOT,
        env=benchlib.django_env(url),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(issued.stdout)


def sqs_client(port, key):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=key["sqs_access_key_id"],
        aws_secret_access_key=key["sqs_secret_access_key"],
        config=Config(retries={"max_attempts": 1}, max_pool_connections=2),
    )


# bench/sqs_ceiling.py checks no signature; boto3 signs with any key.
CEILING_KEY = {
    "sqs_access_key_id": "AKIDCEILING",
    "sqs_secret_access_key": "ceiling-not-secret",
}


class Target:
    """An SQS server the receive loop drains: its gunicorn, key and queue URL."""

    def __init__(self, server, key, queue_url):
        self.server, self.key, self.queue_url = server, key, queue_url

    def address(self):
        """What a worker process needs (picklable): port, key, queue URL."""
        return (self.server.port, self.key, self.queue_url)


def create_queue(port, key, name, deadline=30):
    """Create the queue once the server answers; return its URL."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            return sqs_client(port, key).create_queue(QueueName=name)["QueueUrl"]
        except Exception:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def bare_server(app, queue, env=None):
    """A bench/ ASGI app served like Switchboard: gunicorn, 2 uvicorn workers."""
    port = benchlib.free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--worker-class",
            "uvicorn_worker.UvicornWorker",
            "--workers",
            "2",
            "--chdir",
            str(benchlib.ROOT),
            "--pythonpath",
            str(benchlib.ROOT / "bench"),
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            app,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        server = benchlib.Server(port, process.pid)
        yield Target(server, CEILING_KEY, create_queue(port, CEILING_KEY, queue))
    finally:
        process.terminate()
        process.wait(timeout=30)


def sqs_receive_step(port, key, queue_url):
    client = sqs_client(port, key)

    def step():
        received = client.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=BATCH
        ).get("Messages", [])
        if not received:
            return 0
        entries = [
            {"Id": str(index), "ReceiptHandle": message["ReceiptHandle"]}
            for index, message in enumerate(received)
        ]
        deleted = client.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        if deleted.get("Failed"):
            raise RuntimeError(f"DeleteMessageBatch failed: {deleted['Failed']}")
        return len(received)

    return step


def sqs_send_step(port, key, queue_url, worker):
    client = sqs_client(port, key)
    counter = iter(range(10**9))

    def step():
        n = next(counter)
        entries = [
            {
                "Id": str(index),
                "MessageBody": json.dumps({"w": worker, "n": n, "i": index}),
            }
            for index in range(BATCH)
        ]
        sent = client.send_message_batch(QueueUrl=queue_url, Entries=entries)
        if sent.get("Failed"):
            raise RuntimeError(f"SendMessageBatch failed: {sent['Failed']}")
        return len(sent["Successful"])

    return step


def http_send_step(port, token, worker):
    client = benchlib.Client(port, token)
    counter = iter(range(10**9))

    def step():
        n = next(counter)
        items = [
            {"queue": benchlib.QUEUE, "title": f"{worker} {n} {index}"}
            for index in range(BATCH)
        ]
        status, data = client.request("POST", "/api/v1/todos", {"todos": items})
        if status != 200 or any("error" in item for item in data["results"]):
            raise RuntimeError(f"batch create answered {status}: {data}")
        return BATCH

    return step


def worker(
    index, system, urls, endpoint_id, port, token, key, queue_url, drained, warmup
):
    name = f"w{index}"
    if system in RECEIVING:
        step = sqs_receive_step(*drained)
    elif system == "sqs_send10":
        step = sqs_send_step(port, key, queue_url, name)
    elif system == "http10":
        step = peers.http_step(port, token, name, BATCH)
    elif system == "http_send10":
        step = http_send_step(port, token, name)
    else:
        step = None

    def ready(stop_at):
        window_start = time.perf_counter() + warmup
        if system == "pgqueuer10":
            return peers.pgqueuer_loop(urls["pgqueuer"], BATCH, window_start, stop_at)
        return peers.loop_until(step, window_start, stop_at)

    return ready


def measure(system, workers, args, context):
    urls, endpoint_id, server, token, key, queue_url, targets = context
    count = int(SYSTEMS[system] * (args.seconds + args.warmup + 5) * args.fill)
    if system == "pgqueuer10":
        peers.fill(system, urls, endpoint_id, count)
    else:
        benchlib.reset_todos(urls["switchboard"])
        if count:
            benchlib.fill_pending(urls["switchboard"], endpoint_id, count)
    drained = targets.get(system)
    server_used = drained.server if drained is not None else server
    before = server_used.cpu_seconds()
    window = []

    def sample_the_window():
        time.sleep(args.warmup)
        window.append(benchlib.cpu_times())
        time.sleep(args.seconds)
        window.append(benchlib.cpu_times())

    sampler = threading.Thread(target=sample_the_window, daemon=True)
    outcomes = benchlib.run_processes(
        worker,
        workers,
        args.seconds + args.warmup,
        (
            system,
            urls,
            endpoint_id,
            server.port,
            token,
            key,
            queue_url,
            drained and drained.address(),
            args.warmup,
        ),
        on_start=sampler.start,
    )
    sampler.join()
    done = sum(item["done"] for item in outcomes)
    total = sum(item["total"] for item in outcomes)
    figures = {
        "rate": done / args.seconds,
        "done": done,
        "filled": count,
        # The client's own CPU (boto3 signs, serializes and parses every call).
        "client_cpu_ms_per_todo": (
            sum(item.get("cpu", 0.0) for item in outcomes) / done * 1000
            if done
            else None
        ),
    }
    if system != "pgqueuer10" and total:
        figures["server_cpu_ms_per_todo"] = (
            (server_used.cpu_seconds() - before) / total * 1000
        )
    busy = benchlib.busy_seconds(*window) if len(window) == 2 else None
    if busy is not None and done:
        figures["machine_cpu_ms_per_todo"] = busy / done * 1000
    if count and total >= count:
        figures["warning"] = "the queue ran dry: raise --fill"
    return figures


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load {os.getloadavg()}"


def main():
    parse = benchlib.parser(__doc__.splitlines()[0])
    parse.add_argument("--workers", type=benchlib.int_list, default=[1, 4])
    parse.add_argument("--seconds", type=float, default=10)
    parse.add_argument("--warmup", type=float, default=2)
    parse.add_argument("--fill", type=float, default=1.0)
    parse.add_argument(
        "--seed",
        default=None,
        help="the systems' order's seed (default: a new order each run)",
    )
    parse.add_argument(
        "--before",
        default="HEAD",
        help="the git ref whose server sqs10_before drains (default HEAD)",
    )
    parse.add_argument(
        "--systems",
        default=",".join(name for name in SYSTEMS if name != "sqs10_before"),
        help=f"comma-separated subset of: {','.join(SYSTEMS)} (default: all but "
        "sqs10_before)",
    )
    args = parse.parse_args()
    if args.seed is None:
        args.seed = str(random.SystemRandom().randrange(10**6))
    systems = [name for name in args.systems.split(",") if name]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parse.error(f"unknown systems: {sorted(unknown)}")
    urls, endpoint_id, token = peers.prepare(args, systems)
    key = sqs_credentials(args.database_url, endpoint_id)
    before = uptime()
    print(f"sqs bench: {', '.join(systems)} at {args.workers} workers; {before}")
    rates, samples = {}, {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(benchlib.gunicorn(args.database_url))
        queue_url = create_queue(server.port, key, benchlib.QUEUE)
        targets = {"sqs10": Target(server, key, queue_url)}
        if "sqs_ceiling10" in systems:
            targets["sqs_ceiling10"] = stack.enter_context(
                bare_server("sqs_ceiling:app", "ceiling")
            )
        env = benchlib.django_env(args.database_url, SQS_STORE_ENDPOINT_ID=endpoint_id)
        for system, app in (
            ("sqs_store10", "sqs_store:app"),
            ("sqs_store_async10", "sqs_store:async_app"),
        ):
            if system in systems:
                targets[system] = stack.enter_context(
                    bare_server(app, benchlib.QUEUE, env)
                )
        if "sqs10_before" in systems:
            tree = stack.enter_context(benchlib.before_tree(args.before))
            old = stack.enter_context(benchlib.gunicorn(args.database_url, root=tree))
            targets["sqs10_before"] = Target(
                old, key, create_queue(old.port, key, benchlib.QUEUE)
            )
        context = (urls, endpoint_id, server, token, key, queue_url, targets)
        for workers in args.workers:
            order = list(systems)
            random.Random(f"sqs-{workers}-{args.seed}").shuffle(order)
            print(f"  {workers} workers, in this order: {', '.join(order)}")
            for position, system in enumerate(order):
                started = peers.load()
                figures = measure(system, workers, args, context)
                figures["position"] = position
                figures["load"] = [started, peers.load()]
                samples[(workers, system)] = figures
                rates.setdefault(workers, {})[system] = figures["rate"]
                note = f"  ({figures['warning']})" if "warning" in figures else ""
                print(
                    f"  {workers} workers: {system:12} {figures['rate']:9,.0f} todos/s"
                    f"  load {started:.2f}→{figures['load'][1]:.2f}{note}",
                    flush=True,
                )
    after = uptime()
    benchlib.print_table(
        f"throughput, todos/s, {args.seconds:g} s per system",
        ["workers", *(LABELS[s] for s in systems)],
        [[w, *(rates[w][s] for s in systems)] for w in args.workers],
    )
    ratio_rows = []
    for workers in args.workers:
        for top, bottom, goal in GOALS:
            if top in rates[workers] and rates[workers].get(bottom):
                value = rates[workers][top] / rates[workers][bottom]
                verdict = (
                    "" if goal is None else ("met" if value >= goal else "not met")
                )
                ratio_rows.append(
                    [
                        workers,
                        f"{LABELS[top]} / {LABELS[bottom]}",
                        f"{value:.2f}",
                        "" if goal is None else f"≥ {goal:.1f}",
                        verdict,
                    ]
                )
    if ratio_rows:
        benchlib.print_table(
            "ratios (the goal is for 4 workers)",
            ["workers", "ratio", "value", "goal", ""],
            ratio_rows,
        )
    cpu_rows = [
        [
            w,
            LABELS[s],
            samples[(w, s)].get("server_cpu_ms_per_todo"),
            samples[(w, s)]["client_cpu_ms_per_todo"],
            samples[(w, s)].get("machine_cpu_ms_per_todo"),
        ]
        for w in args.workers
        for s in systems
    ]
    benchlib.print_table(
        "CPU per todo (ms): the server's, the clients' own, and the whole machine's",
        ["workers", "path", "server", "client", "machine"],
        cpu_rows,
    )
    print(f"uptime before: {before}\nuptime after:  {after}")
    benchlib.write_results(
        "sqs",
        {
            "args": vars(args),
            "machine": benchlib.machine(args.database_url),
            "uptime": [before, after],
            "rates": {str(w): r for w, r in rates.items()},
            "samples": {f"{w}:{s}": f for (w, s), f in samples.items()},
        },
    )


if __name__ == "__main__":
    main()
