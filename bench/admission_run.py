"""Admission under fire: a randomized run of real processes, then the checker.

Question: whatever runs at once, does any group ever hold more claimed todos
than its limit, or any rate window admit more than its bucket?

Worker processes create grouped and ungrouped todos (priorities, costs) and
claim them, single and in batches, by queue and by id, then complete, fail,
release, ask (answered later by another worker), cancel, or walk away and let
the lease lapse; a reaper process sweeps lapsed leases, due retries and
expired questions all along; a settings process lowers and raises the queue's
group_concurrency and the groups' overrides (pausing and resuming some), and
turns either queue's fair turns on and off, while it runs (so claims go
through every claim statement: the plain claim, the fair claims and the
admitting claim). Queue ``adm`` limits groups; queue ``adm-rate`` has a rate limit and
a per-group rate limit.

By default the run is over ``--servers`` (2) app servers, served as
``make run`` serves (gunicorn with uvicorn workers): every worker but
``--direct`` (1) goes through the JSON API of one of them (in turn), with
single and batch claims and acknowledgements, and the settings changer
through their queue and group endpoints; the ``--direct`` workers and the
reaper call the store on their own connections. ``--servers 0`` runs every
worker on the store.

Afterwards ``todos.store.admission_check`` replays ``todo_events`` and looks,
for every group, for any instant with more claimed todos than the limit the
claim was admitted under, and for any rate window with more cost than the
bucket allows. The run fails (exit 1) on any violation.

    python bench/admission_run.py --operations 100000 --processes 6 --port 18500
    python bench/admission_run.py --quick

With ``--ha`` the run is on a throwaway failover pair (scripts/ha.sh: Patroni
and etcd on free ports, a temporary data folder, deleted afterwards) whose
primary's postmaster is killed ``--kill-after`` seconds into the run. Every
process lives through the outage: a call that meets no primary (the store's
Unavailable) is counted and tried again on a new connection; the checker then
replays the events the new primary has. The app servers reach the pair as
every server of a failover pair does, through a multi-host ``DATABASE_URL``
(``target_session_attrs=read-write``); an answer 503, or a connection that
drops, is an outage the worker tries again.

    python bench/admission_run.py --ha --operations 100000
"""

import contextlib
import http.client
import importlib.util
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib
import psycopg

GROUPED = "adm"
RATED = "adm-rate"
RATE = {"count": 40, "per_seconds": 1, "burst": 10}
GROUP_RATE = {"count": 10, "per_seconds": 1, "burst": 4}
# The todos a worker keeps waiting beyond those it claimed.
BACKLOG = 150
# Expected store errors of a race (a lease taken over, a todo gone on).
RACE_ERRORS = ("Conflict", "NotFound", "LeaseSuperseded")


def options():
    parse = benchlib.parser(__doc__)
    parse.add_argument(
        "--operations",
        type=int,
        default=100_000,
        help="store calls to make in all (default: %(default)s)",
    )
    parse.add_argument(
        "--processes",
        type=int,
        default=6,
        help="worker processes (default: %(default)s)",
    )
    parse.add_argument(
        "--groups",
        type=int,
        default=24,
        help="groups the todos spread over (default: %(default)s)",
    )
    parse.add_argument(
        "--seconds",
        type=float,
        default=1800,
        help="stop after this long even if short of the operations",
    )
    parse.add_argument("--seed", type=int, default=45)
    parse.add_argument(
        "--servers",
        type=int,
        default=2,
        help="app servers the workers go through (0: all on the store)",
    )
    parse.add_argument(
        "--direct",
        type=int,
        default=1,
        help="workers that call the store beside the served ones (%(default)s)",
    )
    parse.add_argument(
        "--server-workers",
        type=int,
        default=1,
        help="gunicorn worker processes per app server (%(default)s)",
    )
    parse.add_argument(
        "--port",
        type=int,
        default=0,
        help="the first app server's port, the next ones follow (0: any free)",
    )
    parse.add_argument(
        "--fair",
        action="store_true",
        help="both queues start with fair turns (the settings changer turns them "
        "on and off in any case)",
    )
    parse.add_argument(
        "--ha",
        action="store_true",
        help="run on a throwaway failover pair and kill its primary mid-run",
    )
    parse.add_argument(
        "--kill-after",
        type=float,
        default=10,
        help="with --ha: kill the primary this long into the run (%(default)s s)",
    )
    args = parse.parse_args()
    benchlib.apply_quick(args, parse, operations=3000, processes=4, groups=8)
    return args


