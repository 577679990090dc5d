"""Resilience check: PostgreSQL restarts and dies under running agents; nothing is lost.

    python scripts/resilience.py [--seconds 20] [--outage 3] [--workers 4]
                                 [--pgbouncer | --failover [--kills 2]] [--json]

Everything runs on a throwaway PostgreSQL cluster of its own (a free port and a
temporary data folder, through scripts/devdb.sh), never on the team's cluster,
and the cluster is stopped and deleted on the way out, failure or not. On it:
gunicorn serves Switchboard, ``manage.py sweep --loop`` sweeps, producer
threads enqueue todos over HTTP (each with an idempotency key, retried until
acknowledged, as an at-least-once producer would) and worker threads claim and
complete them (a few "crash": they abandon their lease, which must lapse and be
redelivered). Then:

1. **Restart.** PostgreSQL is stopped mid-run for ``--outage`` seconds and
   started again. While it is down the API must answer 503 with a JSON body
   (never a 500 or an HTML page); after the start it must serve again within
   seconds; the sweep loop must still be running and must still reap (a probe
   todo, abandoned on an endpoint no worker serves, has to come back through the
   reaper alone). Afterwards every acknowledged todo is accounted for from
   ``todo_events``: done (or still live), none lost, none completed twice.
2. **Statement timeout.** A complete blocked on a row lock outlives
   ``statement_timeout``: the API answers 503 JSON, and the todo is still
   claimed by its worker, who completes it afterwards.
3. **Killed backend.** The same blocked complete has its backend killed with
   ``pg_terminate_backend``: 503 JSON, the todo still claimed, and the next
   request is served on a fresh connection.

With ``--failover`` the run is on a failover pair instead (scripts/ha.sh: a
primary and its synchronous standby managed by Patroni, with etcd), and the
app servers, their doorbells and the sweep loop reach it through a multi-host
``DATABASE_URL`` with ``target_session_attrs=read-write``. Mid-run the
primary's postmaster is killed with SIGKILL; Patroni promotes the standby; the
load goes on. It times the kill to the new primary (Patroni's view) and to the
first write the API acknowledges, checks that every answer meanwhile was a
503 JSON (or a success), that each server wakes a waiting claim again, and
waits for the killed node to rejoin as the synchronous standby (Patroni
rewinds it). Then it kills the new primary the same way. Afterwards every
acknowledged create must be in the database and every acknowledged complete
must be the todo's one completion, by the worker whose complete was
acknowledged.

With ``--pgbouncer`` the same run goes through Debian's PgBouncer in
transaction mode (a throwaway instance on a free port) in front of two app
servers, whose doorbell LISTEN connections go around it
(``SWITCHBOARD_LISTEN_DATABASE_URL``), without prepared statements (PgBouncer
< 1.21) and with ``statement_timeout`` set by PgBouncer's ``connect_query``.
Workers then long-poll (``wait_seconds``), and after the restart each server
must wake a waiting claim within two seconds of a create (its LISTEN
reconnected).

It prints the tally (todos created, completed, redelivered, lost) and each
check's outcome; the exit status is 1 when a check failed.
"""

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
LEASE_SECONDS = 2
STATEMENT_TIMEOUT_MS = 1500
# The todos of the run may be claimed many times (crashes, claims whose answer
# was lost in the outage); the cap must not dead-letter them.
MAX_ATTEMPTS = 50


@dataclass
class Options:
    seconds: float = 20.0
    outage: float = 3.0
    workers: int = 4
    producers: int = 2
    crash_rate: float = 0.05
    drain_timeout: float = 40.0
    seed: int = 8
    # PgBouncer (transaction pooling) in front of two app servers; the doorbell's
    # LISTEN goes around it, straight to PostgreSQL.
    pgbouncer: bool = False
    # A Patroni-managed failover pair whose primary is killed `kills` times.
    failover: bool = False
    kills: int = 2


@dataclass
class Report:
    created: int = 0
    completed: int = 0
    redelivered: int = 0
    lost: int = 0
    completed_twice: int = 0
    unfinished: int = 0
    duplicate_rows: int = 0
    crashes: int = 0
    statuses: dict = field(default_factory=dict)
    bad_responses: list = field(default_factory=list)
    outage_seconds: float = 0.0
    down_answers: dict = field(default_factory=dict)
    recovery_seconds: float | None = None
    sweep_alive_after_restart: bool = False
    sweep_reaped_after_restart_seconds: float | None = None
    sweep_exit_status: int | None = None
    statement_timeout: dict = field(default_factory=dict)
    killed_backend: dict = field(default_factory=dict)
    servers: int = 1
    through_pgbouncer: bool = False
    # Per app server: seconds from a create to a waiting claim's answer, after
    # the restart (its doorbell hub had to reconnect its LISTEN).
    wake_after_restart_seconds: list = field(default_factory=list)
    # Acknowledged completes whose todo was not completed by that worker in
    # the end (the completion was lost and the todo redelivered).
    completes_lost: int = 0
    # One entry per SIGKILL of the primary (--failover).
    failovers: list = field(default_factory=list)
    # A create whose commit the synchronous standby did not confirm (--failover).
    unreplicated_commit: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    @property
    def acknowledged_then_lost(self):
        return self.lost + self.completes_lost

    @property
    def seconds_without_primary(self):
        return [outcome.get("promoted_seconds") for outcome in self.failovers]

    def check(self, ok, failure):
        if not ok:
            self.failures.append(failure)


