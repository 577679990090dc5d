"""AsyncClient carries the same calls as Client: a worker's whole loop, over
its own HTTP carrier and, with a transport of the caller's, over httpx."""

import asyncio

import httpx
import pytest
from switchboard_client import AsyncClient, LeaseSuperseded, NotFound, Progress

from tests.client.conftest import QUICK_RETRY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("carrier", ["own", "httpx"])
def test_the_async_client_claims_beats_asks_resumes_and_completes(
    asgi_server, endpoint, carrier
):
    def client(worker):
        transport = httpx.AsyncHTTPTransport() if carrier == "httpx" else None
        return AsyncClient(
            asgi_server.url,
            endpoint.token,
            worker=worker,
            retry=QUICK_RETRY,
            transport=transport,
        )

    async def run():
        async with client("w1") as worker, client("lead") as lead:
            made = (await lead.create("q", payload={"n": 2})).todo
            assert await worker.claim(queue="other") is None
            todo = await worker.claim(queue="q", wait_seconds=1)
            beat = await worker.heartbeat(
                todo, progress=Progress("thinking", 0.1), checkpoint={"s": 1}
            )
            assert beat.progress.message == "thinking"
            held = await worker.ask(todo, "Which?", choices=["a", "b"])
            assert (await lead.wait(made, timeout=5)).held
            await lead.answer(held, "b")
            resumed = (await worker.claim_many(2, queue="q"))[0]
            assert resumed.answer.value == "b" and resumed.checkpoint == {"s": 1}
            with pytest.raises(LeaseSuperseded):
                await worker.complete(todo, "stale token")
            await worker.complete(resumed, {"chose": resumed.answer.value})
            done = await lead.wait(made, timeout=5)
            listed = [t.id async for t in lead.iter_todos(queue="q", state="done")]
            with pytest.raises(NotFound):
                await lead.get("missing")
            return done, listed, made

    done, listed, made = asyncio.run(run())
    assert done.result == {"chose": "b"} and listed == [made.id]