def outages():
    """The errors of a call that met no primary: the store's Unavailable, and
    Django's own when a connection dies outside a store call."""
    from django.db import InterfaceError, OperationalError

    from todos import store

    return (store.Unavailable, OperationalError, InterfaceError)


def after_outage():
    """Drop the dead connection and pause before trying again."""
    from django.db import connection

    with contextlib.suppress(Exception):
        connection.close()
    time.sleep(0.1)


def reset(url, endpoint_id):
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE todos, todo_events")
        conn.execute("DELETE FROM queue_groups WHERE endpoint_id = %s", [endpoint_id])
        conn.execute("DELETE FROM rate_buckets WHERE endpoint_id = %s", [endpoint_id])


def worker(index, url, endpoint_id, quota, groups, seed, finished):
    """One worker process: a loop of random store calls until its quota."""
    benchlib.setup_django(url)
    from todos import store

    rng = random.Random(seed * 1000 + index)
    scope = store.Scope(endpoint_id)
    names = [f"org/repo-{n}" for n in range(groups)]
    asked = []

    def create(counts):
        items = []
        for _ in range(rng.randint(1, 8)):
            item = {"queue": rng.choice([GROUPED, GROUPED, RATED])}
            if rng.random() < 0.85:
                item["group"] = rng.choice(names)
            if rng.random() < 0.3:
                item["priority"] = rng.randint(1, 5)
            if rng.random() < 0.3:
                item["cost"] = rng.choice([0.5, 1, 2, 3])
            items.append(item)
        store.create_many(scope, items)
        counts["created"] += len(items)

    def settle(todo, counts):
        roll = rng.random()
        worker_name = todo.owner
        if roll < 0.5:
            store.complete_todo(
                scope, todo.id, worker_name, lease_token=todo.lease_token
            )
        elif roll < 0.6:
            store.fail_todo(scope, todo.id, worker_name, error="bench")
        elif roll < 0.7:
            store.release_todo(
                scope, todo.id, worker_name, lease_token=todo.lease_token
            )
        elif roll < 0.78:
            store.ask(
                scope,
                todo.id,
                worker_name,
                question="go on?",
                return_to="pool",
                lease_token=todo.lease_token,
            )
            asked.append(todo.id)
        elif roll < 0.84:
            store.cancel_todo(scope, todo.id)
            counts["cancel_requests"] += 1
        # else: walk away; the short lease lapses under the reaper.

    def ready(stop_at):
        counts = {
            "done": 0,
            "claims": 0,
            "claimed": 0,
            "errors": 0,
            "races": 0,
            "cancel_requests": 0,
            "created": 0,
            "outage_retries": 0,
        }
        reported = time.perf_counter()
        errors = []
        outage = outages()
        while counts["done"] < quota and time.perf_counter() < stop_at:
            roll = rng.random()
            try:
                # Keep this worker's backlog near BACKLOG todos.
                if roll < 0.18 and counts["created"] - counts["claimed"] < BACKLOG:
                    create(counts)
                elif roll < 0.22 and asked:
                    store.answer_todo(
                        scope, asked.pop(rng.randrange(len(asked))), "yes"
                    )
                elif roll < 0.25:
                    pending = store.list_todos(scope, state="pending", limit=5).todos
                    if pending:
                        store.cancel_todo(scope, rng.choice(pending).id)
                else:
                    limit = rng.choice([1, 1, 1, 3, 5, 10])
                    claimed = store.claim_many(
                        scope,
                        f"w{index}",
                        limit=limit,
                        queue=rng.choice([None, GROUPED, RATED]),
                        lease_seconds=rng.choice([1, 2, 5]),
                    )
                    counts["claims"] += 1
                    counts["claimed"] += len(claimed)
                    for todo in claimed:
                        counts["done"] += 1
                        try:
                            settle(todo, counts)
                        except store.StoreError as exc:
                            if type(exc).__name__ not in RACE_ERRORS:
                                raise
                            counts["races"] += 1
            except outage as exc:
                # No primary (a failover): the call is tried again, as a
                # client would; what it did or not is in the events.
                counts["outage_retries"] += 1
                if len(errors) < 5:
                    errors.append(f"retried after {exc!r}")
                after_outage()
            except store.StoreError as exc:
                if type(exc).__name__ not in RACE_ERRORS:
                    counts["errors"] += 1
                    errors.append(repr(exc))
                else:
                    counts["races"] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                counts["errors"] += 1
                errors.append(repr(exc))
                from django.db import connection

                connection.close()
            counts["done"] += 1
            if index == 0 and time.perf_counter() - reported > 10:
                reported = time.perf_counter()
                benchlib.progress(f"  worker 0: {counts['done']} operations")
        counts["error_samples"] = errors[:5]
        (finished / f"done-{index}").touch()
        return counts

    return ready