# --- Processes ------------------------------------------------------------------


def free_port():
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL cluster run through scripts/devdb.sh."""

    def __init__(self):
        self.port = free_port()
        # devdb.sh creates the folder (and, as root, hands it to postgres, which
        # must be able to reach it: so /tmp, not a private TMPDIR).
        self.datadir = Path("/tmp") / f"sb-resilience-{self.port}"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/switchboard"

    def _devdb(self, action):
        env = dict(
            os.environ,
            SB_PG_PORT=str(self.port),
            SB_PG_DATA=str(self.datadir),
            SB_PG_DB="switchboard",
        )
        subprocess.run(
            [str(ROOT / "scripts" / "devdb.sh"), action],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def start(self):
        self._devdb("start")

    def stop(self):
        self._devdb("stop")

    def destroy(self):
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.datadir, ignore_errors=True)


def pgbouncer_binary():
    """Return the pgbouncer executable, or None when it is not installed."""
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


class PgBouncer:
    """A throwaway PgBouncer in transaction mode in front of a Cluster."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.port = free_port()
        self.dir = Path("/tmp") / f"sb-pgbouncer-{self.port}"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/switchboard"
        self.proc = None

    def start(self):
        self.dir.mkdir(mode=0o755)
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        timeout = f"connect_query='SET statement_timeout = {STATEMENT_TIMEOUT_MS}'"
        (self.dir / "pgbouncer.ini").write_text(
            f"""[databases]
switchboard = host=127.0.0.1 port={self.cluster.port} dbname=switchboard {timeout}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 20
; Django's connection options; statement_timeout comes from connect_query.
ignore_startup_parameters = extra_float_digits, options
; Fail fast while PostgreSQL is down, so the API answers 503 promptly.
server_connect_timeout = 1
server_login_retry = 1
query_wait_timeout = 3
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
"""
        )
        command = [pgbouncer_binary(), str(self.dir / "pgbouncer.ini")]
        if os.getuid() == 0:
            # PgBouncer refuses to run as root.
            import pwd

            user = pwd.getpwnam("postgres")
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, user.pw_uid, user.pw_gid)
            command[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            time.sleep(0.1)
        raise RuntimeError("pgbouncer did not start")

    def destroy(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port_block(size):
    """Return the first of `size` consecutive free ports on 127.0.0.1."""
    chooser = random.Random()
    for _ in range(200):
        base = chooser.randrange(20_000, 60_000 - size)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + size):
                    probe = stack.enter_context(socket.socket())
                    probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {size} consecutive free ports")


class HaCluster:
    """A throwaway failover pair run through scripts/ha.sh (Patroni and etcd).

    Its ports are scripts/ha.sh's layout from a free base: etcd's two, then
    each node's PostgreSQL, then each node's Patroni REST API.
    """

    NODES = ("pg1", "pg2")

    def __init__(self):
        self.base = free_port_block(6)
        self.pg_ports = (self.base + 2, self.base + 3)
        self.rest_ports = (self.base + 4, self.base + 5)
        self.datadir = Path("/tmp") / f"sb-failover-{self.base}"
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.pg_ports)
        self.url = (
            f"postgres://postgres@{hosts}/switchboard?target_session_attrs=read-write"
        )

    def _ha(self, action):
        env = dict(
            os.environ,
            SB_HA_PORT=str(self.base),
            SB_HA_DATA=str(self.datadir),
            SB_PG_DB="switchboard",
        )
        done = subprocess.run(
            [str(ROOT / "scripts" / "ha.sh"), action],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/ha.sh {action} failed: {done.stderr[-500:]}")

    def start(self):
        self._ha("start")

    def destroy(self):
        with contextlib.suppress(RuntimeError):
            self._ha("stop")
        shutil.rmtree(self.datadir, ignore_errors=True)

    def _answers(self, node, path):
        """Say whether a node's Patroni REST API answers 200 on `path`."""
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection(
                "127.0.0.1", self.rest_ports[node], timeout=2
            )
            try:
                conn.request("GET", path)
                return conn.getresponse().status == 200
            finally:
                conn.close()
        return False

    def is_primary(self, node):
        # A node whose postmaster died may answer from its cached role for a
        # moment: ask the node in question, not "anyone".
        return self._answers(node, "/primary")

    def primary(self):
        """The node that is the running primary, or None."""
        for node in range(len(self.NODES)):
            if self.is_primary(node):
                return node
        return None

    def is_sync_standby(self, node):
        return self._answers(node, "/sync")

    def kill_primary(self):
        """SIGKILL the primary's postmaster (its Patroni lives on); return the node."""
        node = self.primary()
        if node is None:
            raise RuntimeError("the failover pair has no primary to kill")
        pidfile = self.datadir / self.NODES[node] / "postmaster.pid"
        os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        return node


def app_env(url, **extra):
    return {
        **dict(
            os.environ,
            DATABASE_URL=url,
            DJANGO_SETTINGS_MODULE="board.settings",
            SWITCHBOARD_STATEMENT_TIMEOUT_MS=str(STATEMENT_TIMEOUT_MS),
            SWITCHBOARD_DB_CONNECT_TIMEOUT="1",
            GUNICORN_WORKERS="2",
            GUNICORN_THREADS="16",
            GUNICORN_LOG_LEVEL="warning",
            LOG_LEVEL="WARNING",
        ),
        **extra,
    }


def manage(url, *args):
    """Run a management command against the cluster; return its stdout."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=app_env(url),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def spawn(url, logdir, name, *args, env=None):
    log = (logdir / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=app_env(url, **(env or {})),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    proc.log = log
    return proc


def stop_process(proc):
    """SIGTERM a child, wait for it, and return its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.log.close()
    return proc.returncode


# --- HTTP -----------------------------------------------------------------------


class Api:
    """A keep-alive JSON client of the agent API that tallies every answer."""

    def __init__(self, port, token, report, lock):
        self.port, self.report, self.lock = port, report, lock
        self.headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
        }
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method, path, body=None):
        """Return (status, JSON body); status 0 when the connection failed."""
        try:
            self.conn.request(
                method,
                path,
                body=None if body is None else json.dumps(body),
                headers=self.headers,
            )
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self._tally(0, path, None)
            return 0, None
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        self._tally(response.status, path, data)
        return response.status, data

    def create(self, todo, seconds=15):
        """Enqueue ``todo``; after a restart the server may still be
        reconnecting, so a 503 or a failed connection is sent again, as an
        agent would, for up to ``seconds``. Return the last (status, data)."""
        deadline = time.monotonic() + seconds
        while True:
            status, data = self.call("POST", "/api/v1/todos", todo)
            if status not in (0, 503) or time.monotonic() > deadline:
                return status, data
            time.sleep(0.2)

    def _tally(self, status, path, data):
        with self.lock:
            statuses = self.report.statuses
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            clean = status in (200, 201, 404, 409) or (
                status == 503
                and isinstance(data, dict)
                and data.get("error") == "unavailable"
            )
            if not clean and len(self.report.bad_responses) < 20:
                self.report.bad_responses.append(f"{status} {path} {data!r:.200}")


