"""boto3 through the SQS surface next to the JSON API's batches and pgqueuer, one run.

    python bench/sqs_throughput.py --workers 1,4 --seconds 10

For each worker count, N processes run each system in turn, all in the same run,
behind the same gunicorn (gunicorn.conf.py) and on the same PostgreSQL cluster:

  sqs10         boto3: ReceiveMessage (MaxNumberOfMessages 10) + DeleteMessageBatch
                of the 10, draining a pre-filled queue
  http10        the JSON API: one claim with max_todos 10 + one POST
                /api/v1/todos/batch of 10 completes (bench/peers.py's runner)
  pgqueuer10    pgqueuer's QueueManager, batch_size 10 (bench/peers.py's runner)
  sqs_send10    boto3: SendMessageBatch of 10 (enqueue rate)
  http_send10   the JSON API: POST /api/v1/todos with {"todos": [10 items]}

The first three are claim+acknowledge throughput and compare with each other;
the two ``send`` ones are enqueue throughput. Every process counts only what it
finishes inside the measurement window (after ``--warmup``); the order of the
systems is shuffled per worker count. The load average and ``uptime`` are
printed and stored with the results (bench/results/sqs-<time>.json): the
machine is shared, and the ratios are what to compare. Goal (issue #14): sqs10
≥ 0.6× pgqueuer10 at 4 workers.
"""

import json
import os
import random
import subprocess
import sys
import time

import benchlib
import peers

BATCH = 10
SYSTEMS = {
    # A rough ceiling of each rate (todos/s), to size the pre-filled queues.
    "sqs10": 6_000,
    "http10": 10_000,
    "pgqueuer10": 15_000,
    "sqs_send10": 0,
    "http_send10": 0,
}
LABELS = {
    "sqs10": "SQS receive 10 + delete batch",
    "http10": "HTTP batch 10",
    "pgqueuer10": "pgqueuer batch 10",
    "sqs_send10": "SQS SendMessageBatch 10",
    "http_send10": "HTTP create batch 10",
}
GOALS = (("sqs10", "pgqueuer10", 0.6), ("sqs10", "http10", None))


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


def worker(index, system, urls, endpoint_id, port, token, key, queue_url, warmup):
    name = f"w{index}"
    if system == "sqs10":
        step = sqs_receive_step(port, key, queue_url)
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
    urls, endpoint_id, server, token, key, queue_url = context
    count = int(SYSTEMS[system] * (args.seconds + args.warmup + 5) * args.fill)
    if system == "pgqueuer10":
        peers.fill(system, urls, endpoint_id, count)
    else:
        benchlib.reset_todos(urls["switchboard"])
        if count:
            benchlib.fill_pending(urls["switchboard"], endpoint_id, count)
    before = server.cpu_seconds()
    outcomes = benchlib.run_processes(
        worker,
        workers,
        args.seconds + args.warmup,
        (system, urls, endpoint_id, server.port, token, key, queue_url, args.warmup),
    )
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
            (server.cpu_seconds() - before) / total * 1000
        )
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
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of: {','.join(SYSTEMS)}",
    )
    args = parse.parse_args()
    systems = [name for name in args.systems.split(",") if name]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parse.error(f"unknown systems: {sorted(unknown)}")
    urls, endpoint_id, token = peers.prepare(args, systems)
    key = sqs_credentials(args.database_url, endpoint_id)
    before = uptime()
    print(f"sqs bench: {', '.join(systems)} at {args.workers} workers; {before}")
    rates, samples = {}, {}
    with benchlib.gunicorn(args.database_url) as server:
        queue_url = sqs_client(server.port, key).create_queue(QueueName=benchlib.QUEUE)[
            "QueueUrl"
        ]
        context = (urls, endpoint_id, server, token, key, queue_url)
        for workers in args.workers:
            order = list(systems)
            random.Random(f"sqs-{workers}").shuffle(order)
            for system in order:
                started = peers.load()
                figures = measure(system, workers, args, context)
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
        ]
        for w in args.workers
        for s in systems
    ]
    benchlib.print_table(
        "CPU per todo (ms): gunicorn's, and the client processes' own",
        ["workers", "path", "server", "client"],
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