class Outage(Exception):
    """An answer 503, or a connection that dropped: no primary to serve."""


class Race(Exception):
    """An answer 404 or 409: a race another worker, the reaper or a cancel won."""


class Api:
    """A worker's keep-alive JSON client of one app server, sorting answers
    into success, race (404, 409), outage (503, dropped) and error."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.client = benchlib.Client(port, token=token, timeout=60)
        self.requests = 0

    def call(self, method, path, body=None, *, empty=False):
        """The answer's JSON; with ``empty``, None for a 404 (no work)."""
        self.requests += 1
        try:
            status, data = self.client.request(method, f"/api/v1/{path}", body)
        except (OSError, http.client.HTTPException) as exc:
            self.client = benchlib.Client(self.port, token=self.token, timeout=60)
            raise Outage(f"{method} {path}: {exc!r}") from None
        if status == 503:
            raise Outage(f"{method} {path}: 503 {data}")
        if status == 404 and empty:
            return None
        if status in (404, 409):
            raise Race(f"{method} {path}: {status} {data}")
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data}")
        return data


def served_worker(index, port, token, quota, groups, seed, finished):
    """One worker process through an app server's JSON API: the store
    worker's mix of calls, plus claims by id, batch acknowledgements and
    priority changes."""
    rng = random.Random(seed * 1000 + index)
    api = Api(port, token)
    names = [f"org/repo-{n}" for n in range(groups)]
    name = f"w{index}"
    asked = []

    def create(counts):
        items = []
        for _ in range(rng.randint(1, 8)):
            item = {"queue": rng.choice([GROUPED, GROUPED, RATED]), "title": "t"}
            if rng.random() < 0.85:
                item["group"] = rng.choice(names)
            if rng.random() < 0.3:
                item["priority"] = rng.randint(1, 5)
            if rng.random() < 0.3:
                item["cost"] = rng.choice([0.5, 1, 2, 3])
            items.append(item)
        answer = api.call("POST", "todos", {"todos": items})
        made = [item for item in answer["results"] if "todo" in item]
        if len(made) != len(items):
            raise RuntimeError(f"batch create refused: {answer['results']}")
        counts["created"] += len(items)

    def settle(todo, counts):
        roll = rng.random()
        path = f"todos/{todo['id']}"
        owner = {"worker": name, "lease_token": todo["lease_token"]}
        if roll < 0.5:
            api.call("POST", f"{path}/complete", {**owner, "result": {"ok": 1}})
        elif roll < 0.6:
            api.call("POST", f"{path}/fail", {**owner, "error": "bench"})
        elif roll < 0.7:
            api.call("POST", f"{path}/release", owner)
        elif roll < 0.78:
            api.call(
                "POST",
                f"{path}/ask",
                {**owner, "question": "go on?", "return_to": "pool"},
            )
            asked.append(todo["id"])
        elif roll < 0.84:
            api.call("POST", f"{path}/cancel", {"reason": "bench"})
            counts["cancel_requests"] += 1
        # else: walk away; the short lease lapses under the reaper.

    def settle_batch(todos, counts):
        """Acknowledge a batch claim in one call: complete, fail or release
        each todo (a 404 or 409 in a result is a race, as alone)."""
        actions = []
        for todo in todos:
            op = rng.choice(["complete", "complete", "fail", "release"])
            action = {"op": op, "id": todo["id"], "lease_token": todo["lease_token"]}
            if op == "complete":
                action["result"] = {"ok": 1}
            elif op == "fail":
                action["error"] = "bench"
            actions.append(action)
        answer = api.call("POST", "todos/batch", {"worker": name, "actions": actions})
        for result in answer["results"]:
            if result["status"] in (404, 409):
                counts["races"] += 1
            elif result["status"] != 200:
                raise RuntimeError(f"batch acknowledge: {result}")

    def claim(counts):
        limit = rng.choice([1, 1, 1, 3, 5, 10])
        body = {"worker": name, "lease_seconds": rng.choice([1, 2, 5])}
        queue = rng.choice([None, GROUPED, RATED])
        if queue is not None:
            body["queue"] = queue
        if limit == 1 and rng.random() < 0.5:
            answer = api.call("POST", "todos/claim", body, empty=True)
            claimed = [] if answer is None else [answer["todo"]]
        else:
            answer = api.call("POST", "todos/claim", {**body, "max_todos": limit})
            claimed = answer["todos"]
        counts["claims"] += 1
        counts["claimed"] += len(claimed)
        if len(claimed) > 1 and rng.random() < 0.3:
            counts["done"] += 1
            settle_batch(claimed, counts)
            return
        for todo in claimed:
            counts["done"] += 1
            try:
                settle(todo, counts)
            except Race:
                counts["races"] += 1

    def pick_pending(counts):
        """Cancel, reprioritize or claim by id one of a few pending todos."""
        pending = api.call("GET", "todos?state=pending&limit=5")["todos"]
        if not pending:
            return
        todo = rng.choice(pending)
        roll = rng.random()
        if roll < 0.4:
            api.call("POST", f"todos/{todo['id']}/cancel", {})
        elif roll < 0.6:
            api.call(
                "POST", f"todos/{todo['id']}/priority", {"priority": rng.randint(1, 5)}
            )
        else:
            answer = api.call(
                "POST",
                f"todos/{todo['id']}/claim",
                {"worker": name, "lease_seconds": rng.choice([1, 2, 5])},
            )
            counts["claims"] += 1
            counts["claimed"] += 1
            counts["done"] += 1
            settle(answer["todo"], counts)

    def ready(stop_at):
        counts = {
            "done": 0,
            "claims": 0,
            "claimed": 0,
            "errors": 0,
            "races": 0,
            "cancel_requests": 0,
            "created": 0,
            "outage_retries": 0,
        }
        reported = time.perf_counter()
        errors = []
        while counts["done"] < quota and time.perf_counter() < stop_at:
            roll = rng.random()
            try:
                if roll < 0.18 and counts["created"] - counts["claimed"] < BACKLOG:
                    create(counts)
                elif roll < 0.22 and asked:
                    todo_id = asked.pop(rng.randrange(len(asked)))
                    api.call("POST", f"todos/{todo_id}/answer", {"answer": "yes"})
                elif roll < 0.25:
                    pick_pending(counts)
                else:
                    claim(counts)
            except Outage as exc:
                counts["outage_retries"] += 1
                if len(errors) < 5:
                    errors.append(f"retried after {exc}")
                time.sleep(0.1)
            except Race:
                counts["races"] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                counts["errors"] += 1
                errors.append(repr(exc))
            counts["done"] += 1
            if time.perf_counter() - reported > 10 and index == 1:
                reported = time.perf_counter()
                benchlib.progress(f"  served worker {index}: {counts['done']} calls")
        counts["error_samples"] = errors[:5]
        counts["requests"] = api.requests
        (finished / f"done-{index}").touch()
        return counts

    return ready


