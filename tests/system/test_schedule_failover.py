"""Schedules across a failover: exactly one todo per slot.

Three ``manage.py sweep --loop`` processes and two app servers run on a
throwaway Patroni pair (scripts/resilience.py's cluster, as in
test_failover.py: free ports, a temporary data folder) for two simulated days:
PostgreSQL's clock (``DatabaseClock``'s schema, installed in the pair's
database) jumps in random steps and the test waits until nothing is due. Half
way, the primary's postmaster is killed with SIGKILL and Patroni promotes the
standby; the sweeps and the servers follow it. Then the creating events are
replayed: every slot has exactly one todo, none missing, none twice.
"""

import contextlib
import http.client
import json
import os
import random
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import psycopg
import pytest

from tests.support import (
    DatabaseClock,
    expected_slots,
    free_port,
    load_resilience_script,
    slot_violations_in,
)
from todos.store.schedules import Recurrence

pytestmark = [pytest.mark.slow, pytest.mark.long]

SWEEPS = 2 + 1
SIMULATED = timedelta(days=2)
# How far the clock jumps at each step, in seconds: within a slot, across one,
# across many (up to ninety minutes of five-minute slots).
STEPS = (30, 60, 299, 300, 301, 900, 1800, 3600, 5400)
START = datetime(2026, 3, 27, tzinfo=UTC)
# (cron, every_seconds): five-minute to daily, some in Berlin across its
# spring change on 2026-03-29.
RECURRENCES = [
    ("*/5 * * * *", None),
    ("*/15 * * * *", None),
    ("0 * * * *", None),
    ("30 2 * * *", None),
    ("0 */6 * * *", None),
    (None, 300),
    (None, 600),
    (None, 3600),
    (None, 7200),
]
OUTAGE_SECONDS = 120


@pytest.fixture(scope="module")
def resilience():
    missing = [tool for tool in ("patroni", "etcd") if shutil.which(tool) is None]
    if missing:
        reason = (
            f"{' and '.join(missing)} not installed (Debian's patroni and "
            "etcd-server: scripts/system-deps.sh installs them as root)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the failover test: {reason}")
        pytest.skip(reason)
    return load_resilience_script("resilience_schedules")


@pytest.fixture(scope="module")
def cluster(resilience):
    """The failover test's throwaway pair, migrated; destroyed afterwards."""
    pair = resilience.HaCluster()
    try:
        pair.start()
        resilience.manage(pair.url, "migrate", "--no-input", "-v", "0")
        yield pair
    finally:
        pair.destroy()


def on_primary(cluster, statement, params=(), fetch=False):
    """Run one statement on whichever node is primary, trying again through
    the outage (the multi-host URL finds the new primary)."""
    deadline = time.monotonic() + OUTAGE_SECONDS
    while True:
        try:
            with psycopg.connect(
                cluster.url, autocommit=True, connect_timeout=2
            ) as conn:
                rows = conn.execute(statement, params)
                return rows.fetchall() if fetch else None
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "no primary came back"
            time.sleep(0.1)


def install_clock(cluster):
    schema = DatabaseClock.SCHEMA
    on_primary(cluster, f"CREATE SCHEMA {schema}")
    on_primary(cluster, f"CREATE TABLE {schema}.clock (at timestamptz)")
    on_primary(cluster, f"INSERT INTO {schema}.clock VALUES (%s)", [START])
    on_primary(
        cluster,
        f"CREATE FUNCTION {schema}.now() RETURNS timestamptz"
        f" LANGUAGE sql STABLE AS 'SELECT at FROM {schema}.clock'",
    )
    options = quote(f"-c search_path={schema},pg_catalog,public")
    return f"{cluster.url}&options={options}"


def advance(cluster, seconds):
    on_primary(
        cluster,
        f"UPDATE {DatabaseClock.SCHEMA}.clock SET at = at + make_interval(secs => %s)",
        [seconds],
    )


def wait_until_nothing_due(cluster, timeout=OUTAGE_SECONDS):
    """Wait until the sweeps have fired every slot due on the clock."""
    deadline = time.monotonic() + timeout
    query = (
        "SELECT count(*) FROM schedules"
        f" WHERE next_slot_at <= (SELECT at FROM {DatabaseClock.SCHEMA}.clock)"
    )
    while on_primary(cluster, query, fetch=True)[0][0]:
        assert time.monotonic() < deadline, "the sweeps left slots due"
        time.sleep(0.05)