# --- Agents ---------------------------------------------------------------------


class Run:
    """The shared state of the producer and worker threads."""

    def __init__(self, ports, token, report, options):
        self.ports, self.token, self.report, self.options = (
            ports,
            token,
            report,
            options,
        )
        self.lock = threading.Lock()
        self.producing = threading.Event()
        self.producing.set()
        self.working = threading.Event()
        self.working.set()
        self.acknowledged = {}  # idempotency key -> todo id
        self.completions = {}  # todo id -> acknowledged completes
        self.completed_by = {}  # todo id -> the worker whose complete was acknowledged
        self.random = random.Random(options.seed)

    def api(self, number=0):
        # Agents are spread over the app servers.
        port = self.ports[number % len(self.ports)]
        return Api(port, self.token, self.report, self.lock)

    def produce(self, name):
        api, number = self.api(int(name[1:])), 0
        while self.producing.is_set():
            key = f"{name}-{number}"
            # At-least-once ingestion: resend the same key until acknowledged.
            while True:
                status, data = api.call(
                    "POST",
                    "/api/v1/todos",
                    {
                        "queue": "work",
                        "title": key,
                        "idempotency_key": key,
                        "max_attempts": MAX_ATTEMPTS,
                    },
                )
                if status in (200, 201):
                    with self.lock:
                        self.acknowledged[key] = data["todo"]["id"]
                    break
                time.sleep(0.1)
            number += 1
            time.sleep(0.02)

    def work(self, name):
        api = self.api(int(name[1:]))
        claim = {"worker": name, "lease_seconds": LEASE_SECONDS}
        if self.options.pgbouncer or self.options.failover:
            # Long polls: the doorbell hubs must wake them across the restart.
            claim["wait_seconds"] = 1
        while self.working.is_set():
            status, data = api.call("POST", "/api/v1/todos/claim", claim)
            if status != 200:
                time.sleep(0.05)
                continue
            todo_id, lease = data["todo"]["id"], data["todo"]["lease_token"]
            with self.lock:
                crash = self.random.random() < self.options.crash_rate
                if crash:
                    self.report.crashes += 1
            if crash:
                continue
            ack = {"worker": name, "lease_token": lease}
            status, _ = api.call(
                "POST",
                f"/api/v1/todos/{todo_id}/heartbeat",
                {**ack, "lease_seconds": LEASE_SECONDS},
            )
            if status != 409:
                # A heartbeat lost in an outage is harmless; a 409 says the
                # lease went to someone else.
                self.complete(api, name, todo_id, ack)

    def complete(self, api, name, todo_id, ack):
        """Complete until acknowledged, or until the lease is known to be lost."""
        while True:
            # With the lease token a complete that committed but whose answer
            # was lost answers 200 again when repeated.
            status, _ = api.call("POST", f"/api/v1/todos/{todo_id}/complete", ack)
            if status == 200:
                break
            if status == 409:
                # Either our complete committed but its answer was lost in the
                # outage, or our lease lapsed and the todo went to someone else.
                status, data = api.call("GET", f"/api/v1/todos/{todo_id}")
                if status != 200:
                    time.sleep(0.1)
                    continue
                todo = data["todo"]
                if todo["state"] != "done" or todo["owner"] != name:
                    return
                break
            time.sleep(0.1)
        with self.lock:
            self.completions[todo_id] = self.completions.get(todo_id, 0) + 1
            self.completed_by[todo_id] = name


# --- The checks -----------------------------------------------------------------