def sweeper(index, url, endpoint_id, groups, seed, finished, processes, served):
    """The reaper, the retry scheduler and the questions' deadlines (index 0),
    or the settings changer (index 1), until the workers stop. With
    ``served`` (the app servers' ports and the token) the settings changer
    goes through the servers' JSON API, in turn."""
    benchlib.setup_django(url)
    from todos import store
    from todos.store import admission, sweeps

    rng = random.Random(seed + index)
    scope = store.Scope(endpoint_id)
    names = [f"org/repo-{n}" for n in range(groups)]
    ports, token = served
    apis = [Api(port, token) for port in ports]

    def ready(stop_at):
        counts = {"done": 0, "reaped": 0, "requeued": 0, "changes": 0, "outages": 0}
        outage = (*outages(), Outage)
        while time.perf_counter() < stop_at:
            if len(list(finished.glob("done-*"))) >= processes:
                break
            try:
                step(counts)
            except outage:
                counts["outages"] += 1
                after_outage()
            counts["done"] += 1
        return counts

    def step(counts):
        """One pass of the reaper, or one change of the limits."""
        if index == 0:
            counts["reaped"] += len(sweeps.reap_expired())
            counts["requeued"] += len(sweeps.requeue_due_retries())
            sweeps.expire_questions()
            time.sleep(0.1)
            return
        roll = rng.random()
        if roll < 0.4:
            queue, group = GROUPED, None
            setting = {"group_concurrency": rng.choice([1, 2, 2, 3, 4])}
        elif roll < 0.8:
            queue, group = GROUPED, rng.choice(names)
            setting = {"concurrency": rng.choice([None, 0, 1, 2, 5])}
        elif roll < 0.92:
            queue, group = rng.choice([GROUPED, RATED]), rng.choice(names)
            setting = {"paused": rng.random() < 0.5}
        else:
            # Fair turns on and off: claims go through the fair claims and
            # the admitting claim in turn.
            queue, group = rng.choice([GROUPED, RATED]), None
            setting = {"fair": rng.random() < 0.5}
        if apis:
            api = apis[counts["changes"] % len(apis)]
            if group is None:
                api.call("PATCH", f"queues/{queue}", setting)
            else:
                api.call("PUT", f"queues/{queue}/groups/{group}", setting)
        elif group is None:
            admission.set_admission(scope, queue, **setting)
        else:
            admission.set_group(scope, queue, group, **setting)
        counts["changes"] += 1
        time.sleep(0.2)

    return ready


