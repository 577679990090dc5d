"""Switchboard as if built without its tracing, for bench/tracing.py's "bare" mode.

The rest of the code reaches tracing only through the functions of
``todos.telemetry.tracing`` it calls by attribute (``tracing.send(…)``,
``tracing.enabled()``…). ``strip()`` replaces every one of them with a
function that does nothing and returns what the code would get with no
tracing at all: no context read from a request, none stored or handed on, no
span, no event. What is left of the instrumentation is a call of an empty
function at each hook (tens of nanoseconds), the ``trace_context`` and
``trace_events`` columns, written as NULL, and the three columns a claim
returns for a lapsed lease's span, which a build without tracing would not
have: as close to the code without it as one codebase gets.

    python bench/tracing_bare.py -c gunicorn.conf.py --bind 127.0.0.1:8000

serves gunicorn (as ``python -m gunicorn`` would) with the hooks stripped
before its workers fork; a benchmark process calls ``strip()`` itself.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _nothing(*args, **kwargs):
    return None


def _false(*args, **kwargs):
    return False


def noops(tracing):
    """The no-op of each hook the code calls, by name."""
    unsent = tracing.Send(None)
    return {
        "configure": _false,
        "enabled": _false,
        "parse": _nothing,
        "from_request": _nothing,
        "from_headers": _nothing,
        "from_meta": _nothing,
        "from_xray": _nothing,
        "to_xray": _nothing,
        "from_stored": _nothing,
        "send": lambda queue, parent: unsent,
        "event": _nothing,
        "ended": _nothing,
        "claim_context": _nothing,
        "trace_id": _nothing,
        "delivery_trace_id": _nothing,
        "trace_link": _nothing,
        "settle_name": _nothing,
        "flush": _nothing,
        "carrying_context": lambda fn: fn,
        "requests_traced": _false,
    }


def strip():
    """Replace tracing's hooks with no-ops; return the originals (``restore``)."""
    from todos.telemetry import tracing

    replaced = noops(tracing)
    originals = {name: getattr(tracing, name) for name in replaced}
    for name, function in replaced.items():
        setattr(tracing, name, function)
    return originals


def restore(originals):
    """Put back the hooks ``strip`` replaced."""
    from todos.telemetry import tracing

    for name, function in originals.items():
        setattr(tracing, name, function)


def serve():
    """Run gunicorn with this process's tracing stripped (its workers fork
    from it, so they inherit the no-ops)."""
    # The repository's packages, not bench/'s scripts (bench/board.py is not
    # the board package).
    bench = ROOT / "bench"
    sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != bench)]
    strip()
    from gunicorn.app.wsgiapp import run

    sys.argv = ["gunicorn", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    serve()
