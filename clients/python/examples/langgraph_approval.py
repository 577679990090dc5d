"""Recipe: a LangGraph graph that calls ``interrupt()`` becomes a question.

The graph plans with a chat model, then stops for approval with LangGraph's
``interrupt()``. The handler saves the graph's checkpoint (LangGraph's own,
serialized by its serializer, as its Postgres checkpointer stores it) as the
todo's checkpoint and asks the interrupt's question; the todo is held. Once
it is answered, any worker of the queue claims it, restores the graph's
checkpoint and resumes the run with ``Command(resume=answer)``.

Run it:
    SWITCHBOARD_URL=… SWITCHBOARD_TOKEN=… PYTHONPATH=clients/python/examples \\
        python -m switchboard_client worker langgraph_approval:worker

The model is langchain-core's GenericFakeChatModel (scripted, offline): put
your own chat model in ``model()``.
"""

import base64
from typing import Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from switchboard_client import Context, Worker

worker = Worker(concurrency=2)


class State(TypedDict, total=False):
    table: str
    plan: str
    decision: str
    done: str


def model():
    return GenericFakeChatModel(messages=iter([AIMessage("archive it, then drop it")]))


def plan(state: State) -> State:
    answer = model().invoke(f"How should we retire the table {state['table']}?")
    return {"plan": str(answer.content)}


def approve(state: State) -> State:
    decision = interrupt(
        {
            "question": f"Retire {state['table']}: {state['plan']}?",
            "choices": ["go ahead", "keep it"],
        }
    )
    return {"decision": decision}


def act(state: State) -> State:
    verb = "retired" if state["decision"] == "go ahead" else "kept"
    return {"done": f"{verb} {state['table']}"}


def build_graph():
    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("approve", approve)
    graph.add_node("act", act)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "approve")
    graph.add_edge("approve", "act")
    graph.add_edge("act", END)
    return graph.compile(checkpointer=InMemorySaver())


def save(saver: InMemorySaver, config: dict) -> dict[str, Any]:
    """The graph's checkpoint and pending writes (the interrupt) as JSON."""
    found = saver.get_tuple(config)

    def typed(value: Any) -> list[str]:
        kind, data = saver.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode()]

    return {
        "checkpoint": typed(found.checkpoint),
        "metadata": typed(found.metadata),
        "writes": [
            [task, channel, typed(v)] for task, channel, v in found.pending_writes
        ],
    }


def restore(saver: InMemorySaver, config: dict, saved: dict[str, Any]) -> None:
    """Put a saved checkpoint and its writes into this process's saver."""

    def value(typed: list[str]) -> Any:
        return saver.serde.loads_typed((typed[0], base64.b64decode(typed[1])))

    checkpoint = value(saved["checkpoint"])
    at = {"configurable": {**config["configurable"], "checkpoint_ns": ""}}
    stored = saver.put(
        at, checkpoint, value(saved["metadata"]), checkpoint["channel_versions"]
    )
    writes: dict[str, list[tuple[str, Any]]] = {}
    for task, channel, typed in saved["writes"]:
        writes.setdefault(task, []).append((channel, value(typed)))
    for task, task_writes in writes.items():
        saver.put_writes(stored, task_writes, task)


@worker.handler("langgraph")
def run_graph(ctx: Context):
    graph = build_graph()
    config = {"configurable": {"thread_id": ctx.todo.id}}
    if ctx.checkpoint is None:
        state = graph.invoke(ctx.payload, config)
    else:
        restore(graph.checkpointer, config, ctx.checkpoint)
        answer = None if ctx.answer is None else ctx.answer.value
        state = graph.invoke(Command(resume=answer), config)
    if "__interrupt__" in state:
        (pending,) = state["__interrupt__"]
        ctx.save_checkpoint(save(graph.checkpointer, config))
        ctx.ask(pending.value["question"], choices=pending.value.get("choices"))
    return state
