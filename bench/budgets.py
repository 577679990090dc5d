"""Spend budgets measured: what does a budget that does not bind cost?

Question: claim and complete one todo at a time, each complete reporting its
usage, on an endpoint whose every queue has a budget that never binds (an
endpoint budget and a queue budget, both far above what the run spends):
how many todos/s against the same work on an endpoint with no budget at all,
in the same run? The target: at least 0.9x.

    python bench/budgets.py
    python bench/budgets.py --quick
    python bench/budgets.py --workers 4 --seconds 20

Three modes, each an endpoint of its own with one queue filled alike:

- "plain": completes report no usage (the reference; nothing is counted);
- "none": completes report usage, the endpoint has no budget (the ledger
  row is written, no budget matches);
- "budget": completes report usage, and an endpoint budget and a budget of
  the queue (pause, limits no run reaches) count every report under their
  row locks, and every claim looks for budgets in force.

--workers processes take turns of --slice seconds on the wall clock, so all
modes see the same load, claiming and completing through the store. The
result is "budget" over "none" (todos/s). Beside the rate, each mode's
database CPU per todo (the workers' backends, read from /proc when the
server runs on this machine) and its lock waits (the workers' backends
waiting on a lock, on average, by what they wait for) are sampled every
20 ms from beside the workers: where a budget's cost goes.

Result: bench/results/latest/budgets.json (`python bench/report.py`).
"""

import os
import threading
import time
from collections import Counter

import benchlib
import psycopg

MODES = ("plain", "none", "budget")
QUEUE = "bud"
USAGE = {"input_tokens": 900, "output_tokens": 120, "cost_usd": 0.0042, "model": "m"}
# A limit no run reaches: counted on every report, never binding.
NEVER = {"limit_usd": 1_000_000, "limit_tokens": 10_000_000_000}


def options():
    parse = benchlib.parser(__doc__)
    add = parse.add_argument
    add("--workers", type=int, default=2, help="claiming processes")
    add("--seconds", type=float, default=20, help="seconds of the run")
    add("--slice", type=float, default=0.5, help="seconds of one turn")
    add("--todos", type=int, default=30_000, help="pending todos per mode")
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, workers=1, seconds=3, slice=0.25, todos=2_000)
    return args


FILL_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'bench ' || n, '{}'::jsonb,
       'pending', 0, 5, '', clock_timestamp(), now()
  FROM generate_series(1, %(count)s) AS n
"""


def prepare(url, endpoints, args):
    """Empty the todos, the ledger and the budgets; fill each mode's queue;
    give the "budget" endpoint its two budgets."""
    from django.db import connection

    from todos import store

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos, todo_events, usage_ledger, budget_events")
        conn.execute("DELETE FROM budgets")
        for endpoint_id in endpoints.values():
            params = {"endpoint_id": endpoint_id, "queue": QUEUE, "count": args.todos}
            conn.execute(FILL_SQL, params)
        conn.execute("VACUUM ANALYZE todos")
        conn.execute("CHECKPOINT")
    scope = store.Scope(endpoints["budget"])
    store.create_budget(scope, scope="endpoint", window="day", **NEVER)
    store.create_budget(scope, scope="queue", queue=QUEUE, window="hour", **NEVER)
    connection.close()


def store_step(url, endpoint_id, worker, usage):
    """A step that claims and completes one todo through the store."""
    benchlib.setup_django(url)
    from todos import store

    scope = store.Scope(endpoint_id)

    def claim():
        try:
            return store.claim_next(scope, worker, queue=QUEUE)
        except store.NotFound:
            return None

    def complete(todo):
        store.complete_todo(
            scope, todo.id, worker, lease_token=todo.lease_token, usage=usage
        )

    return lambda: benchlib.timed(claim, complete)


# The workers' backends (every client backend of the benchmark's database
# but the sampler's own), and the lock each one waits on, if any.
BACKENDS_SQL = """
SELECT pid, CASE WHEN wait_event_type = 'Lock' THEN wait_event END
  FROM pg_stat_activity
 WHERE datname = current_database() AND backend_type = 'client backend'
   AND pid <> pg_backend_pid()
