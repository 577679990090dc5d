"""The recipes of clients/python/examples, end to end against a served
Switchboard: the agent asks, the answer arrives through the API, and a
different worker process resumes the run from the todo's checkpoint."""

import signal

import pytest

from tests.client.conftest import CLIENT_SRC
from tests.client.test_worker_processes import start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = CLIENT_SRC.parent / "examples"


def run_until(client, todo, asgi_server, endpoint, spec, name, until):
    """Run the example's worker as its own process until the todo is ``until``."""
    process = start_worker(
        asgi_server, endpoint, spec, "--name", name, pythonpath=[EXAMPLES]
    )
    try:
        for _ in range(30):
            seen = client.wait(todo, timeout=2)
            if until(seen):
                return seen
            assert process.poll() is None, process.stderr.read()
        raise AssertionError(f"the todo never got there: {seen}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def test_a_langgraph_interrupt_is_a_question_and_another_worker_resumes_it(
    asgi_server, endpoint, client
):
    pytest.importorskip("langgraph")
    todo = client.create("langgraph", payload={"table": "orders_2019"}).todo
    held = run_until(
        client,
        todo,
        asgi_server,
        endpoint,
        "langgraph_approval:worker",
        "first",
        lambda t: t.held,
    )
    assert held.question.text == "Retire orders_2019: archive it, then drop it?"
    assert held.question.choices == ["go ahead", "keep it"]
    assert set(held.checkpoint) == {"checkpoint", "metadata", "writes"}
    client.answer(held, "keep it")
    done = run_until(
        client,
        todo,
        asgi_server,
        endpoint,
        "langgraph_approval:worker",
        "second",
        lambda t: t.finished,
    )
    assert done.outcome == "done" and done.owner == "second"
    assert done.result == {
        "table": "orders_2019",
        "plan": "archive it, then drop it",
        "decision": "keep it",
        "done": "kept orders_2019",
    }


@pytest.mark.parametrize(
    ("answer", "tool_output"),
    [
        ("approve", "dropped orders_2019"),
        # Rejected, the tool never runs: the model is told so instead.
        ("reject", "Tool execution was not approved."),
    ],
)
def test_an_openai_agents_approval_is_a_question_and_another_worker_resumes_it(
    asgi_server, endpoint, client, answer, tool_output
):
    pytest.importorskip("agents")
    todo = client.create("agents", payload={"table": "orders_2019"}).todo
    spec = "openai_agents_approval:worker"
    held = run_until(
        client, todo, asgi_server, endpoint, spec, "first", lambda t: t.held
    )
    assert held.question.text == 'Allow drop_table({"name":"orders_2019"})?'
    assert held.question.choices == ["approve", "reject"]
    client.answer(held, answer)
    done = run_until(
        client, todo, asgi_server, endpoint, spec, "second", lambda t: t.finished
    )
    assert done.outcome == "done" and done.owner == "second"
    assert done.result["final_output"] == "Done with orders_2019."
    assert done.result["tool_outputs"] == [tool_output]
