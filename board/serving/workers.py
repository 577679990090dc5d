"""gunicorn's worker class for Switchboard: uvicorn's, with a graceful stop
that ends the waiters, and the front door's HTTP protocol (board/serving/frontdoor.py:
bounded request heads, head timeout, connection cap).

On SIGTERM (or SIGINT/SIGQUIT) uvicorn stops accepting, then waits for open
requests to finish. A long poll or an event stream would otherwise wait on
until its own end, past gunicorn's ``graceful_timeout``; here the doorbell hub
tells every waiter at once to end (a long poll answers as if its wait ran out,
a stream ends and its client reconnects, elsewhere), so the process stops in
about a second. uvicorn's own graceful timeout is set just below gunicorn's.
"""

import asyncio
import gc
import sys
from types import FrameType

from uvicorn.server import Server
from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):  # type: ignore[misc]  # uvicorn-worker ships no types
    # httptools parses HTTP/1.1 faster than h11 (served with the front door's
    # bounds on heads and connections, board/serving/frontdoor.py); uvloop is a
    # faster event loop.
    CONFIG_KWARGS = {
        "loop": "uvloop",
        "http": "board.serving.frontdoor:FrontDoorProtocol",
        "lifespan": "off",
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.config.timeout_graceful_shutdown = max(self.cfg.graceful_timeout - 1, 1)

    def load_wsgi(self) -> None:
        """Load the app, then report the keys' checks (gunicorn runs no manage.py)."""
        super().load_wsgi()
        from todos.checks import report_at_start

        report_at_start()

    async def _serve(self) -> None:
        from board.serving.frontdoor import raise_open_files_limit
        from todos.db import pool
        from todos.waiting import longpoll
        from todos.waiting.doorbell import hub

        self.config.app = self.wsgi
        raise_open_files_limit()
        tune_gc()
        server = Server(config=self.config)
        loop = asyncio.get_running_loop()
        # The doorbell hub listens in this event loop, from boot; the async
        # views' pool opens in it (todos.db.pool).
        hub.start()
        await pool.open_pool()
        collector = ClockedCollector.from_settings(loop)
        stop = server.handle_exit

        def handle_exit(sig: int, frame: FrameType | None) -> None:
            stop(sig, frame)
            # A signal handler must not take locks: the hub is told from the loop.
            loop.call_soon_threadsafe(hub.shutdown)

        server.handle_exit = handle_exit  # type: ignore[method-assign]  # the handler uvicorn installs, wrapped
        self._install_sigquit_handler()
        try:
            # The sockets themselves, not gunicorn's wrappers of them: uvloop
            # detaches a socket whose descriptor it closes at the stop, but
            # closes a wrapper, which closes that descriptor a second time
            # (gunicorn then logs "Error while closing socket [Errno 9]").
            await server.serve(sockets=[listener.sock for listener in self.sockets])
        finally:
            if collector is not None:
                collector.stop()
            await longpoll.finish_outliving(timeout=1)
            await pool.close()
        if not server.started:
            from gunicorn.arbiter import Arbiter

            sys.exit(Arbiter.WORKER_BOOT_ERROR)


def tune_gc() -> None:
    """Keep the garbage collector's pauses short in a process of waiters.

    A full collection walks every object of the process with the event loop
    stopped. With 3 500 waiters open, Python's defaults ran one every few
    seconds per process, 150–470 ms each, and every request waited behind
    it. So: freeze what the process has loaded (Django, the URL resolvers,
    the settings: never garbage, never walked again), and collect the young
    generation after 10 000 allocations, not 700, so a request's own garbage
    dies young instead of aging into the full collections. The serving's
    reference cycles are gone (board.serving.asgi.release, tests/system/test_garbage),
    so a collection finds little to free. ``SWITCHBOARD_GC_THRESHOLDS``
    (board/settings.py) sets the thresholds. Measured in docs/scaling.md
    ("Garbage collection").
    """
    from django.conf import settings

    thresholds = settings.SWITCHBOARD_GC_THRESHOLDS
    if thresholds is not None:
        gc.freeze()
        gc.set_threshold(*thresholds)


class ClockedCollector:
    """Collect the young generations on a clock, not on allocation counts.

    Python collects its youngest generation when allocations outnumber
    deallocations by its first threshold. A process of waiters in its steady
    state frees about as much as it allocates (a long poll ends, its agent
    polls again), so that count barely moves while the young generation fills
    with every waiter opened since: the census of bench/waiting_agents.py's server
    found 46 000 young objects, 80 % of them alive, and each collection of
    the middle generation took 30–110 ms of CPU with the event loop stopped.

    Here the process's event loop collects the youngest generation every
    ``tick`` seconds and the middle one every ``MIDDLE_EVERY`` ticks, so each
    walks only what was made since (the slowest measured: 10–23 ms of CPU
    against 30–110), and everything once
    every ``FULL_SECONDS`` (the waiters end by reference counting; only a
    reference cycle waits for that pass). Python's own collections stay on as
    the limit for a burst between ticks. Measured in docs/scaling.md
    ("Garbage collection").
    """

    MIDDLE_EVERY = 10
    FULL_SECONDS = 600.0

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float) -> None:
        self.loop, self.tick = loop, tick
        self.ticks = 0
        self.last_full = loop.time()
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def from_settings(
        cls, loop: asyncio.AbstractEventLoop
    ) -> "ClockedCollector | None":
        """Start one for ``loop`` unless the settings turn it off."""
        from django.conf import settings

        tick_ms = settings.SWITCHBOARD_GC_TICK_MS
        if settings.SWITCHBOARD_GC_THRESHOLDS is None or not tick_ms:
            return None
        collector = cls(loop, tick_ms / 1000)
        collector.schedule()
        return collector

    def schedule(self) -> None:
        self.handle = self.loop.call_later(self.tick, self.run)

    def run(self) -> None:
        self.collect(self.loop.time())
        self.schedule()

    def collect(self, now: float) -> int:
        """One tick's collection; return the generation collected."""
        self.ticks += 1
        if now - self.last_full >= self.FULL_SECONDS:
            self.last_full = now
            generation = 2
        elif self.ticks % self.MIDDLE_EVERY == 0:
            generation = 1
        else:
            generation = 0
        gc.collect(generation)
        return generation

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
