"""Recipe: an OpenAI Agents SDK tool with ``needs_approval`` becomes a question.

The agent calls a tool that needs approval; the SDK stops the run with the
call among its interruptions. The handler saves the serialized ``RunState``
as the todo's checkpoint and asks whether to allow the call; the todo is held.
Once it is answered, any worker of the queue claims it, rebuilds the
``RunState``, approves or rejects the call as answered, and resumes the run.

Run it:
    SWITCHBOARD_URL=… SWITCHBOARD_TOKEN=… PYTHONPATH=clients/python/examples \\
        python -m switchboard_client worker openai_agents_approval:worker

The model is the SDK's ScriptedModel (agents.testing; offline), scripted with
what a model would answer at each point: give ``build_agent`` your model
instead (``model="gpt-…"``) and drop ``script``.
"""

from typing import Any

from agents import (
    Agent,
    Runner,
    RunResult,
    RunState,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

from switchboard_client import Context, Worker

# The recipe runs offline: no traces are sent.
set_tracing_disabled(True)

worker = Worker(concurrency=2)


@function_tool(needs_approval=True)
def drop_table(name: str) -> str:
    """Drop a database table (irreversible)."""
    return f"dropped {name}"


def script(table: str, resumed: bool) -> ScriptedModel:
    """What a model would answer: first the tool call, then its summary."""
    if not resumed:
        call = function_call("drop_table", {"name": table}, call_id="call-1")
        return ScriptedModel([[call]])
    return ScriptedModel([[assistant_message(f"Done with {table}.")]])


def build_agent(model: ScriptedModel) -> Agent:
    return Agent(
        name="dba",
        instructions="Retire the table you are given.",
        tools=[drop_table],
        model=model,
    )


def question(result: RunResult) -> str:
    calls = ", ".join(f"{item.name}({item.arguments})" for item in result.interruptions)
    return f"Allow {calls}?"


@worker.handler("agents")
async def run_agent(ctx: Context) -> dict[str, Any]:
    table = ctx.payload["table"]
    agent = build_agent(script(table, resumed=ctx.checkpoint is not None))
    if ctx.checkpoint is None:
        result = await Runner.run(agent, f"Retire the table {table}.")
    else:
        state = await RunState.from_json(agent, ctx.checkpoint)
        approved = ctx.answer is not None and ctx.answer.value == "approve"
        for item in state.get_interruptions():
            if approved:
                state.approve(item)
            else:
                state.reject(item)
        result = await Runner.run(agent, state)
    if result.interruptions:
        ctx.save_checkpoint(result.to_state().to_json())
        ctx.ask(question(result), choices=["approve", "reject"])
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return {"final_output": result.final_output, "tool_outputs": outputs}
