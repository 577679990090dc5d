"""What admission passed over, counted for /metrics (CONTRACT §17): the
candidates a claim's admission held back, by reason, and the long polls that
waited because of a rate window."""

import json
import time
from urllib.parse import urlsplit

import pytest
from django.db import OperationalError

from todos import store
from todos.store import admission, limit_figures


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def counted(scope, queue="q"):
    """This queue's admission counters now (after this process's flush)."""
    return {
        count.counter: count.count
        for count in limit_figures.admission_counts()
        if count.endpoint_id == str(scope.endpoint_id) and count.queue == queue
    }


def test_a_claim_counts_the_todos_a_rate_window_passed_over(scope):
    """CONTRACT §17 /metrics: a batch claim that takes the bucket's one token
    counts the two candidates the window had no room for."""
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 60, "burst": 1}
    )
    for _ in range(3):
        new(scope)

    assert len(store.claim_many(scope, "w", limit=3)) == 1

    assert counted(scope) == {"rate_limit": 2}


def test_a_claim_counts_the_todos_a_group_rate_window_passed_over(scope):
    admission.set_admission(
        scope, "q", group_rate_limit={"count": 1, "per_seconds": 60, "burst": 1}
    )
    new(scope, group="a")
    new(scope, group="a")
    new(scope, group="b")

    assert len(store.claim_many(scope, "w", limit=3)) == 2

    assert counted(scope) == {"group_rate_limit": 1}


def test_a_batch_claim_counts_the_todo_its_groups_limit_passed_over(scope):
    """Two todos of one group reach admission in one batch; the limit of 1
    admits the first and passes over the second."""
    admission.set_admission(scope, "q", group_concurrency=1)
    new(scope, group="a")
    new(scope, group="a")

    assert len(store.claim_many(scope, "w", limit=2)) == 1

    assert counted(scope) == {"limit": 1}


def test_a_claim_by_id_counts_a_paused_group_and_a_full_one(scope):
    """A claim by id has no pre-filter: admission passes over a todo of a
    paused group, and one of a group at its limit, and says why."""
    admission.set_admission(scope, "q", group_concurrency=1)
    admission.set_group(scope, "q", "held", paused=True)
    held = new(scope, group="held")
    new(scope, group="full")
    store.claim_many(scope, "w", limit=1)
    waiting = new(scope, group="full")

    for todo in (held, waiting):
        with pytest.raises(store.Conflict):
            store.claim_todo(scope, todo.id, "w")

    assert counted(scope) == {"paused": 1, "limit": 1}


def test_a_claim_with_no_limits_counts_nothing(scope):
    """A todo without group or limits is claimed as before; nothing counted."""
    new(scope)
    new(scope, group="a")

    assert len(store.claim_many(scope, "w", limit=5)) == 2
    assert store.claim_many(scope, "w", limit=5) == []

    assert counted(scope) == {}


def test_counts_not_yet_flushed_stay_for_the_next_flush(scope, monkeypatch):
    """A flush that fails keeps its counts in the process (the next adds them)."""
    limit_figures.flush()
    limit_figures.note_passed(
        json.dumps([{"passed": "limit", "queue": "q", "endpoint": scope.endpoint_id}])
    )

    def outage(*args, **kwargs):
        raise OperationalError("database unreachable")

    with monkeypatch.context() as patched:
        patched.setattr(limit_figures, "_run", outage)
        with pytest.raises(OperationalError):
            limit_figures.flush()

    assert counted(scope) == {"limit": 1}


def post_claim(asgi_server, token, body):
    import http.client

    url = urlsplit(asgi_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request(
            "POST",
            "/api/v1/todos/claim",
            json.dumps(body),
            {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_held_back_by_a_rate_window_counts_one_rate_limited_wait(
    asgi_server, endpoint
):
    """CONTRACT §17 /metrics: a waiting claim whose tries find only todos an
    empty bucket holds back counts one rate-limited wait, however often it
    looks again; a waiting claim with nothing to claim counts none."""
    scope = store.Scope.for_endpoint(endpoint)
    limit_figures.flush()
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 60, "burst": 1}
    )
    new(scope)
    new(scope)
    assert len(store.claim_many(scope, "w", limit=1)) == 1
    before = counted(scope)

    started = time.monotonic()
    status, _ = post_claim(
        asgi_server, endpoint.token, {"worker": "w", "queue": "q", "wait_seconds": 1}
    )
    assert status == 404 and time.monotonic() - started >= 1
    status, _ = post_claim(
        asgi_server, endpoint.token, {"worker": "w", "queue": "idle", "wait_seconds": 1}
    )
    assert status == 404

    after = counted(scope)
    assert after.get("rate_wait", 0) - before.get("rate_wait", 0) == 1
    assert after["rate_limit"] > before.get("rate_limit", 0)
    assert counted(scope, "idle") == {}


def test_a_claim_statement_that_passed_over_nothing_answers_no_row_for_none(scope):
    """The claim statement (as the benchmarks run it bare) answers only the
    todos it claimed when admission passed over nothing: no row when none.
    What it passed over rides on the rows it claimed, or on one row of NULLs
    when it claimed none."""
    from django.db import connection

    from todos.store import lifecycle

    def rows():
        with connection.cursor() as cursor:
            cursor.execute(lifecycle.CLAIM_SQL, store.bind_claim(scope, "w", limit=5))
            return cursor.fetchall()

    assert rows() == []
    admission.set_admission(
        scope, "q", rate_limit={"count": 1, "per_seconds": 60, "burst": 1}
    )
    new(scope)
    new(scope)
    (claimed,) = rows()
    assert claimed[0] is not None and "rate_limit" in claimed[-1]
    (passed,) = rows()
    assert passed[0] is None and "rate_limit" in passed[-1]
