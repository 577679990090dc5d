"""The agent path's store operations, once per runner: sync on Django's
connection, and async in an event loop on the process's async pool
(todos.db.pool). Each operation is written once as steps (todos.store.sql),
so both runners must answer alike; this suite runs the same scenarios on
both, as river's driver tests do.

The database is committed (``transaction=True``): the async pool's
connections are not the test's, and see only what is committed.
"""

import uuid

import pytest
from django.db import connection

from tests.conftest import shift
from todos import store
from todos.access import auth
from todos.db import pool
from todos.sqs import credentials

pytestmark = pytest.mark.django_db(transaction=True)

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"


class Sync:
    """Calls ``store.<name>`` (and ``auth.<name>``) here."""

    name = "django"

    def __call__(self, name, *args, **kwargs):
        return getattr(store, name)(*args, **kwargs)

    def auth(self, name, *args):
        return getattr(auth, name)(*args)


class Async:
    """Awaits ``store.a<name>`` (and ``auth.a<name>``) in the in-process
    server's loop, on its pool, as a served async view does."""

    name = "pool"

    def __init__(self, server):
        self.server = server

    def __call__(self, name, *args, **kwargs):
        return self.server.run(getattr(store, f"a{name}")(*args, **kwargs))

    def auth(self, name, *args):
        return self.server.run(getattr(auth, f"a{name}")(*args))


@pytest.fixture(params=["django", "pool"])
def run(request):
    if request.param == "django":
        return Sync()
    return Async(request.getfixturevalue("asgi_server"))


def test_runners_create_and_collapse_a_duplicate_key(run, scope):
    todo, created = run("create_todo", scope, queue="q", idempotency_key="k")
    again, created_again = run("create_todo", scope, queue="q", idempotency_key="k")
    assert created and not created_again and again.id == todo.id
    assert run("get_todo", scope, todo.id).state == "pending"


def test_runners_create_many_answer_per_item(run, make_endpoint):
    narrow = store.Scope.for_endpoint(make_endpoint("narrow", queues=("q",)))
    results = run(
        "create_many",
        narrow,
        [
            {"queue": "q", "idempotency_key": "a"},
            {"queue": "q", "idempotency_key": "a"},
            {"queue": "other"},
        ],
    )
    (first, created), (second, created_second), refused = results
    assert created and not created_second and second.id == first.id
    assert isinstance(refused, store.QueueNotGranted)


def test_runners_claim_up_to_the_limit_then_none(run, scope):
    for n in range(3):
        store.create_todo(scope, queue="q", title=f"t{n}")
    claimed = run("claim_many", scope, "w1", limit=2, queue="q")
    assert [todo.title for todo in claimed] == ["t0", "t1"]
    assert {todo.state for todo in claimed} == {"claimed"}
    assert run("claim_next", scope, "w1").title == "t2"
    with pytest.raises(store.NotFound):
        run("claim_next", scope, "w1")
    assert run("claim_many", scope, "w1", limit=10) == []


def test_runners_complete_once_and_repeat_with_the_same_token(run, scope):
    store.create_todo(scope, queue="q")
    todo = run("claim_next", scope, "w1")
    done = run(
        "complete_todo",
        scope,
        todo.id,
        "w1",
        result={"ok": 1},
        lease_token=todo.lease_token,
    )
    assert done.state == "done" and done.result == {"ok": 1}
    again = run("complete_todo", scope, todo.id, None, lease_token=todo.lease_token)
    assert again.state == "done"
    with pytest.raises(store.LeaseSuperseded):
        run("complete_todo", scope, todo.id, None, lease_token="not-the-token")


