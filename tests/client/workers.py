"""The workers the runtime's process tests run with
``python -m switchboard_client worker tests.client.workers:<name>``.

A handler tells the test where it stands by creating the file named in the
todo's payload (``"mark"``): the test waits for the process, not for time.
"""

import time
from pathlib import Path

from switchboard_client import Context, Worker

resumable = Worker(concurrency=2)


@resumable.handler("resumable")
def step_through(ctx: Context):
    """Save step 1 at once, then hang (the test kills the process); resumed
    from a checkpoint, finish at once."""
    if ctx.checkpoint is not None:
        return {"resumed_from": ctx.checkpoint, "attempt": ctx.attempt}
    ctx.save_checkpoint({"step": 1}, now=True)
    Path(ctx.payload["mark"]).touch()
    while True:
        time.sleep(0.05)


stubborn = Worker(concurrency=2)


@stubborn.handler("stubborn")
def never_returns(ctx: Context):
    """Checkpoint (sent with the next heartbeat or the release), then run on
    past any grace period."""
    ctx.save_checkpoint({"done": ctx.payload["n"]})
    ctx.progress("working", 0.5)
    Path(ctx.payload["mark"]).touch()
    while True:
        time.sleep(0.05)