"""


class Sampler:
    """Every 20 ms, whose turn it is, the workers' backends' CPU ticks since
    the last sample (the server on this machine only) and which of them wait
    on a lock; summed by mode."""

    def __init__(self, url, slice_seconds):
        self.url = url
        self.slice = slice_seconds
        self.stop = threading.Event()
        self.ticks = Counter()
        self.samples = Counter()
        self.waits = {mode: Counter() for mode in MODES}
        self.local = True
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            last = None
            while not self.stop.is_set():
                mode = benchlib.turn_of(MODES, int(time.time() / self.slice))
                rows = conn.execute(BACKENDS_SQL).fetchall()
                pids = [pid for pid, _ in rows]
                self.local = self.local and all(
                    os.path.exists(f"/proc/{pid}") for pid in pids
                )
                ticks = benchlib._cpu_ticks(pids)
                if last is not None and last[1] == pids:
                    self.ticks[last[0]] += ticks - last[2]
                last = (mode, pids, ticks)
                self.samples[mode] += 1
                self.waits[mode].update(lock for _, lock in rows if lock)
                time.sleep(0.02)

    def figures(self, figures):
        """Each mode's database CPU per todo (ms; None when the server is not
        on this machine) and mean lock waits by what is waited for."""
        hz = os.sysconf("SC_CLK_TCK")
        out = {}
        for mode in MODES:
            done = figures[mode]["done"]
            samples = self.samples[mode] or 1
            cpu = self.ticks[mode] / hz / done * 1000 if done and self.local else None
            waits = {lock: count / samples for lock, count in self.waits[mode].items()}
            out[mode] = {
                "server_cpu_ms_per_todo": cpu,
                "lock_waits": sum(waits.values()),
                "lock_waits_by_lock": waits,
            }
        return out


def worker(index, url, endpoints, slice_seconds):
    name = f"w{index}"
    modes = {
        mode: store_step(url, endpoints[mode], name, None if mode == "plain" else USAGE)
        for mode in MODES
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def spent(endpoint_id):
    """What the "budget" endpoint's budgets counted, against the ledger."""
    from django.db import connection

    from todos import store

    scope = store.Scope(endpoint_id)
    counted = [float(budget.spent_usd) for budget in store.list_budgets(scope)]
    ledger = sum(float(row.cost_usd) for row in store.usage_ledger(scope))
    connection.close()
    return {"budgets_usd": counted, "ledger_usd": ledger}


def main():
    args = options()
    url = args.database_url
    result = benchlib.Result("budgets", args)
    benchlib.progress(f"preparing {url}")
    benchlib.prepare_database(url)
    endpoints = {
        mode: benchlib.ensure_endpoint(url, name=f"budgets-{mode}")[0] for mode in MODES
    }
    benchlib.setup_django(url)
    prepare(url, endpoints, args)
    benchlib.progress(
        f"claim+complete: {args.workers} workers, {args.seconds:g} s, "
        f"turns of {args.slice:g} s, modes {', '.join(MODES)}"
    )
    sampler = Sampler(url, args.slice)
    outcomes = benchlib.run_processes(
        worker,
        args.workers,
        args.seconds,
        (url, endpoints, args.slice),
        on_start=sampler.thread.start,
    )
    sampler.stop.set()
    sampler.thread.join()
    figures = benchlib.merge_modes(outcomes)
    sampled = sampler.figures(figures)
    for mode in MODES:
        figures[mode].update(sampled[mode])
    none = figures["none"]["rate"]
    results = {
        **{mode: figures[mode] for mode in MODES},
        "budget_over_none": figures["budget"]["rate"] / none if none else None,
        "none_over_plain": none / figures["plain"]["rate"]
        if figures["plain"]["rate"]
        else None,
        "counted": spent(endpoints["budget"]),
    }
    results = benchlib.rounded(results)
    benchlib.print_table(
        "Budgets",
        ["figure", "value", "target"],
        [
            *[[f"{mode} todos/s", results[mode]["rate"], ""] for mode in MODES],
            *[
                [f"{mode} {name}", results[mode][key], ""]
                for mode in MODES
                for name, key in (
                    ("client CPU ms/todo", "client_cpu_ms_per_todo"),
                    ("server CPU ms/todo", "server_cpu_ms_per_todo"),
                    ("lock waits", "lock_waits"),
                )
            ],
            ["budget / none", results["budget_over_none"], "≥ 0.9"],
            ["none / plain", results["none_over_plain"], ""],
        ],
    )
    parameters = {
        name: getattr(args, name) for name in ("workers", "seconds", "slice", "todos")
    }
    result.write(parameters, results)


if __name__ == "__main__":
    main()
