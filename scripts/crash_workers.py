"""A queue worker for the crash-safety test: claims, works, heartbeats, completes.

Run as ``python scripts/crash_workers.py --endpoint ID --name NAME --lease 2``
with ``DATABASE_URL`` naming the database. It drains the endpoint's todos
forever, printing one line per step on stdout so a supervising test can kill
it with SIGKILL at a known point::

    claimed <todo id> <attempt>
    done <todo id>
    lost <todo id>        (its lease lapsed and another worker took the todo)

Heartbeat and complete are guarded by state and owner, so a worker that lost its
lease cannot touch the todo again.

A todo whose payload holds ``"poison": true`` makes the worker hang while it
holds the lease, as a task that crashes or wedges its worker would; the
supervisor kills it there, and crash safety has to bring the todo back.
"""

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")

import django  # noqa: E402

django.setup()

from todos import store  # noqa: E402

IDLE_POLL_SECONDS = 0.05


def say(*words):
    print(*words, flush=True)


def work(scope, todo, name, lease):
    """Work on a claimed todo for a moment, heartbeating, then complete it."""
    if todo.payload.get("poison"):
        time.sleep(3600)
    # Some work outlasts one lease; the heartbeat keeps the todo ours.
    chunks = random.choice((1, 1, 1, 3))
    for chunk in range(chunks):
        time.sleep(random.uniform(0.05, lease / 3))
        if chunk < chunks - 1:
            store.heartbeat(scope, todo.id, name, lease_seconds=lease)
    store.complete_todo(scope, todo.id, name, result={"by": name})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="endpoint id to drain")
    parser.add_argument("--name", required=True, help="worker name (the owner)")
    parser.add_argument("--lease", type=int, default=2, help="lease seconds")
    args = parser.parse_args()
    scope = store.Scope(args.endpoint)
    while True:
        try:
            todo = store.claim_next(scope, args.name, lease_seconds=args.lease)
        except store.NotFound:
            time.sleep(IDLE_POLL_SECONDS)
            continue
        except store.Unavailable:
            time.sleep(0.5)
            continue
        say("claimed", todo.id, todo.attempt)
        try:
            work(scope, todo, args.name, args.lease)
        except (store.Conflict, store.Unavailable):
            say("lost", todo.id)
            continue
        say("done", todo.id)


if __name__ == "__main__":
    main()
