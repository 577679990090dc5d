"""The Python worker runtime draining a queue, beside the hand-written HTTP loop.

Question: what does switchboard_client's Worker cost next to the loop an agent
would write by hand against the JSON API (bench/peers.py's ``http`` path)?

    python bench/worker_runtime.py              # 4 processes, 3 repetitions
    python bench/worker_runtime.py --quick

In one run, against one gunicorn (gunicorn.conf.py, as `make run` serves), N
processes (``--workers``, 4) drain a pre-filled queue through each path in
turn, the order shuffled per repetition:

  http      peers.py's loop: one keep-alive http.client connection, POST
            /api/v1/todos/claim then POST /api/v1/todos/<id>/complete with the
            lease token, a millisecond's sleep when nothing is claimable
  runtime   a Worker (concurrency 1, one sync handler that returns at once)
            per process: the same claim and complete, through the client's
            AsyncClient (its own keep-alive connections), with its long poll,
            handler thread, heartbeat timer and logging
  runtime8  the same Worker at concurrency 8: it claims up to 8 todos at once
            when slots are free, and the completes that finish while one is
            in flight go together in one POST /api/v1/todos/batch

A path counts the todos finished inside the window (``--warmup`` s after all N
start, for ``--seconds``); the runtime counts each as its handler returns. It
prints each repetition's todos/s and the clients' CPU per todo, then the
medians and each runtime path's ratio to the hand-written loop (the target is
at least 0.9). Result: bench/results/latest/worker_runtime.json.
"""

import asyncio
import random
import statistics
import sys
import time

import benchlib
import peers

# The client of this checkout (the worker processes import this module too).
sys.path.insert(0, str(benchlib.ROOT / "clients" / "python" / "src"))

# Each path's worker concurrency per process (None: the hand-written loop).
PATHS = {"http": None, "runtime": 1, "runtime8": 8}
TARGET_RATIO = 0.9
# A rough ceiling of any path's rate (todos/s), to size the pre-filled queue.
CEILING = 3_000


def runtime_loop(url, token, worker_name, concurrency, window_start, stop_at):
    """Run a Worker until ``stop_at``; count the todos its handler finished in
    the window, and the process's CPU over it."""
    from switchboard_client import Client, Context, Worker

    counted = {"done": 0, "total": 0, "cpu": 0.0}
    client = Client(url, token, worker=worker_name)
    worker = Worker(client, concurrency=concurrency, wait_seconds=1, grace_seconds=5)

    @worker.handler(benchlib.QUEUE)
    def handle(ctx: Context):
        counted["total"] += 1
        if window_start <= time.perf_counter() <= stop_at:
            counted["done"] += 1

    async def run():
        serving = asyncio.create_task(worker.serve())
        await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
        cpu_start = time.process_time()
        await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
        counted["cpu"] = time.process_time() - cpu_start
        worker.stop()
        await serving

    asyncio.run(run())
    return counted


def process(index, name, port, token, warmup):
    """Prepare one process of path ``name``; return its loop for run_processes."""
    worker_name = f"w{index}"
    step = peers.http_step(port, token, worker_name) if name == "http" else None

    def ready(stop_at):
        window_start = time.perf_counter() + warmup
        if step is not None:
            return peers.loop_until(step, window_start, stop_at)
        url = f"http://127.0.0.1:{port}"
        concurrency = PATHS[name]
        return runtime_loop(url, token, worker_name, concurrency, window_start, stop_at)

    return ready


def measure(name, args, database_url, endpoint_id, port, token):
    count = int(CEILING * (args.seconds + args.warmup + 3) * args.fill)
    benchlib.reset_todos(database_url)
    benchlib.fill_pending(database_url, endpoint_id, count)
    outcomes = benchlib.run_processes(
        process,
        args.workers,
        args.seconds + args.warmup,
        (name, port, token, args.warmup),
    )
    done = sum(item["done"] for item in outcomes)
    total = sum(item["total"] for item in outcomes)
    cpu = sum(item["cpu"] for item in outcomes)
    figures = {
        "rate": done / args.seconds,
        "done": done,
        "filled": count,
        "client_cpu_ms_per_todo": cpu / done * 1000 if done else None,
    }
    if total >= count:
        figures["warning"] = "the queue ran dry: raise --fill"
    return figures


