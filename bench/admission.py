"""Admission control measured: is it fair, is it cheap, does priority hold?

Question: with priority, group limits, fair turns and rate limits deciding the
claim, does a small group still get served while another floods the queue,
do weights split the claims as set, what does deciding cost a claim against
the same run with no control at all (on the store and over HTTP), does a
claim stay as fast with 100,000 pending todos over 10,000 groups (half of
them at their limit), and does priority (and its aging) order the claims?

    python bench/admission.py
    python bench/admission.py --quick
    python bench/admission.py --workers 4 --seconds 20

Three parts, each on the benchmark database, each queue of its own:

- fairness: a fair queue; one claimer claims and completes one todo after
  another. "Alone", a small group drops --small todos into the empty queue;
  "flood", another group has dropped --flood todos first. Each small todo's
  wait is create to claim; the result is the small group's p95 wait in the
  flood over its p95 wait alone (the target: at most 2). Then two groups of
  weight 1 and 3, each with more pending todos than --weighted-claims, and
  that many claims: the share each group got (the target: 1:3 within 10%).
- cheapness: two queues filled alike, one with no control ("none") and one
  with every control ("all": --groups groups, group_concurrency 1, fair
  turns, a rate limit far above the rate reached). --workers processes
  take turns of --slice seconds on the wall clock, so both see the same
  load, claiming and completing one todo at a time through the store, then
  the same over HTTP (gunicorn, as `make run` serves): todos/s of "all"
  over "none" (the target: at least 0.85). Both runs are repeated --reps
  times, store and HTTP in turn; the figure is the median rep's. Then the
  claim's p50 on a queue of --deep pending todos over --deep-groups groups,
  half of the groups at their limit of 1, against a queue holding one todo
  (the target: at most 1.2x): the two queues' claims alternate, one each in
  turn, so both see the same machine; each measured claim is released
  again, untimed.
- priority: a level-1 todo created behind --behind level-3 todos must be the
  next claimed; and on a queue with priority_aging_seconds --aging, a
  level-5 todo under a steady stream of level-1 work must be claimed within
  its aging bound, 4 x --aging seconds (level 5 to level 1), plus the time of
  one claim.

Result: bench/results/latest/admission.json (`python bench/report.py`).
"""

import contextlib
import statistics
import time

import benchlib
import psycopg

FAIR = "adm-fair"
WEIGHTED = "adm-weights"
NONE = "adm-none"
ALL = "adm-all"
DEEP = "adm-deep"
SHALLOW = "adm-shallow"
PRIORITY = "adm-priority"
AGING = "adm-aging"
# A rate limit the run never reaches: it is decided on every claim, never binds.
LOOSE_RATE = {"count": 1_000_000, "per_seconds": 1, "burst": 1_000_000}
LONG_LEASE = 3600
MAX_ATTEMPTS = 1000


def options():
    parse = benchlib.parser(__doc__)
    add = parse.add_argument
    add("--flood", type=int, default=10_000, help="the big group's todos")
    add("--small", type=int, default=5, help="the small group's todos")
    add("--weighted-claims", type=int, default=2_000, help="claims over weights 1:3")
    add("--groups", type=int, default=1_000, help="groups of the 'all' queue")
    add("--workers", type=int, default=2, help="claiming processes (cheapness)")
    add("--seconds", type=float, default=10, help="seconds per cheapness run")
    add("--slice", type=float, default=0.5, help="seconds of one turn")
    add("--reps", type=int, default=3, help="repetitions of the cheapness runs")
    add("--deep", type=int, default=100_000, help="pending todos of the deep queue")
    add("--deep-groups", type=int, default=10_000, help="groups of the deep queue")
    add("--samples", type=int, default=500, help="claims timed per queue (p50)")
    add("--behind", type=int, default=10_000, help="level-3 todos ahead of level 1")
    add("--aging", type=int, default=2, help="the aging queue's seconds per level")
    add("--port", type=int, default=0, help="the HTTP server's port (0: any free)")
    args = parse.parse_args()
    benchlib.apply_quick(
        args,
        parse,
        flood=300,
        weighted_claims=200,
        groups=50,
        workers=1,
        seconds=1.5,
        slice=0.25,
        deep=5_000,
        deep_groups=500,
        samples=50,
        behind=500,
        aging=1,
        reps=1,
    )
    if args.reps < 1:
        parse.error("--reps must be at least 1")
    return args


# --- The database ---------------------------------------------------------------