def outage(cluster, port, token, report, options):
    """Stop PostgreSQL, probe the API while it is down, start it, time recovery."""
    lock = threading.Lock()
    probe = Api(port, token, Report(), lock)
    cluster.stop()
    down_at = time.monotonic()
    answers = {}
    while time.monotonic() - down_at < options.outage:
        for method, path, body in (
            ("GET", "/healthz", None),
            ("POST", "/api/v1/todos/claim", {"worker": "probe"}),
            ("POST", "/api/v1/todos", {"queue": "work", "title": "while down"}),
        ):
            status, data = probe.call(method, path, body)
            error = (
                data.get("error", data.get("status"))
                if isinstance(data, dict)
                else None
            )
            answers[f"{method} {path} -> {status} {error}"] = (
                answers.get(f"{method} {path} -> {status} {error}", 0) + 1
            )
        time.sleep(0.2)
    report.down_answers = answers
    report.check(
        answers and all(" -> 503 " in key for key in answers),
        f"while PostgreSQL was down the API answered {sorted(answers)}",
    )
    cluster.start()
    report.outage_seconds = round(time.monotonic() - down_at, 2)
    started = time.monotonic()
    while time.monotonic() - started < 30:
        # A claim on a queue nobody fills: 404 means served, and takes nothing.
        status, _ = probe.call(
            "POST",
            "/api/v1/todos/claim",
            {"worker": "probe", "queue": "recovery-probe"},
        )
        if status == 404:
            report.recovery_seconds = round(time.monotonic() - started, 2)
            break
        time.sleep(0.05)
    report.check(
        report.recovery_seconds is not None and report.recovery_seconds < 10,
        f"the API did not serve again within 10 s ({report.recovery_seconds})",
    )
    return probe


REAPED_SQL = "SELECT 1 FROM todo_events WHERE todo_id = %s AND actor = 'system:reaper'"


def sweep_probe(cluster, port, probe_token, report, sweep):
    """Abandon a todo on an endpoint no worker serves; only the reaper returns it."""
    report.sweep_alive_after_restart = sweep.poll() is None
    report.check(report.sweep_alive_after_restart, "the sweep loop died in the outage")
    api = Api(port, probe_token, Report(), threading.Lock())
    status, data = api.create({"queue": "probe", "title": "sweep"})
    report.check(status == 201, f"the sweep probe's create answered {status}")
    if status != 201:
        return
    todo_id = data["todo"]["id"]
    api.call("POST", "/api/v1/todos/claim", {"worker": "gone", "lease_seconds": 1})
    started = time.monotonic()
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        while time.monotonic() - started < 15:
            reaped = conn.execute(REAPED_SQL, [todo_id]).fetchone()
            if reaped:
                report.sweep_reaped_after_restart_seconds = round(
                    time.monotonic() - started, 2
                )
                break
            time.sleep(0.1)
    report.check(
        report.sweep_reaped_after_restart_seconds is not None,
        "the sweep loop did not reap an expired lease after the restart",
    )


def blocked_complete(cluster, port, token, report, kill):
    """Block a complete on a row lock; let the timeout fire or kill its backend."""
    api = Api(port, token, Report(), threading.Lock())
    status, data = api.create({"queue": "victims", "title": "victim"})
    report.check(status == 201, f"the victim's create answered {status}")
    if status != 201:
        return
    todo_id = data["todo"]["id"]
    status, data = api.call(
        "POST",
        "/api/v1/todos/claim",
        {"worker": "victim", "queue": "victims", "lease_seconds": 120},
    )
    outcome = {"claimed": status == 200 and data["todo"]["id"] == todo_id}
    answer = {}
    with (
        psycopg.connect(cluster.url) as locker,
        psycopg.connect(cluster.url, autocommit=True) as admin,
    ):
        locker.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE", [todo_id])

        def complete():
            started = time.monotonic()
            answer["status"], answer["body"] = api.call(
                "POST", f"/api/v1/todos/{todo_id}/complete", {"worker": "victim"}
            )
            answer["seconds"] = round(time.monotonic() - started, 2)

        thread = threading.Thread(target=complete)
        thread.start()
        if kill:
            pid = None
            for _ in range(200):
                row = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%%UPDATE todos%%'"
                ).fetchone()
                if row:
                    pid = row[0]
                    break
                time.sleep(0.01)
            outcome["terminated"] = bool(
                pid
                and admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[
                    0
                ]
            )
        thread.join(timeout=30)
        locker.rollback()
        state = admin.execute(
            "SELECT state, owner FROM todos WHERE id = %s", [todo_id]
        ).fetchone()
    outcome.update(
        status=answer.get("status"),
        error=(answer.get("body") or {}).get("error"),
        seconds=answer.get("seconds"),
        state_after=list(state),
    )
    status, data = api.call(
        "POST", f"/api/v1/todos/{todo_id}/complete", {"worker": "victim"}
    )
    outcome["complete_afterwards"] = status
    name = "killed backend" if kill else "statement timeout"
    report.check(outcome["claimed"], f"{name}: the victim todo was not claimed")
    report.check(
        outcome["status"] == 503 and outcome["error"] == "unavailable",
        f"{name}: answered {outcome['status']} {answer.get('body')}",
    )
    report.check(
        state == ("claimed", "victim"),
        f"{name}: the todo was left {state}, not claimed by its worker",
    )
    report.check(status == 200, f"{name}: the complete afterwards answered {status}")
    if kill:
        report.check(outcome["terminated"], "killed backend: no blocked backend found")
    return outcome