def one_rep(number, args, database_url, endpoint_id, port, token):
    order = list(PATHS)
    random.Random(f"worker-runtime-{number}-{args.seed}").shuffle(order)
    load_before = benchlib.load_average()
    benchlib.progress(
        f"rep {number + 1}/{args.reps}: load {load_before[0]:.2f}; "
        f"order {', '.join(order)}"
    )
    rows = {}
    for name in order:
        figures = measure(name, args, database_url, endpoint_id, port, token)
        rows[name] = figures
        note = f"  ({figures['warning']})" if "warning" in figures else ""
        cpu = figures["client_cpu_ms_per_todo"]
        benchlib.progress(
            f"  {name:8} {figures['rate']:8,.0f} todos/s"
            + (f"  client CPU {cpu:.2f} ms/todo" if cpu is not None else "")
            + note
        )
    for name in PATHS:
        if PATHS[name] is not None and rows["http"]["rate"]:
            rows[name]["ratio"] = rows[name]["rate"] / rows["http"]["rate"]
    return {
        "rep": number + 1,
        "order": order,
        "load_before": load_before,
        "load_after": benchlib.load_average(),
        "paths": rows,
    }


def medians(reps):
    out = {}
    for name in PATHS:
        samples = [rep["paths"][name] for rep in reps]
        row = {}
        for key in ("rate", "ratio", "client_cpu_ms_per_todo"):
            values = [item[key] for item in samples if item.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        out[name] = row
    return out


def main():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--workers", type=int, default=4, help="worker processes (default 4)"
    )
    parse.add_argument(
        "--seconds", type=float, default=8, help="measured seconds per path (8)"
    )
    parse.add_argument(
        "--warmup", type=float, default=2, help="seconds before each window (2)"
    )
    parse.add_argument("--reps", type=int, default=3, help="repetitions (3)")
    parse.add_argument(
        "--fill", type=float, default=1.0, help="scale the pre-filled queue (1.0)"
    )
    parse.add_argument(
        "--server-workers",
        type=int,
        default=None,
        help="gunicorn processes (default: gunicorn.conf.py's, GUNICORN_WORKERS or 2)",
    )
    parse.add_argument("--seed", default="0", help="the seed of the paths' order")
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, seconds=1.5, warmup=1.0, reps=1, fill=0.3)
    if args.reps < 1 or args.workers < 1:
        parse.error("--reps and --workers must be at least 1")

    result = benchlib.Result("worker_runtime", args)
    url = args.database_url
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url, name="worker-runtime")
    benchlib.progress(
        f"worker_runtime: {args.workers} processes, {args.seconds:g} s each "
        f"(+{args.warmup:g} s warm-up), {args.reps} rep(s)"
    )
    with benchlib.serve(url, workers=args.server_workers) as server:
        reps = [
            one_rep(n, args, url, endpoint_id, server.port, token)
            for n in range(args.reps)
        ]
    median = medians(reps)
    rows = [
        [
            name,
            median[name]["rate"],
            median[name]["ratio"],
            median[name]["client_cpu_ms_per_todo"],
        ]
        for name in PATHS
    ]
    benchlib.print_table(
        f"Medians of {args.reps} rep(s); target: the runtime ≥ {TARGET_RATIO}× http",
        ["path", "todos/s", "ratio to http", "client CPU ms/todo"],
        rows,
    )
    result.write(
        {
            "workers": args.workers,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "reps": args.reps,
            "server_workers": args.server_workers or "gunicorn.conf.py's",
            "target_ratio": TARGET_RATIO,
            "versions": benchlib.versions("httpx", "django", "gunicorn"),
        },
        benchlib.rounded({"median": median, "reps": reps}),
    )


if __name__ == "__main__":
    main()