FILL_SQL = """
INSERT INTO todos (id, endpoint_id, queue, title, payload, state, attempt,
                   max_attempts, last_error, created_at, updated_at, group_key,
                   priority)
SELECT gen_random_uuid(), %(endpoint_id)s, %(queue)s, 'bench ' || n, '{}'::jsonb,
       'pending', 0, %(max_attempts)s, '', clock_timestamp(), now(),
       CASE WHEN %(groups)s::int = 1 THEN %(prefix)s
            WHEN %(groups)s::int > 1 THEN %(prefix)s || (n %% %(groups)s::int) END,
       %(priority)s
  FROM generate_series(1, %(count)s) AS n
"""


def reset(url, endpoint_id):
    """Empty the todos, the groups' overrides and the rate buckets."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos, todo_events")
        conn.execute("DELETE FROM queue_groups WHERE endpoint_id = %s", [endpoint_id])
        conn.execute("DELETE FROM rate_buckets WHERE endpoint_id = %s", [endpoint_id])
        conn.execute("CHECKPOINT")


def fill(url, endpoint_id, queue, count, groups=0, prefix="g", priority=3):
    """Insert ``count`` pending todos (over ``groups`` groups), then analyze."""
    params = {
        "endpoint_id": endpoint_id,
        "queue": queue,
        "count": count,
        "groups": groups,
        "prefix": prefix,
        "priority": priority,
        # The timed claims release each todo again: it must never run out.
        "max_attempts": MAX_ATTEMPTS,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL_SQL, params)
        benchlib.settle(conn, url, "todos", "todo_events")


# --- Fairness -------------------------------------------------------------------


def drain_until(scope, queue, wanted, created_at, limit):
    """Claim and complete one todo after another until every id of ``wanted``
    was claimed (or ``limit`` claims); return each wanted todo's wait."""
    from todos import store

    waits = {}
    for _ in range(limit):
        try:
            todo = store.claim_next(scope, "fair", queue=queue)
        except store.NotFound:
            break
        if todo.id in wanted:
            waits[todo.id] = time.perf_counter() - created_at[todo.id]
        store.complete_todo(scope, todo.id, "fair", lease_token=todo.lease_token)
        if len(waits) == len(wanted):
            break
    return list(waits.values())


def small_group_waits(url, endpoint_id, args, flood):
    """The small group's waits, with or without the flood ahead of it."""
    from todos import store
    from todos.store import admission

    reset(url, endpoint_id)
    scope = store.Scope(endpoint_id)
    if flood:
        fill(url, endpoint_id, FAIR, flood, groups=1, prefix="big")
    admission.set_admission(scope, FAIR, fair=True)
    created_at = {}
    for _ in range(args.small):
        todo, _ = store.create_todo(scope, queue=FAIR, group="small")
        created_at[todo.id] = time.perf_counter()
    return drain_until(scope, FAIR, set(created_at), created_at, flood + args.small)


def weighted_split(url, endpoint_id, args):
    """Claims of two groups of weight 1 and 3 on a fair queue."""
    from todos import store
    from todos.store import admission

    reset(url, endpoint_id)
    scope = store.Scope(endpoint_id)
    admission.set_group(scope, WEIGHTED, "w1", weight=1)
    admission.set_group(scope, WEIGHTED, "w3", weight=3)
    for name in ("w1", "w3"):
        fill(url, endpoint_id, WEIGHTED, args.weighted_claims, groups=1, prefix=name)
    admission.set_admission(scope, WEIGHTED, fair=True)
    claims = {"w1": 0, "w3": 0}
    for _ in range(args.weighted_claims):
        todo = store.claim_next(scope, "fair", queue=WEIGHTED)
        claims[todo.group] += 1
        store.complete_todo(scope, todo.id, "fair", lease_token=todo.lease_token)
    w1, w3 = claims["w1"], claims["w3"]
    return {"weight_1": w1, "weight_3": w3, "ratio": w3 / w1 if w1 else None}


def fairness(url, endpoint_id, args):
    benchlib.progress(f"fairness: {args.small} small todos alone")
    alone = small_group_waits(url, endpoint_id, args, 0)
    benchlib.progress(f"fairness: {args.small} small todos behind {args.flood}")
    flooded = small_group_waits(url, endpoint_id, args, args.flood)
    benchlib.progress(f"fairness: {args.weighted_claims} claims, weights 1 and 3")
    split = weighted_split(url, endpoint_id, args)
    p95_alone = benchlib.percentile(alone, 0.95) * 1000
    p95_flood = benchlib.percentile(flooded, 0.95) * 1000
    return {
        "small_claimed": {"alone": len(alone), "flood": len(flooded)},
        "small_p95_wait_ms": {"alone": p95_alone, "flood": p95_flood},
        "flood_over_alone": p95_flood / p95_alone if p95_alone else None,
        "weights": split,
    }


# --- Cheapness ------------------------------------------------------------------