def wake_after_restart(ports, token, report):
    """On each server, a waiting claim must answer within 2 s of a create."""
    for number, port in enumerate(ports):
        queue = f"wake-probe-{number}"
        answer = {}
        waiter = Api(port, token, Report(), threading.Lock())

        def claim(waiter=waiter, queue=queue, answer=answer):
            # A pooled connection from before the restart answers one 503 (an
            # outage's answer) as it is found broken; an agent asks again.
            for _ in range(20):
                answer["status"], _ = waiter.call(
                    "POST",
                    "/api/v1/todos/claim",
                    {"worker": "wake-probe", "queue": queue, "wait_seconds": 10},
                )
                if answer["status"] != 503:
                    break
                time.sleep(0.1)
            answer["at"] = time.monotonic()

        thread = threading.Thread(target=claim)
        thread.start()
        time.sleep(1.0)
        creator = Api(ports[-1 - number], token, Report(), threading.Lock())
        for _ in range(50):
            # The create is the stimulus, not the thing measured: resend a 503.
            created_at = time.monotonic()
            status, _ = creator.call(
                "POST", "/api/v1/todos", {"queue": queue, "title": "wake"}
            )
            if status == 201:
                break
            time.sleep(0.1)
        thread.join(timeout=15)
        seconds = (
            round(answer["at"] - created_at, 3) if answer.get("status") == 200 else None
        )
        report.wake_after_restart_seconds.append(seconds)
        report.check(
            seconds is not None and seconds < 2,
            f"server {number}: a waiting claim was not woken after the restart"
            f" ({answer})",
        )


def fail_over(cluster, port, writer_token, report):
    """SIGKILL the primary; time its successor and the first acknowledged write.

    Meanwhile the API must answer 503 JSON: a create that failed is retried by
    its producer, never lost unanswered.
    """
    probe = Api(port, writer_token, Report(), threading.Lock())
    killed = cluster.kill_primary()
    killed_at = time.monotonic()
    outcome = {"killed": cluster.NODES[killed]}

    def watch_promotion():
        while time.monotonic() - killed_at < 60:
            if cluster.is_primary(1 - killed):
                outcome["promoted_seconds"] = round(time.monotonic() - killed_at, 2)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_promotion)
    watcher.start()
    answers, number = {}, 0
    while time.monotonic() - killed_at < 60:
        number += 1
        status, data = probe.call(
            "POST",
            "/api/v1/todos",
            {"queue": "failover-probe", "title": f"write {number}"},
        )
        error = data.get("error") if isinstance(data, dict) else None
        answer = f"POST /api/v1/todos -> {status} {error}"
        answers[answer] = answers.get(answer, 0) + 1
        if status == 201 and "promoted_seconds" not in outcome:
            # The killed postmaster's backends live on for a moment and may
            # still commit (waiting for the standby, as ever): not yet the new
            # primary's write.
            outcome["writes_before_promotion"] = (
                outcome.get("writes_before_promotion", 0) + 1
            )
        elif status == 201:
            outcome["first_write_seconds"] = round(time.monotonic() - killed_at, 2)
            break
        time.sleep(0.05)
    watcher.join()
    outcome["answers"] = answers
    report.failovers.append(outcome)
    report.check(
        "first_write_seconds" in outcome,
        f"no write was acknowledged within 60 s of killing {outcome['killed']}",
    )
    report.check(
        all(" -> 503 unavailable" in key or " -> 201 " in key for key in answers),
        f"while there was no primary the API answered {sorted(answers)}",
    )
    return killed, killed_at, outcome


def serving_again(ports, token, killed_at, outcome):
    """Time each app server's first served request after the kill."""
    outcome["serving_seconds"] = []
    for port in ports:
        probe = Api(port, token, Report(), threading.Lock())
        seconds = None
        while time.monotonic() - killed_at < 60:
            # A claim on a queue nobody fills: 404 means served, and takes nothing.
            status, _ = probe.call(
                "POST",
                "/api/v1/todos/claim",
                {"worker": "probe", "queue": "recovery-probe"},
            )
            if status == 404:
                seconds = round(time.monotonic() - killed_at, 2)
                break
            time.sleep(0.05)
        outcome["serving_seconds"].append(seconds)
    return all(seconds is not None for seconds in outcome["serving_seconds"])


def rejoin(cluster, killed, killed_at, outcome):
    """Wait until the killed node is the synchronous standby again."""
    while time.monotonic() - killed_at < 90:
        if cluster.is_sync_standby(killed):
            outcome["rejoined_seconds"] = round(time.monotonic() - killed_at, 2)
            return True
        time.sleep(0.2)
    return False