def main():
    args = options()
    if not args.ha:
        return measure(args, args.database_url)
    cluster = ha_cluster()
    benchlib.progress(f"starting a failover pair (data: {cluster.datadir})")
    try:
        cluster.start()
        return measure(args, cluster.url, cluster)
    finally:
        cluster.destroy()


def ha_cluster():
    """A throwaway Patroni pair on free ports: scripts/resilience.py's."""
    path = benchlib.ROOT / "scripts" / "resilience.py"
    spec = importlib.util.spec_from_file_location("resilience_admission", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HaCluster()


def kill_primary_later(cluster, seconds, outcome):
    """Start a thread that kills the pair's primary after ``seconds`` and
    notes in ``outcome`` which node and how long until a new primary."""

    def kill():
        time.sleep(seconds)
        # Patroni's API may be slow to answer on a busy machine: wait for it
        # to name the primary rather than give up on the kill.
        deadline = time.monotonic() + 60
        while cluster.primary() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        outcome["killed"] = cluster.NODES[cluster.kill_primary()]
        killed_at = time.perf_counter()
        benchlib.progress(f"killed the primary ({outcome['killed']})")
        while time.perf_counter() - killed_at < 120:
            node = cluster.primary()
            if node is not None and cluster.NODES[node] != outcome["killed"]:
                outcome["promoted_seconds"] = round(time.perf_counter() - killed_at, 1)
                benchlib.progress(f"new primary {cluster.NODES[node]}")
                return
            time.sleep(0.2)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def check_after_outage(admission_check, endpoint_id):
    """The checker's report, tried again while the new primary comes up."""
    from todos import store

    deadline = time.monotonic() + 120
    while True:
        try:
            return admission_check.check(endpoint_id=endpoint_id)
        except (store.Unavailable, *outages()[1:]):
            if time.monotonic() > deadline:
                raise
            after_outage()


def measure(args, url, cluster=None):
    """Run the workers on ``url`` (killing ``cluster``'s primary mid-run when
    given), check the events and report; return the exit status."""
    # A failover run's record sits beside the plain run's, not over it.
    result = benchlib.Result("admission_run_ha" if cluster else "admission_run", args)
    benchlib.progress(f"preparing {url}")
    benchlib.prepare_database(url)
    endpoint_id, token = benchlib.ensure_endpoint(url, name="admission-run")
    reset(url, endpoint_id)
    benchlib.setup_django(url)
    from todos import store
    from todos.store import admission

    scope = store.Scope(endpoint_id)
    admission.set_admission(scope, GROUPED, group_concurrency=2, fair=args.fair)
    admission.set_admission(
        scope,
        RATED,
        group_concurrency=3,
        rate_limit=RATE,
        group_rate_limit=GROUP_RATE,
        fair=args.fair,
    )
    from django.db import connection

    connection.close()
    with contextlib.ExitStack() as servers:
        ports = [
            servers.enter_context(
                benchlib.serve(
                    url,
                    workers=args.server_workers,
                    port=args.port + number if args.port else None,
                )
            ).port
            for number in range(args.servers)
        ]
        return run_and_check(args, url, cluster, result, endpoint_id, (ports, token))


def run_and_check(args, url, cluster, result, endpoint_id, served):
    """Run the processes (through the ``served`` app servers' ports, with the
    endpoint's token), check the events and report; return the exit status."""
    from todos.store import admission_check

    # Each worker's share, rounded up: the run makes at least --operations calls.
    quota = -(-args.operations // args.processes)
    ports = served[0]
    direct = args.processes if not ports else min(args.direct, args.processes)
    benchlib.progress(
        f"running {args.processes} workers x {quota} operations ({direct} on the"
        f" store, {args.processes - direct} through {len(ports)} app servers),"
        f" a reaper and a settings changer, over {args.groups} groups"
    )
    started = time.perf_counter()
    failover = {}
    killers = []
    on_start = None
    if cluster is not None:

        def on_start():
            killers.append(kill_primary_later(cluster, args.kill_after, failover))

    outcomes = run_all(args, url, endpoint_id, quota, served, direct, on_start)
    # A run shorter than --kill-after still sees its failover through: the
    # check then reads the new primary.
    for killer in killers:
        killer.join(timeout=200)
    elapsed = time.perf_counter() - started
    workers = outcomes[: args.processes]
    operations = sum(item["done"] for item in workers)
    changes = outcomes[-1]
    reaper = outcomes[-2]
    benchlib.progress(f"ran {operations} operations in {elapsed:.0f} s; checking")
    report = check_after_outage(admission_check, endpoint_id)
    results = {
        "operations": operations,
        "seconds": round(elapsed, 1),
        "app_servers": len(ports),
        "workers_on_store": direct,
        "workers_served": args.processes - direct,
        "http_requests": sum(item.get("requests", 0) for item in workers),
        "claim_calls": sum(item["claims"] for item in workers),
        "todos_claimed": sum(item["claimed"] for item in workers),
        "races": sum(item["races"] for item in workers),
        "errors": sum(item["errors"] for item in workers),
        "outage_retries": sum(item["outage_retries"] for item in workers)
        + reaper["outages"]
        + changes["outages"],
        "error_samples": [s for item in workers for s in item["error_samples"]][:5],
        "reaped": reaper["reaped"],
        "retries_requeued": reaper["requeued"],
        "setting_changes": changes["changes"],
        "events_replayed": report.events,
        "claims_checked": report.claims,
        "ends_checked": report.ends,
        "groups_checked": report.groups,
        "rate_claims_checked": report.rate_claims,
        "max_in_flight": max(report.max_in_flight.values(), default=0),
        "violations": len(report.violations),
        "violation_samples": report.violations[:10],
    }
    if cluster is not None:
        results["primary_killed"] = failover.get("killed")
        results["new_primary_after_seconds"] = failover.get("promoted_seconds")
    benchlib.print_table(
        "Admission run",
        ["figure", "value"],
        [[name, value] for name, value in results.items() if "samples" not in name],
    )
    for line in results["violation_samples"] + results["error_samples"]:
        print("  ", line)
    result.write(
        {
            "operations": args.operations,
            "processes": args.processes,
            "groups": args.groups,
            "seed": args.seed,
            "servers": args.servers,
            "direct": direct,
            "server_workers": args.server_workers,
            "ha": args.ha,
            "kill_after": args.kill_after if args.ha else None,
            "rate_limit": RATE,
            "group_rate_limit": GROUP_RATE,
        },
        results,
        machine_url=url,
    )
    failed_over = cluster is None or failover.get("promoted_seconds") is not None
    return 1 if report.violations or results["errors"] or not failed_over else 0


def run_all(args, url, endpoint_id, quota, served, direct, on_start=None):
    """Workers and the two sweepers in one set of processes: each worker
    leaves a file when it is done, and the sweepers stop when all have. The
    first ``direct`` workers call the store; the others the ``served`` app
    servers, in turn."""
    with tempfile.TemporaryDirectory(prefix="admission-run-") as folder:
        return benchlib.run_processes(
            _dispatch,
            args.processes + 2,
            args.seconds,
            args=(
                args.processes,
                url,
                endpoint_id,
                quota,
                args.groups,
                args.seed,
                Path(folder),
                served,
                direct,
            ),
            on_start=on_start,
        )


def _dispatch(
    index, processes, url, endpoint_id, quota, groups, seed, finished, served, direct
):
    if index < direct:
        return worker(index, url, endpoint_id, quota, groups, seed, finished)
    if index < processes:
        ports, token = served
        port = ports[(index - direct) % len(ports)]
        return served_worker(index, port, token, quota, groups, seed, finished)
    return sweeper(
        index - processes, url, endpoint_id, groups, seed, finished, processes, served
    )


if __name__ == "__main__":
    sys.exit(main())
