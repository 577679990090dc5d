"""What several client test files share: a retry policy that counts its
tries, and one call made through either client against a served URL."""

import asyncio
import inspect
from dataclasses import dataclass, field

from switchboard_client import AsyncClient, Client, Retry


@dataclass(frozen=True)
class CountingRetry(Retry):
    """The default policy (quick unless told), counting the tries it is asked about."""

    attempts: int = 4
    deadline: float = 10.0
    base: float = 0.01
    cap: float = 0.05
    tries: list[int] = field(default_factory=list)

    def again(self, call, failure, tries, spent):
        self.tries.append(tries)
        return super().again(call, failure, tries, spent)


def served(mode, url, token, op, retry=None):
    """``op(client)`` through a ``Client`` (mode "sync") or an ``AsyncClient``
    ("async", over its own HTTP carrier), a fresh one either way."""
    if mode == "sync":
        with Client(url, token, worker="w1", retry=retry) as client:
            return op(client)

    async def run():
        async with AsyncClient(url, token, worker="w1", retry=retry) as client:
            answer = op(client)
            return await answer if inspect.isawaitable(answer) else answer

    return asyncio.run(run())