def unreplicated_commit(cluster, port, token, report):
    """Stall the standby; cancel a commit waiting for it: 503, not 201.

    With the standby's WAL receiver stopped, a create's commit waits for a
    confirmation that does not come (the statement timeout does not end that
    wait). An operator who cancels the waiting backend (``pg_cancel_backend``)
    leaves the commit on the primary only, and PostgreSQL answers success with
    a warning, which the app must not pass off as an acknowledged write.
    Resent with its idempotency key once the standby is back, the create
    answers 200 with the todo it had made.
    """
    standby = next(
        node for node in range(len(cluster.NODES)) if cluster.is_sync_standby(node)
    )

    def connect(node):
        return psycopg.connect(
            f"host=127.0.0.1 port={cluster.pg_ports[node]} user=postgres"
            " dbname=postgres",
            autocommit=True,
        )

    with connect(standby) as conn:
        receiver = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()[0]
    api = Api(port, token, Report(), threading.Lock())
    body = {"queue": "unreplicated", "title": "x", "idempotency_key": "unreplicated"}
    answer, cancelled = {}, False

    def create():
        answer["status"], answer["body"] = api.call("POST", "/api/v1/todos", body)

    os.kill(receiver, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=create)
        thread.start()
        with connect(1 - standby) as admin:
            deadline = time.monotonic() + 10
            while thread.is_alive() and time.monotonic() < deadline:
                # The create's backend, not another commit waiting beside it
                # (the sweep loop's).
                for (pid,) in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                    " AND query LIKE '%%INSERT INTO todos %%'"
                ).fetchall():
                    cancelled |= admin.execute(
                        "SELECT pg_cancel_backend(%s)", [pid]
                    ).fetchone()[0]
                thread.join(timeout=0.05)
        thread.join(timeout=30)
    finally:
        os.kill(receiver, signal.SIGCONT)
    again, _ = api.call("POST", "/api/v1/todos", body)
    outcome = {
        "cancelled": cancelled,
        "status": answer.get("status"),
        "error": (answer.get("body") or {}).get("error"),
        "resent": again,
    }
    report.unreplicated_commit = outcome
    report.check(cancelled, "no commit was seen waiting for the stalled standby")
    report.check(
        outcome["status"] == 503 and outcome["error"] == "unavailable",
        f"a commit the standby never confirmed answered {outcome['status']}"
        f" {answer.get('body')}",
    )
    report.check(again == 200, f"the resent create answered {again}")


ACCOUNTING_SQL = """
SELECT t.id::text, t.idempotency_key, t.state,
       count(*) FILTER (WHERE e.to_state = 'done') AS done_events,
       -- Each claim starts an attempt; a heartbeat's event keeps its attempt.
       count(DISTINCT e.attempt) FILTER (WHERE e.to_state = 'claimed') AS claims,
       max(e.actor) FILTER (WHERE e.to_state = 'done') AS completed_by
  FROM todos t JOIN endpoints p ON p.id = t.endpoint_id AND p.name = 'agents'
  LEFT JOIN todo_events e ON e.todo_id = t.id
 GROUP BY t.id
"""


def account(cluster, run, report):
    """Tally every todo of the agents' endpoint from the database and its history."""
    with psycopg.connect(cluster.url) as conn:
        rows = conn.execute(ACCOUNTING_SQL).fetchall()
    by_id = {row[0]: row for row in rows}
    keys = {}
    for row in rows:
        keys.setdefault(row[1], []).append(row[0])
    report.created = len(run.acknowledged)
    report.duplicate_rows = sum(len(ids) - 1 for ids in keys.values() if len(ids) > 1)
    report.completed = sum(1 for row in rows if row[2] == "done")
    report.redelivered = sum(1 for row in rows if row[4] > 1)
    report.completed_twice = sum(1 for row in rows if row[3] > 1)
    report.lost = sum(
        1 for todo_id in run.acknowledged.values() if todo_id not in by_id
    )
    report.unfinished = sum(1 for row in rows if row[2] != "done")
    report.completes_lost = sum(
        1
        for todo_id, worker in run.completed_by.items()
        if todo_id not in by_id or by_id[todo_id][5] != worker
    )
    report.check(
        report.completes_lost == 0,
        f"{report.completes_lost} acknowledged completes are missing",
    )
    twice_acked = sum(1 for count in run.completions.values() if count > 1)
    report.check(report.lost == 0, f"{report.lost} acknowledged todos are missing")
    report.check(
        report.completed_twice == 0,
        f"{report.completed_twice} todos were completed twice",
    )
    report.check(
        twice_acked == 0, f"{twice_acked} todos had two acknowledged completes"
    )
    report.check(
        report.unfinished == 0,
        f"{report.unfinished} todos were not done after the drain",
    )
    report.check(report.created > 0, "no todo was created")