def test_runners_heartbeat_fail_and_release(run, scope):
    for _ in range(3):
        store.create_todo(scope, queue="q")
    beat, failed, released = run("claim_many", scope, "w1", limit=3)
    held = run("heartbeat", scope, beat.id, "w1", lease_seconds=600)
    assert held.lease_expires_at > beat.lease_expires_at
    assert run("fail_todo", scope, failed.id, "w1", error="boom").state == "failed"
    given = run("release_todo", scope, released.id, "w1", note="later")
    assert given.state == "pending"
    with pytest.raises(store.Conflict):
        run("heartbeat", scope, released.id, "w1")


def test_runners_acknowledge_a_batch_with_one_result_each(run, scope, other_scope):
    store.create_todo(scope, queue="q")
    foreign, _ = store.create_todo(other_scope, queue="q")
    todo = run("claim_next", scope, "w1")
    results = run(
        "acknowledge_many",
        scope,
        [
            store.Ack("complete", todo.id, "w1"),
            store.Ack("complete", foreign.id, "w1"),
            store.Ack("fail", NEVER_MINTED, "w1"),
            store.Ack("explode", todo.id, "w1"),
        ],
    )
    assert results[0].state == "done"
    assert isinstance(results[1], store.NotFound)
    assert isinstance(results[2], store.NotFound)
    assert isinstance(results[3], ValueError)


def test_runners_hand_back_a_claim_never_received(run, scope):
    store.create_todo(scope, queue="q")
    todo = run("claim_next", scope, "w1")
    back = run("unclaim", scope, todo)
    assert back.state == "pending" and back.attempt == 0
    with pytest.raises(store.Conflict):
        run("unclaim", scope, todo)


def test_runners_say_when_the_next_todo_falls_due(run, scope):
    todo, _ = store.create_todo(scope, queue="q", delay_seconds=30)
    assert run("next_due", scope, within=5.0) is None
    shift(todo.id, available_at=-28)
    due = run("next_due", scope, within=5.0)
    assert due is not None and 0 < due <= 2.5


def test_runners_read_the_doorbell_backlog_and_queues(run, scope, other_scope):
    mine, _ = store.create_todo(scope, queue="q")
    store.create_todo(other_scope, queue="q")
    assert [t.id for t in run("pending_doorbell_todos", scope)] == [mine.id]
    assert run("queue_exists", scope, "q") is True
    assert run("queue_exists", scope, "nope") is False


def test_runners_get_only_a_todo_of_the_scope(run, scope, other_scope):
    foreign, _ = store.create_todo(other_scope, queue="q")
    with pytest.raises(store.NotFound):
        run("get_todo", scope, foreign.id)
    with pytest.raises(store.NotFound):
        run("get_todo", scope, "not-an-id")


def test_runners_look_credentials_up(run, endpoint):
    found = run.auth("endpoint_for_token", endpoint.token)
    assert found is not None and found.id == endpoint.id
    assert run.auth("endpoint_for_token", endpoint.token + "x") is None
    issued = credentials.issue(endpoint)
    by_key = run.auth("endpoint_for_access_key", issued.access_key_id)
    assert by_key is not None and by_key[0].id == endpoint.id
    assert run.auth("endpoint_for_access_key", "AKIA" + uuid.uuid4().hex[:12]) is None


def test_the_pool_runner_maps_a_lost_connection_to_unavailable(scope, asgi_server):
    """As ``_run`` does for Django's connection (tests/store/test_outages.py)."""
    todo, _ = store.create_todo(scope, queue="q")
    runner = Async(asgi_server)
    runner("get_todo", scope, todo.id)  # the pool keeps the connection it used
    opened = pool.current()
    assert opened is not None
    pids = [conn.info.backend_pid for conn in list(opened._pool)]
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    # The one used a moment ago is borrowed unchecked, and fails its statement
    # (the others, idle longer, are checked and replaced: todos.db.idle).
    lost = 0
    for _ in pids:
        try:
            runner("get_todo", scope, todo.id)
        except store.Unavailable:
            lost += 1
    assert lost >= 1
    # The pool replaced them.
    assert runner("claim_many", scope, "w1", limit=1)[0].id == todo.id
