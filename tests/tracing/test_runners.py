"""The spans of the agent path's store operations, once per runner: sync on
Django's connection and awaited on the async pool (todos.store.sql's steps).
A heartbeat's progress is kept by a statement of the operation itself, so it
runs on the same runner as the acknowledgement."""

import pytest

from tests.store.test_runners import Async, Sync

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["django", "pool"])
def run(request):
    if request.param == "django":
        return Sync()
    return Async(request.getfixturevalue("asgi_server"))


def test_each_runner_traces_a_delivery_with_its_progress(run, scope, spans):
    todo, _ = run("create_todo", scope, queue="q")
    [claimed] = run("claim_many", scope, "w", limit=1)
    run("heartbeat", scope, todo.id, "w", progress={"message": "half", "fraction": 0.5})
    run("complete_todo", scope, todo.id, "w", lease_token=claimed.lease_token)

    named = {span.name: span for span in spans.get_finished_spans()}
    assert set(named) == {"send q", "process q", "settle q"}
    process = named["process q"]
    assert process.parent.span_id == named["send q"].context.span_id
    assert [event.name for event in process.events] == ["progress"]
    assert process.events[0].attributes["switchboard.progress.message"] == "half"
    assert claimed.trace_carrier()["traceparent"][36:52] == (
        f"{process.context.span_id:016x}"
    )