def wait_drained(cluster, timeout):
    """Wait until no todo of the agents' endpoint is left undone."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            left = conn.execute(
                "SELECT count(*) FROM todos t JOIN endpoints p ON p.id = t.endpoint_id"
                " WHERE p.name = 'agents' AND t.state <> 'done'"
            ).fetchone()[0]
            if left == 0:
                return
            time.sleep(0.2)


def new_endpoint(url, name):
    """Mint an endpoint that may use every queue; return its JSON."""
    return json.loads(
        manage(
            url,
            "create_endpoint",
            name,
            "--owner",
            "resilience",
            "--queues",
            "*",
            "--json",
        )
    )


def start_serving(url, logdir, ports, envs, children, sweep_env=None):
    """Start a gunicorn per port (with its env) and the sweep loop, each added
    to ``children`` as it starts; wait until every server is healthy. Return
    the sweep."""
    servers = [
        spawn(
            url,
            logdir,
            f"gunicorn-{number}",
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{server_port}",
            env=env,
        )
        for number, (server_port, env) in enumerate(zip(ports, envs, strict=True))
    ]
    children.extend(servers)
    sweep = spawn(
        url,
        logdir,
        "sweep",
        "manage.py",
        "sweep",
        "--loop",
        "--interval",
        "0.5",
        env=sweep_env,
    )
    children.append(sweep)
    for server_port, server_proc in zip(ports, servers, strict=True):
        wait_healthy(server_port, server_proc)
    return sweep


def start_agents(state, options):
    """Start the producers and the workers; return their threads."""
    threads = [
        threading.Thread(target=state.produce, args=(f"p{n}",))
        for n in range(options.producers)
    ]
    threads += [
        threading.Thread(target=state.work, args=(f"w{n}",))
        for n in range(options.workers)
    ]
    for thread in threads:
        thread.start()
    return threads


def stop_agents(state, threads, cluster, options):
    """Stop producing, let the workers drain the queue, then stop them."""
    state.producing.clear()
    for thread in threads[: options.producers]:
        thread.join(timeout=60)
    wait_drained(cluster, options.drain_timeout)
    state.working.clear()
    for thread in threads:
        thread.join(timeout=60)


def check_clean_end(report, sweep):
    """Every answer was clean, and the sweep loop stops cleanly on SIGTERM."""
    report.check(
        not report.bad_responses, f"unclean answers: {report.bad_responses[:3]}"
    )
    report.sweep_exit_status = stop_process(sweep)
    report.check(
        report.sweep_exit_status == 0,
        f"sweep --loop exited {report.sweep_exit_status} on SIGTERM",
    )


def run_failover(options):
    """Kill the primary of a failover pair under load, twice; return the Report."""
    report = Report()
    cluster = HaCluster()
    logdir = Path(tempfile.mkdtemp(prefix="sb-failover-logs-"))
    children = []
    try:
        cluster.start()
        manage(cluster.url, "migrate", "--no-input", "-v", "0")
        # The failover's timing writes go to an endpoint of their own:
        # the sweep probe's claim must find nothing but its own todo.
        agents, probe, writer = (
            new_endpoint(cluster.url, name)
            for name in ("agents", "sweep-probe", "write-probe")
        )
        ports = [free_port(), free_port()]
        report.servers = len(ports)
        # The second server's doorbell has a LISTEN URL of its own: both ways
        # of reaching the primary must follow it.
        server_envs = [
            {"GUNICORN_WORKERS": "1"},
            {"GUNICORN_WORKERS": "1", "SWITCHBOARD_LISTEN_DATABASE_URL": cluster.url},
        ]
        sweep = start_serving(cluster.url, logdir, ports, server_envs, children)

        state = Run(ports, agents["token"], report, options)
        threads = start_agents(state, options)
        load = options.seconds / (options.kills + 1)
        for kill in range(options.kills):
            time.sleep(load)
            killed, killed_at, outcome = fail_over(
                cluster, ports[kill % len(ports)], writer["token"], report
            )
            report.check(
                serving_again(ports, writer["token"], killed_at, outcome),
                f"an app server did not serve within 60 s of killing "
                f"{outcome['killed']}: {outcome['serving_seconds']}",
            )
            wake_after_restart(ports, probe["token"], report)
            if kill == 0:
                sweep_probe(cluster, ports[0], probe["token"], report, sweep)
            report.check(
                rejoin(cluster, killed, killed_at, outcome),
                f"{outcome['killed']} did not rejoin as the synchronous standby",
            )
        time.sleep(load)
        stop_agents(state, threads, cluster, options)
        account(cluster, state, report)
        unreplicated_commit(cluster, ports[0], writer["token"], report)
        check_clean_end(report, sweep)
    except Exception as exc:
        report.failures.append(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for child in children:
            stop_process(child)
        if report.failures:
            # Patroni's, PostgreSQL's and etcd's logs, before the pair goes.
            for log in cluster.datadir.glob("*.log"):
                shutil.copy(log, logdir / f"ha-{log.name}")
        cluster.destroy()
        if not report.failures:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            report.failures.append(f"logs kept in {logdir}")
    return report


def run(options):
    """Run every check on a throwaway cluster and return the Report."""
    if options.failover:
        return run_failover(options)
    report = Report()
    cluster = Cluster()
    bouncer = PgBouncer(cluster) if options.pgbouncer else None
    logdir = Path(tempfile.mkdtemp(prefix="sb-resilience-logs-"))
    children = []
    try:
        cluster.start()
        manage(cluster.url, "migrate", "--no-input", "-v", "0")
        agents = new_endpoint(cluster.url, "agents")
        probe = new_endpoint(cluster.url, "sweep-probe")
        app_url, server_env = cluster.url, {}
        if bouncer is not None:
            bouncer.start()
            app_url = bouncer.url
            server_env = {
                "SWITCHBOARD_LISTEN_DATABASE_URL": cluster.url,
                "SWITCHBOARD_DB_PREPARE": "0",
                "GUNICORN_WORKERS": "1",
            }
            report.through_pgbouncer = True
        ports = [free_port() for _ in range(2 if bouncer is not None else 1)]
        report.servers = len(ports)
        sweep = start_serving(
            app_url, logdir, ports, [server_env] * len(ports), children, server_env
        )
        port = ports[0]

        state = Run(ports, agents["token"], report, options)
        threads = start_agents(state, options)
        time.sleep(options.seconds / 3)
        outage(cluster, port, agents["token"], report, options)
        sweep_probe(cluster, port, probe["token"], report, sweep)
        wake_after_restart(ports, probe["token"], report)
        remaining = options.seconds * 2 / 3 - report.outage_seconds
        time.sleep(max(remaining, 1))
        stop_agents(state, threads, cluster, options)
        account(cluster, state, report)

        report.statement_timeout = blocked_complete(
            cluster, port, agents["token"], report, kill=False
        )
        report.killed_backend = blocked_complete(
            cluster, port, agents["token"], report, kill=True
        )
        check_clean_end(report, sweep)
    except Exception as exc:
        report.failures.append(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for child in children:
            stop_process(child)
        if bouncer is not None:
            bouncer.destroy()
        cluster.destroy()
        if not report.failures:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            report.failures.append(f"logs kept in {logdir}")
    return report


def wait_healthy(port, server, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {server.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("gunicorn did not become healthy")


def print_failover_report(report):
    print(f"todos created:        {report.created}")
    print(f"todos completed:      {report.completed}")
    print(
        f"acknowledged, lost:   {report.acknowledged_then_lost}"
        f"  (creates {report.lost}, completes {report.completes_lost})"
    )
    print(f"completed twice:      {report.completed_twice}")
    print(
        f"duplicate rows:       {report.duplicate_rows}  (a create committed, its"
        " answer lost, resent after its todo was done)"
    )
    print(f"unfinished:           {report.unfinished}")
    print(
        f"redelivered:          {report.redelivered}  (crashed workers: "
        f"{report.crashes})"
    )
    for number, outcome in enumerate(report.failovers, 1):
        print(
            f"kill {number} ({outcome['killed']}):   without a primary "
            f"{outcome.get('promoted_seconds')} s, first acknowledged write "
            f"{outcome.get('first_write_seconds')} s, each app server serving "
            f"{outcome.get('serving_seconds')} s, rejoined as synchronous "
            f"standby {outcome.get('rejoined_seconds')} s after the kill"
        )
        if outcome.get("writes_before_promotion"):
            print(
                f"                      {outcome['writes_before_promotion']} write(s)"
                " acknowledged before the promotion (by the dying primary's"
                " backends, each waiting for the standby)"
            )
        for answer, count in sorted(outcome["answers"].items()):
            print(f"                        {count:4d} x {answer}")
    print(f"wake after failover:  {report.wake_after_restart_seconds} s per server")
    print(f"standby stalled:      {report.unreplicated_commit}")
    print(
        f"sweep loop:           reaped a 1 s lease "
        f"{report.sweep_reaped_after_restart_seconds} s after the claim; exit "
        f"status on SIGTERM: {report.sweep_exit_status}"
    )
    print(f"HTTP statuses:        {report.statuses}")
    print(
        "result:               "
        + ("OK" if not report.failures else "FAILED: " + "; ".join(report.failures))
    )


def print_report(report):
    print(f"todos created:     {report.created}")
    print(f"todos completed:   {report.completed}")
    print(
        f"redelivered:       {report.redelivered}  (crashed workers: {report.crashes})"
    )
    print(f"lost:              {report.lost}")
    print(f"completed twice:   {report.completed_twice}")
    print(f"duplicate rows:    {report.duplicate_rows}")
    print(f"outage:            {report.outage_seconds} s; answers while down:")
    for answer, count in sorted(report.down_answers.items()):
        print(f"                     {count:4d} x {answer}")
    print(f"serving again:     {report.recovery_seconds} s after the start")
    print(
        f"sweep loop:        alive after restart: {report.sweep_alive_after_restart};"
        f" reaped a 1 s lease {report.sweep_reaped_after_restart_seconds} s after"
        f" the claim; exit status on SIGTERM: {report.sweep_exit_status}"
    )
    for name, outcome in (
        ("statement timeout", report.statement_timeout),
        ("killed backend", report.killed_backend),
    ):
        print(f"{name + ':':19}{outcome}")
    print(
        f"serving:           {report.servers} app server(s)"
        + (" behind PgBouncer (transaction mode)" if report.through_pgbouncer else "")
    )
    print(f"wake after restart: {report.wake_after_restart_seconds} s per server")
    print(f"HTTP statuses:     {report.statuses}")
    print(
        "result:            "
        + ("OK" if not report.failures else "FAILED: " + "; ".join(report.failures))
    )


def main():
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Options()
    parse.add_argument("--seconds", type=float, default=defaults.seconds)
    parse.add_argument("--outage", type=float, default=defaults.outage)
    parse.add_argument("--workers", type=int, default=defaults.workers)
    parse.add_argument("--producers", type=int, default=defaults.producers)
    parse.add_argument("--crash-rate", type=float, default=defaults.crash_rate)
    parse.add_argument(
        "--pgbouncer",
        action="store_true",
        help="through PgBouncer (transaction mode) in front of two app servers",
    )
    parse.add_argument(
        "--failover",
        action="store_true",
        help="on a Patroni failover pair whose primary is killed (scripts/ha.sh)",
    )
    parse.add_argument("--kills", type=int, default=defaults.kills)
    parse.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parse.parse_args()
    if not os.environ.get("SECRET_KEY"):
        # The servers and commands it starts refuse to run without one.
        parse.error(
            "SECRET_KEY is not set: run `make resilience`, which sets one, or "
            "export SECRET_KEY=<any long random string> first"
        )
    if args.pgbouncer and args.failover:
        parse.error("--pgbouncer and --failover are separate runs")
    options = Options(
        seconds=args.seconds,
        outage=args.outage,
        workers=args.workers,
        producers=args.producers,
        crash_rate=args.crash_rate,
        pgbouncer=args.pgbouncer,
        failover=args.failover,
        kills=args.kills,
    )
    report = run(options)
    if args.json:
        print(
            json.dumps(
                {
                    **asdict(report),
                    "acknowledged_then_lost": report.acknowledged_then_lost,
                    "seconds_without_primary": report.seconds_without_primary,
                },
                indent=2,
            )
        )
    elif options.failover:
        print_failover_report(report)
    else:
        print_report(report)
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
