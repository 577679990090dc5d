"""Trace context in and out of the client, when OpenTelemetry is there.

A create sends the caller's current span as W3C ``traceparent``/``tracestate``
headers, so the todo joins the caller's trace; the worker runs each handler
with the claimed todo's ``trace_context`` as the current context, so the
agent's own spans (its model calls, its tools) nest under the delivery's
``process`` span. Both need only ``opentelemetry-api`` (the ``tracing``
extra); without it, or with no span current, nothing is sent and nothing is
set, and each costs one check of a module-level name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import context as _context
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )
except ImportError:  # the tracing extra is not installed
    _propagator: Any = None
else:
    _propagator = TraceContextTextMapPropagator()


def headers() -> dict[str, str] | None:
    """The current span's context as W3C headers (None: no span, or no
    OpenTelemetry)."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def within(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make ``carrier`` (a todo's ``trace_context``) the current context for
    the block; nothing without one, or without OpenTelemetry."""
    if _propagator is None or not carrier:
        yield
        return
    token = _context.attach(_propagator.extract(carrier))
    try:
        yield
    finally:
        _context.detach(token)