def store_step(url, endpoint_id, worker, queue):
    """A step that claims and completes one todo of ``queue`` through the store."""
    benchlib.setup_django(url)
    from todos import store

    scope = store.Scope(endpoint_id)

    def claim():
        try:
            return store.claim_next(scope, worker, queue=queue)
        except store.NotFound:
            return None

    def complete(todo):
        store.complete_todo(scope, todo.id, worker, lease_token=todo.lease_token)

    return lambda: benchlib.timed(claim, complete)


def store_worker(index, url, endpoint_id, slice_seconds):
    name = f"w{index}"
    modes = {
        "none": store_step(url, endpoint_id, name, NONE),
        "all": store_step(url, endpoint_id, name, ALL),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def http_worker(index, port, token, slice_seconds):
    name = f"w{index}"
    modes = {
        "none": benchlib.timed_http_step(port, token, name, NONE),
        "all": benchlib.timed_http_step(port, token, name, ALL),
    }
    return lambda stop_at: benchlib.alternate(stop_at, slice_seconds, modes)


def controlled_queues(url, endpoint_id, args, rate):
    """Fill "none" and "all" alike for a run at about ``rate`` todos/s a mode."""
    from todos import store
    from todos.store import admission

    reset(url, endpoint_id)
    count = int(max(2_000, rate * args.seconds * 1.5))
    fill(url, endpoint_id, NONE, count)
    fill(url, endpoint_id, ALL, count, groups=args.groups)
    admission.set_admission(
        store.Scope(endpoint_id),
        ALL,
        group_concurrency=1,
        fair=True,
        rate_limit=LOOSE_RATE,
    )
    from django.db import connection

    connection.close()


def ratio_of(figures):
    none = figures["none"]["rate"]
    return {
        "none": figures["none"],
        "all": figures["all"],
        "all_over_none": figures["all"]["rate"] / none if none else None,
    }


def median_rep(runs):
    """The run whose ratio is the median of the reps' (the lower middle one of
    an even count), with every rep's ratio."""
    ratios = [run["all_over_none"] for run in runs]
    middle = statistics.median_low(ratios)
    return {**runs[ratios.index(middle)], "reps": ratios}


def cheap_store(url, endpoint_id, args, number):
    benchlib.progress(
        f"cheapness (store), rep {number + 1}/{args.reps}: {args.workers} workers, "
        f"{args.seconds:g} s, {args.groups} groups"
    )
    controlled_queues(url, endpoint_id, args, 3_000)
    outcomes = benchlib.run_processes(
        store_worker, args.workers, args.seconds, (url, endpoint_id, args.slice)
    )
    return ratio_of(benchlib.merge_modes(outcomes))


@contextlib.contextmanager
def served(url, port):
    with benchlib.serve(url, port=port or None) as server:
        yield server


def cheap_http(url, endpoint_id, token, args, number):
    benchlib.progress(
        f"cheapness (HTTP), rep {number + 1}/{args.reps}: {args.workers} workers, "
        f"{args.seconds:g} s"
    )
    controlled_queues(url, endpoint_id, args, 1_500)
    with served(url, args.port) as server:
        outcomes = benchlib.run_processes(
            http_worker, args.workers, args.seconds, (server.port, token, args.slice)
        )
    return ratio_of(benchlib.merge_modes(outcomes))


def cheapness(url, endpoint_id, token, args):
    """Store and HTTP in turn, --reps times; each the median rep's figures."""
    store_runs, http_runs = [], []
    for number in range(args.reps):
        store_runs.append(cheap_store(url, endpoint_id, args, number))
        http_runs.append(cheap_http(url, endpoint_id, token, args, number))
    return {"cheap_store": median_rep(store_runs), "cheap_http": median_rep(http_runs)}


def claim_p50s(scope, queues, samples):
    """Time ``samples`` claims of each queue, one of each in turn, releasing
    each again (untimed): each queue's summary."""
    from todos import store

    times = {queue: [] for queue in queues}
    for _ in range(samples):
        for queue in queues:
            start = time.perf_counter()
            todo = store.claim_next(scope, "probe", queue=queue, lease_seconds=60)
            times[queue].append(time.perf_counter() - start)
            store.release_todo(scope, todo.id, "probe", lease_token=todo.lease_token)
    return [benchlib.summary(times[queue]) for queue in queues]


def deep_claims(url, endpoint_id, args):
    from todos import store
    from todos.store import admission

    benchlib.progress(
        f"cheapness (deep): {args.deep} pending over {args.deep_groups} groups, "
        "half at their limit"
    )
    reset(url, endpoint_id)
    scope = store.Scope(endpoint_id)
    fill(url, endpoint_id, DEEP, args.deep, groups=args.deep_groups)
    fill(url, endpoint_id, SHALLOW, 1, groups=1)
    for queue in (DEEP, SHALLOW):
        admission.set_admission(scope, queue, group_concurrency=1)
    at_limit = 0
    while at_limit < args.deep_groups // 2:
        batch = min(store.MAX_CLAIM_BATCH, args.deep_groups // 2 - at_limit)
        held = store.claim_many(
            scope, "holder", limit=batch, queue=DEEP, lease_seconds=LONG_LEASE
        )
        if not held:
            break
        at_limit += len(held)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE todos")
    deep, shallow = claim_p50s(scope, (DEEP, SHALLOW), args.samples)
    return {
        "groups_at_limit": at_limit,
        "deep_claim_ms": deep,
        "shallow_claim_ms": shallow,
        "deep_over_shallow_p50": deep["p50"] / shallow["p50"],
    }


# --- Priority -------------------------------------------------------------------


def priority_first(url, endpoint_id, args):
    from todos import store

    benchlib.progress(f"priority: a level-1 todo behind {args.behind} at level 3")
    reset(url, endpoint_id)
    scope = store.Scope(endpoint_id)
    fill(url, endpoint_id, PRIORITY, args.behind)
    urgent, _ = store.create_todo(scope, queue=PRIORITY, priority=1)
    start = time.perf_counter()
    claimed = store.claim_next(scope, "prio", queue=PRIORITY)
    return {
        "behind": args.behind,
        "urgent_claimed_next": claimed.id == urgent.id,
        "claim_ms": (time.perf_counter() - start) * 1000,
    }


def aging_bound(url, endpoint_id, args):
    from todos import store
    from todos.store import admission

    bound = 4 * args.aging
    benchlib.progress(
        f"priority: a level-5 todo under steady level-1 work, aging "
        f"{args.aging} s per level (bound {bound} s)"
    )
    reset(url, endpoint_id)
    scope = store.Scope(endpoint_id)
    admission.set_admission(scope, AGING, priority_aging_seconds=args.aging)
    low, _ = store.create_todo(scope, queue=AGING, priority=5)
    start = time.perf_counter()
    store.create_many(scope, [{"queue": AGING, "priority": 1}] * 20)
    claims = 0
    waited = None
    while time.perf_counter() - start < bound * 3 + 5:
        store.create_todo(scope, queue=AGING, priority=1)
        todo = store.claim_next(scope, "aging", queue=AGING)
        claims += 1
        store.complete_todo(scope, todo.id, "aging", lease_token=todo.lease_token)
        if todo.id == low.id:
            waited = time.perf_counter() - start
            break
    return {
        "aging_seconds": args.aging,
        "bound_seconds": bound,
        "level_5_claimed_after_seconds": waited,
        "level_1_claims_before": claims - 1 if waited is not None else claims,
        # The bound, plus a second for the claims in flight as it passes.
        "within_bound": waited is not None and waited <= bound + 1,
    }


# --- The run --------------------------------------------------------------------


def main():
    args = options()
    url = args.database_url
    result = benchlib.Result("admission", args)
    benchlib.progress(f"preparing {url}")
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url, name="admission")
    benchlib.setup_django(url)
    with benchlib.autovacuum_held():
        results = {
            "fairness": fairness(url, endpoint_id, args),
            **cheapness(url, endpoint_id, token, args),
            "deep": deep_claims(url, endpoint_id, args),
            "priority": priority_first(url, endpoint_id, args),
            "aging": aging_bound(url, endpoint_id, args),
        }
    reset(url, endpoint_id)
    results = benchlib.rounded(results)
    fair, weights = results["fairness"], results["fairness"]["weights"]
    benchlib.print_table(
        "Admission",
        ["figure", "value", "target"],
        [
            ["small group p95 wait, flood / alone", fair["flood_over_alone"], "≤ 2"],
            ["claims weight 3 / weight 1", weights["ratio"], "3 ± 10%"],
            [
                "store: all controls / none",
                results["cheap_store"]["all_over_none"],
                "≥ 0.85",
            ],
            [
                "HTTP: all controls / none",
                results["cheap_http"]["all_over_none"],
                "≥ 0.85",
            ],
            [
                "claim p50, deep / one todo",
                results["deep"]["deep_over_shallow_p50"],
                "≤ 1.2",
            ],
            [
                "level 1 claimed next behind level 3",
                results["priority"]["urgent_claimed_next"],
                "True",
            ],
            [
                "level 5 claimed within the aging bound",
                results["aging"]["within_bound"],
                "True",
            ],
        ],
    )
    parameters = {
        name: getattr(args, name)
        for name in (
            "flood",
            "small",
            "weighted_claims",
            "groups",
            "workers",
            "seconds",
            "slice",
            "reps",
            "deep",
            "deep_groups",
            "samples",
            "behind",
            "aging",
        )
    }
    result.write(parameters, results)


if __name__ == "__main__":
    main()
