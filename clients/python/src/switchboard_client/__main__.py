"""``python -m switchboard_client worker module:attribute``: run a Worker."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from switchboard_client import logs
from switchboard_client.client import Client
from switchboard_client.worker import Worker

DESCRIPTION = """\
Run the Worker found at MODULE:ATTRIBUTE (e.g. myapp.workers:worker) until
SIGTERM or SIGINT; then it stops claiming, lets in-flight handlers finish within
the grace period and releases the rest with their last checkpoint.

The server and token come from --url/--token, else SWITCHBOARD_URL and
SWITCHBOARD_TOKEN (prefer the variable for the token: a flag shows in ps). They
are used when the Worker was made without a client: Worker(concurrency=4).
"""


def load_worker(spec: str) -> Worker:
    """The Worker at ``module:attribute``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"expected MODULE:ATTRIBUTE, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    found = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(found, Worker):
        raise SystemExit(f"{spec} is not a switchboard_client.Worker")
    return found


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m switchboard_client",
        description="Switchboard's Python client and worker runtime.",
    )
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "worker",
        help="run a Worker",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("worker", metavar="MODULE:ATTRIBUTE", help="the Worker to run")
    run.add_argument(
        "--url",
        default=os.environ.get("SWITCHBOARD_URL"),
        help="the server, e.g. http://127.0.0.1:8000 (SWITCHBOARD_URL)",
    )
    run.add_argument(
        "--token",
        default=os.environ.get("SWITCHBOARD_TOKEN"),
        help="the endpoint token, sb_… (SWITCHBOARD_TOKEN)",
    )
    run.add_argument("--name", help="this worker's name (default <hostname>-<pid>)")
    run.add_argument(
        "--concurrency", type=int, help="todos run at once (default: the Worker's)"
    )
    run.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="after SIGTERM, how long in-flight todos may run on",
    )
    run.add_argument("--log-format", choices=("text", "json"), default="text")
    run.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    return top


def main(argv: Sequence[str] | None = None) -> None:
    options = parser().parse_args(argv)
    logs.configure(options.log_level, options.log_format)
    worker = load_worker(options.worker)
    if worker.client is None:
        if not options.url or not options.token:
            raise SystemExit(
                "no server: pass --url and --token, or set SWITCHBOARD_URL and "
                "SWITCHBOARD_TOKEN"
            )
        worker.client = Client(options.url, options.token, worker=options.name)
    if options.concurrency is not None:
        worker.concurrency = options.concurrency
    if options.grace is not None:
        worker.grace_seconds = options.grace
    worker.run()


if __name__ == "__main__":
    main()