def call(port, token, method, path, body=None):
    """One JSON call to an app server; (status, body), status 0 when down."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            method,
            path,
            body=None if body is None else json.dumps(body),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {token}",
            },
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    except (OSError, http.client.HTTPException):
        return 0, None
    finally:
        conn.close()


def serves_again(port, token):
    """Seconds until the server lists the schedules again after the kill."""
    started = time.monotonic()
    while time.monotonic() - started < OUTAGE_SECONDS:
        status, _ = call(port, token, "GET", "/api/v1/schedules")
        if status == 200:
            return time.monotonic() - started
        assert status in (0, 503), status
        time.sleep(0.1)
    return None


def test_sweeps_and_servers_fire_every_slot_exactly_once_across_a_failover(
    cluster, resilience, capsys
):
    """Three sweeps and two app servers for two simulated days, the primary
    killed half way: every slot of every schedule has exactly one todo, none
    missing, none twice (the clock's random steps' seed is in the failure)."""
    url = install_clock(cluster)
    token = resilience.new_endpoint(url, "schedules")["token"]
    logdir = Path(tempfile.mkdtemp(prefix="sb-schedule-failover-"))
    ports = [free_port(), free_port()]
    children = []
    try:
        for number, port in enumerate(ports):
            server = resilience.spawn(
                url,
                logdir,
                f"gunicorn-{number}",
                "-m",
                "gunicorn",
                "-c",
                "gunicorn.conf.py",
                "--bind",
                f"127.0.0.1:{port}",
                env={"GUNICORN_WORKERS": "1"},
            )
            children.append(server)
            resilience.wait_healthy(port, server)
        schedules = []
        for index, (cron, every) in enumerate(RECURRENCES):
            zone = "Europe/Berlin" if index % 3 == 0 else "UTC"
            body = {"name": f"s{index}", "queue": "q", "missed": "all"}
            body.update(
                {"cron": cron, "time_zone": zone} if cron else {"every_seconds": every}
            )
            status, answer = call(
                ports[index % 2], token, "POST", "/api/v1/schedules", body
            )
            assert status == 201, answer
            made = answer["schedule"]
            schedules.append(
                SimpleNamespace(
                    name=made["name"],
                    recurrence=Recurrence(
                        made.get("cron"), made.get("every_seconds"), made["time_zone"]
                    ),
                )
            )
        for number in range(SWEEPS):
            children.append(
                resilience.spawn(
                    url,
                    logdir,
                    f"sweep-{number}",
                    "manage.py",
                    "sweep",
                    "--loop",
                    "--interval",
                    "0.05",
                )
            )
        seed = random.randrange(2**32)
        steps = random.Random(seed)
        elapsed, killed = 0, None
        while elapsed < SIMULATED.total_seconds():
            if killed is None and elapsed >= SIMULATED.total_seconds() / 2:
                killed = cluster.kill_primary()
                recovered = [serves_again(port, token) for port in ports]
            step = steps.choice(STEPS)
            advance(cluster, step)
            elapsed += step
            wait_until_nothing_due(cluster)
        assert all(child.poll() is None for child in children), logdir
        actors = on_primary(
            cluster,
            "SELECT actor FROM todo_events"
            " WHERE from_state IS NULL AND actor LIKE 'schedule %%'",
            fetch=True,
        )
        end = START + timedelta(seconds=elapsed)
        expected = expected_slots(schedules, START, end)

        assert killed is not None
        assert cluster.primary() not in (None, killed)
        assert all(seconds is not None for seconds in recovered), recovered
        assert len(expected) > 1000
        violations = slot_violations_in(expected, [actor for (actor,) in actors])
        with capsys.disabled():
            print(
                f"\n{len(expected)} slots over {elapsed / 86400:.1f} simulated days,"
                f" {len(actors)} todos, servers back {recovered} s after the kill"
            )
        assert violations == [], f"random seed {seed}, logs in {logdir}"
    finally:
        for child in children:
            resilience.stop_process(child)
    with contextlib.suppress(OSError):
        shutil.rmtree(logdir)
