"""The event stream through Client.events and AsyncClient.events."""

import asyncio

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_stream_announces_claimable_todos_then_each_ring(client, other_client):
    waiting = client.create("q", title="before").todo
    stream = client.events(read_timeout=15)
    try:
        first = next(stream)
        assert (first.event, first.todo_id, first.queue) == (
            "todo.ready",
            waiting.id,
            "q",
        )
        later = other_client.create("q", title="after").todo
        # An event is a hint: the first todo may be announced again.
        ready = next(e for e in stream if e.todo_id == later.id)
        assert ready.event == "todo.ready"
        todo = other_client.claim_todo(later)
        other_client.complete(todo, 1)
        done = next(
            e for e in stream if e.todo_id == later.id and e.event != "todo.ready"
        )
        assert done.event == "todo.done"
    finally:
        stream.close()


def test_the_stream_of_an_unknown_token_raises_unauthorized(asgi_server, db):
    from switchboard_client import Client, Unauthorized

    with Client(asgi_server.url, "sb_nobody") as client, pytest.raises(Unauthorized):
        next(client.events())


def test_the_async_stream_announces_an_ask(aclient_factory):
    async def run():
        async with aclient_factory("w1") as worker, aclient_factory("lead") as lead:
            await lead.create("q")
            todo = await worker.claim(queue="q")
            # A claimable todo elsewhere: its announcement shows the stream is open.
            marker = (await lead.create("marker")).todo
            stream = lead.events(read_timeout=15)
            assert (await anext(stream)).todo_id == marker.id
            await worker.ask(todo, "Go?", choices=["yes", "no"])
            async for event in stream:
                if event.event == "todo.asked":
                    await stream.aclose()
                    return event.todo_id, todo.id
            raise AssertionError("the stream ended without todo.asked")

    asked, todo_id = asyncio.run(run())
    assert asked == todo_id
