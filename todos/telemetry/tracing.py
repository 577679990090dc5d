"""OpenTelemetry tracing (CONTRACT §19): W3C context in and out, and the spans.

**In.** A create takes a W3C trace context from what its surface carries: HTTP
``traceparent``/``tracestate`` headers (the JSON API, a webhook delivery), MCP
``params._meta``, SQS's ``AWSTraceHeader`` (X-Ray's format, converted) or a
``traceparent`` message attribute. A malformed carrier is ignored, never an
error: tracing must not refuse work.

**Out.** The todo keeps the context (``trace_context``); every claim hands it
on, so the agent's own spans join the trace. With tracing on, a claim hands on
its delivery's ``process`` span instead, so the agent's spans nest under it.

**Spans**, by the messaging conventions: ``send <queue>`` (producer) at
create; ``process <queue>`` (consumer) per delivery, from its claim to the
end of its lease, the first a child of the send span, each later one a new
trace linked to the delivery before it; ``settle <queue>`` at complete, fail
and dead letter. A delivery spans requests (claimed in one, completed in
another, maybe on another server), so its process span is written when the
delivery ends, with the claim's time as its start. Its ids are derived from the
todo and its delivery number (``deliveries``), so the claim can hand them out
before the span exists, and the next delivery can link to it with nothing more
stored. What happens meanwhile in other requests (progress, a cancel request,
the answer that ends a hold) is kept on the todo as events for that span
(``trace_events``; the store writes them only while tracing is on).

**Off by default.** Only the standard ``OTEL_*`` variables turn it on:
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP
over HTTP), unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``;
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
and the exporter's own variables as the SDK reads them. Unset, nothing is set
up and each hook is one check of a module-level name. The W3C context is
stored and handed on either way: it costs a header read.

The tracer provider is this module's own, not the process's global one, so a
library in the process that traces through the global API is not exported as
Switchboard's.
"""

import hashlib
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, DEFAULT_ON, Decision
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
    set_span_in_context,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Tracer


class Traced(Protocol):
    """What tracing reads of a todo (todos.store.rows.Todo)."""

    @property
    def id(self) -> str: ...
    @property
    def endpoint_id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def claimed_at(self) -> datetime | None: ...
    @property
    def trace_context(self) -> dict[str, Any] | None: ...
    @property
    def trace_events(self) -> list[dict[str, Any]] | None: ...
    @property
    def attempt_usage(self) -> dict[str, Any] | None: ...
    @property
    def is_canceled(self) -> bool: ...
    @property
    def is_dead_letter(self) -> bool: ...


SYSTEM = "switchboard"
# The header (and MCP _meta key, and SQS message attribute) names.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
AWS_TRACE_HEADER = "AWSTraceHeader"

# W3C trace-context level 1: version-traceid-parentid-flags, lowercase hex. A
# later version may append fields after the flags ("-…"); version ff is invalid.
TRACEPARENT_FORMAT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?"
)
# A tracestate is at most 32 list members, 512 characters kept (W3C says a
# vendor may drop what is beyond); each member key=value of printable ASCII.
MAX_TRACESTATE_CHARS = 512
TRACESTATE_MEMBER = re.compile(
    r"[a-z0-9][_0-9a-z\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
# X-Ray's header: Root=1-<8 hex epoch>-<24 hex>;Parent=<16 hex>;Sampled=0|1.
XRAY_ROOT = re.compile(r"1-([0-9a-fA-F]{8})-([0-9a-fA-F]{24})")
XRAY_PARENT = re.compile(r"[0-9a-fA-F]{16}")

# How many events a todo keeps for its process spans (the oldest go first).
MAX_TRACE_EVENTS = 32
# Event names on a process span.
PROGRESS = "progress"
QUESTION_ASKED = "question asked"
ANSWERED = "answered"
CANCEL_REQUESTED = "cancel requested"


@dataclass(frozen=True)
class TraceContext:
    """A validated W3C trace context: a traceparent and its tracestate."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        return self.traceparent[36:52]

    @property
    def sampled(self) -> bool:
        return int(self.traceparent[53:55], 16) & 1 == 1

    def to_dict(self) -> dict[str, str]:
        """The context as a carrier: ``{"traceparent"[, "tracestate"]}``."""
        if self.tracestate:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self.tracestate}
        return {TRACEPARENT: self.traceparent}


def parse(traceparent: object, tracestate: object = None) -> TraceContext | None:
    """Validate a traceparent (and its tracestate); None when it is malformed.

    A malformed tracestate is dropped and the traceparent kept, as W3C says.
    """
    if not isinstance(traceparent, str) or len(traceparent) > 512:
        return None
    match = TRACEPARENT_FORMAT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    if version == "00" and len(traceparent) == 55:
        kept = traceparent  # already as we keep it (a stored one always is)
    else:
        # A later version's extra fields are not ours to pass on: version 00 is.
        kept = f"00-{trace_id}-{span_id}-{flags}"
    return TraceContext(kept, _tracestate(tracestate))


def _tracestate(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    members = [member.strip() for member in value.split(",") if member.strip()]
    if len(members) > 32 or not all(TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return None
    kept = ",".join(members)
    return kept if len(kept) <= MAX_TRACESTATE_CHARS else None


def from_headers(headers: Mapping[str, str]) -> TraceContext | None:
    """The context an HTTP request (or a webhook delivery) carries, if valid."""
    traceparent = headers.get(TRACEPARENT)
    if traceparent is None:
        return None
    return parse(traceparent, headers.get(TRACESTATE))


def from_request(meta: Mapping[str, Any]) -> TraceContext | None:
    """The context of a Django request's headers, read from ``request.META``
    (cheaper than building ``request.headers`` on every request)."""
    traceparent = meta.get("HTTP_TRACEPARENT")
    if traceparent is None:
        return None
    return parse(traceparent, meta.get("HTTP_TRACESTATE"))


def from_meta(meta: object) -> TraceContext | None:
    """The context of an MCP request's ``params._meta`` (unprefixed keys)."""
    if not isinstance(meta, dict) or TRACEPARENT not in meta:
        return None
    return parse(meta.get(TRACEPARENT), meta.get(TRACESTATE))


def from_xray(header: object) -> TraceContext | None:
    """Convert SQS's ``AWSTraceHeader`` (X-Ray's format) to a W3C context.

    ``Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;
    Sampled=1``: the trace id is the root's two hex parts, the parent its
    span; without a parent there is no span to be a child of.
    """
    if not isinstance(header, str) or len(header) > 512:
        return None
    parts: dict[str, str] = {}
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        parts[key] = value.strip()
    root = XRAY_ROOT.fullmatch(parts.get("Root", ""))
    parent = parts.get("Parent", "")
    if root is None or XRAY_PARENT.fullmatch(parent) is None:
        return None
    flags = "01" if parts.get("Sampled") == "1" else "00"
    trace_id = (root.group(1) + root.group(2)).lower()
    return parse(f"00-{trace_id}-{parent.lower()}-{flags}")


def to_xray(context: TraceContext) -> str:
    """The context in X-Ray's format (SQS's ``AWSTraceHeader``)."""
    trace = context.trace_id
    sampled = 1 if context.sampled else 0
    return f"Root=1-{trace[:8]}-{trace[8:]};Parent={context.span_id};Sampled={sampled}"


def from_stored(stored: object) -> TraceContext | None:
    """The context a todo keeps (``trace_context``), read back."""
    if not isinstance(stored, dict):
        return None
    return parse(stored.get(TRACEPARENT), stored.get(TRACESTATE))


# --- Set-up -----------------------------------------------------------------------

# The recorder of Switchboard's spans while tracing is on, else None: every
# hook checks it first.
_recorder: "_Recorder | None" = None
# The provider's tracer (request spans, the tests' spans) and the provider.
_tracer: "Tracer | None" = None
_provider: "TracerProvider | None" = None
# Whether OpenTelemetry's Django instrumentation is set up (tracing on, and
# the environment asks for request spans: ``_request_spans_asked``).
_requests_traced = False


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def configured_endpoint() -> str | None:
    """The OTLP endpoint the environment names, unless tracing is turned off."""
    if _truthy("OTEL_SDK_DISABLED"):
        return None
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = os.environ.get(name, "").strip()
        if endpoint:
            return endpoint
    return None


def configure() -> bool:
    """Turn tracing on when the ``OTEL_*`` environment asks for it (at start-up).

    Exports over OTLP/HTTP in batches from a background thread
    (``todos.telemetry.batching``, which restarts its thread in a forked
    worker), encoded by ``todos.telemetry.otlp``.
    """
    if configured_endpoint() is None:
        return False
    from .batching import BatchSpanProcessor
    from .otlp import SpanExporter

    # The exporter reads its endpoint, headers, timeout and compression from
    # the same variables (the generic endpoint gets /v1/traces appended).
    enable(BatchSpanProcessor(SpanExporter()))
    return True


def enable(processor: "SpanProcessor", sampler: "Sampler | None" = None) -> None:
    """Trace through ``processor`` (the tests pass an in-memory exporter's).

    ``sampler`` None: the SDK's from ``OTEL_TRACES_SAMPLER`` (parent-based
    always-on by default).
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    global _tracer, _provider, _recorder
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": SYSTEM})
    provider = TracerProvider(sampler=sampler, resource=resource)
    provider.add_span_processor(processor)
    _provider = provider
    _tracer = provider.get_tracer("switchboard")
    _recorder = _Recorder(provider, processor)
    if _request_spans_asked():
        _instrument_django(provider)


def _request_spans_asked() -> bool:
    """Whether the environment asks for a server span per HTTP request.

    They are opt-in, by the instrumentation's own variable
    (``OTEL_PYTHON_DJANGO_INSTRUMENT=true``): its middleware costs a request
    about 130-170 µs of CPU (docs/operations.md, "What is instrumented").
    ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` naming ``django`` wins.
    """
    if not _truthy("OTEL_PYTHON_DJANGO_INSTRUMENT"):
        return False
    names = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return "django" not in {name.strip() for name in names.split(",")}


def requests_traced() -> bool:
    """Whether each HTTP request has its server span (board.serving.requestspans)."""
    return _requests_traced


def _instrument_django(provider: "TracerProvider") -> None:
    """Set up OpenTelemetry's Django instrumentation: an HTTP server span per
    request, exported through ``provider``.

    Its middleware is served as board.serving.requestspans (async capable, so
    the views served in the event loop stay there), in place of the one the
    instrumentor puts first in ``MIDDLEWARE``. Its metrics go nowhere.
    """
    from django.conf import settings
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.metrics import NoOpMeterProvider

    global _requests_traced
    instrumentor = DjangoInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()  # tracing enabled again: the new provider
    instrumentor.instrument(
        tracer_provider=provider, meter_provider=NoOpMeterProvider()
    )
    theirs = instrumentor._opentelemetry_middleware
    settings.MIDDLEWARE = [name for name in settings.MIDDLEWARE if name != theirs]
    _requests_traced = True


def disable() -> None:
    """Stop tracing: flush and shut the provider down (tests, shutdown)."""
    global _tracer, _provider, _recorder, _requests_traced
    provider, _tracer, _provider, _recorder = _provider, None, None, None
    if _requests_traced:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().uninstrument()
        _requests_traced = False
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _recorder is not None


def carrying_context[R](fn: Callable[[], R]) -> Callable[[], R]:
    """``fn``, to be run in another thread with this one's OpenTelemetry
    context (the request's span), while tracing is on and there is one; else
    ``fn`` as it is (without request spans, the context is empty)."""
    if _recorder is None:
        return fn
    current = otel_context.get_current()
    if not current:
        return fn

    def carried() -> R:
        token = otel_context.attach(current)
        try:
            return fn()
        finally:
            otel_context.detach(token)

    return carried


# --- Ids and contexts ---------------------------------------------------------------


def _hex(value: int, width: int) -> str:
    """An id as lowercase hex, ``width`` digits (its bytes' hex: twice as fast
    as ``format``)."""
    return value.to_bytes(width // 2).hex()


def _delivery_ids(todo_id: str, delivery: int) -> tuple[int, int]:
    """The trace id (for a redelivery's new trace) and span id of a delivery.

    Derived from the todo's random id and the delivery's number, so every
    server names a delivery's span alike without storing it.
    """
    digest = hashlib.blake2b(
        f"{todo_id}/{delivery}".encode(), digest_size=24, person=b"sb-delivery"
    ).digest()
    trace_id = int.from_bytes(digest[:16]) or 1
    span_id = int.from_bytes(digest[16:]) or 1
    return trace_id, span_id


def _span_context(context: TraceContext) -> SpanContext:
    state = TraceState.from_header([context.tracestate]) if context.tracestate else None
    return SpanContext(
        int(context.trace_id, 16),
        int(context.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(context.traceparent[53:55], 16)),
        trace_state=state,
    )


def _parent(context: TraceContext | None) -> Any:
    """An OpenTelemetry Context whose current span is ``context``; with none,
    an empty one (not the current: a delivery's span is no child of the
    request that ends it)."""
    if context is None:
        return otel_context.Context()
    return set_span_in_context(NonRecordingSpan(_span_context(context)))


def _delivery_span(
    todo_id: str, stored: TraceContext | None, number: int
) -> tuple[int, int, TraceContext | None]:
    """Delivery ``number``'s trace and span ids, and its parent: the first
    continues the create's trace (a new one without it), each later one starts
    a trace of its own (linked to the delivery before it)."""
    trace_id, span_id = _delivery_ids(todo_id, number)
    parent = stored if number == 1 else None
    if parent is not None:
        trace_id = int(parent.trace_id, 16)
    return trace_id, span_id, parent


def _delivery_context(
    todo_id: str, queue: str, stored: TraceContext | None, number: int
) -> TraceContext:
    """Delivery ``number``'s span context, its flags as the SDK will set them."""
    trace_id, span_id, parent = _delivery_span(todo_id, stored, number)
    flags = _flags(parent, trace_id, queue)
    state = stored.tracestate if stored is not None else None
    traceparent = f"00-{_hex(trace_id, 32)}-{_hex(span_id, 16)}-{flags:02x}"
    return TraceContext(traceparent, state)


def _known_decision(sampler: "Sampler", parent_sampled: bool | None) -> bool | None:
    """Whether the SDK's default samplers sample a span whose parent is
    sampled or not (None: a root): ALWAYS_ON always, ParentBased(ALWAYS_ON),
    the default, as its parent or a root; None for any other sampler, which
    is asked."""
    if sampler is ALWAYS_ON:
        return True
    if sampler is DEFAULT_ON:
        return parent_sampled is not False
    return None


def _flags(parent: TraceContext | None, trace_id: int, queue: str) -> int:
    """The trace flags the SDK gives a delivery's span when it is written, so
    the claim hands out the same: sampled as the configured sampler decides;
    random-trace-id (W3C level 2) as the parent's, or set in a trace of the
    delivery's own (its id is a hash of the todo's random id)."""
    recorder = _recorder
    if recorder is None:
        return 1 if parent is None or parent.sampled else 0
    known = _known_decision(recorder.sampler, parent.sampled if parent else None)
    if known is None:
        result = recorder.sampler.should_sample(
            _parent(parent), trace_id, f"process {queue}", SpanKind.CONSUMER
        )
        known = result.decision is Decision.RECORD_AND_SAMPLE
    flags = TraceFlags.SAMPLED if known else 0
    if parent is None:
        random = recorder.ids.is_trace_id_random()
    else:
        random = bool(int(parent.traceparent[53:55], 16) & TraceFlags.RANDOM_TRACE_ID)
    return flags | TraceFlags.RANDOM_TRACE_ID if random else flags


def claim_context(todo: "Traced") -> TraceContext | None:
    """The context a claim hands the agent: its delivery's process span while
    tracing is on and the todo is claimed; else the one the todo keeps."""
    stored = from_stored(todo.trace_context)
    if _recorder is None or todo.state != "claimed":
        return stored
    number = max(todo.deliveries, 1)
    return _delivery_context(todo.id, todo.queue, stored, number)


def trace_id(todo: "Traced") -> str | None:
    """The trace a todo was created in (the Board links it)."""
    stored = from_stored(todo.trace_context)
    return stored.trace_id if stored is not None else None


def delivery_trace_id(todo: "Traced") -> str | None:
    """The trace of the todo's latest delivery when it is one of its own (a
    redelivery, while tracing is on), else None."""
    if _recorder is None or todo.deliveries < 2:
        return None
    trace, _ = _delivery_ids(todo.id, todo.deliveries)
    return _hex(trace, 32)


def trace_link(template: str, trace: str | None) -> str | None:
    """The viewer's URL of a trace: ``template`` (SWITCHBOARD_TRACE_URL) with
    its ``{trace_id}`` replaced; None without a template or a trace."""
    if not template or trace is None:
        return None
    return template.replace("{trace_id}", quote(trace, safe=""))


# --- Spans ------------------------------------------------------------------------


def _attributes(todo: "Traced", operation: str, name: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": todo.queue,
        "messaging.message.id": todo.id,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
        "messaging.switchboard.endpoint_id": todo.endpoint_id,
        "messaging.switchboard.attempt": todo.attempt,
    }


# The most attributes a span of Switchboard's carries (a process span's own,
# its usage's and its worker's): below the SDK's default limit of 128, so its
# bounded copy of them changes nothing unless the limits are set lower.
MOST_ATTRIBUTES = 24


class _Recorder:
    """Switchboard's spans, written to the span processor as the SDK's tracer
    would make them, without a live span in between.

    Each span of Switchboard's is known whole by the time it is written (a
    process span when its delivery ends, its settle span with it, a send span
    when its create ends) and no code in the process runs inside one, so the
    SDK's live ``Span`` (its lock, its bounded attribute copy, its start and
    end calls into the processor) only costs. The recorder samples a span as
    ``Tracer.start_span`` does (the provider's sampler, with the parent's
    context, name, kind, attributes and links; the flags and trace state as
    it sets them) and hands the ended span to the processor as a
    ``ReadableSpan``, the SDK's public type for an ended span, with the same
    resource, instrumentation scope, events, links and status, bounded by
    the same ``OTEL_*`` limits. Span processors get ``on_end`` only (the
    SDK's batch and simple processors do nothing ``on_start``).
    """

    __slots__ = ("ids", "limits", "plain", "processor", "resource", "sampler", "scope")

    def __init__(self, provider: "TracerProvider", processor: "SpanProcessor") -> None:
        self.processor = processor
        self.sampler: Sampler = provider.sampler
        self.ids: IdGenerator = provider.id_generator
        self.resource = provider.resource
        # As provider.get_tracer("switchboard") names its spans' scope.
        self.scope = InstrumentationScope("switchboard", "")
        self.limits = limits = SpanLimits()
        most = limits.max_span_attributes
        self.plain = limits.max_span_attribute_length is None and (
            most is None or most >= MOST_ATTRIBUTES
        )

    def start(
        self,
        name: str,
        kind: SpanKind,
        parent: SpanContext | None,
        trace_id: int,
        span_id: int,
        attributes: dict[str, Any],
        links: Sequence[Link] = (),
        current: bool = False,
    ) -> tuple[SpanContext, dict[str, Any] | None]:
        """A span's context as the tracer would start it as a child of
        ``parent`` (None: a root; ``current``: the current context's span);
        and its attributes, None when it is not recorded."""
        known = _known_decision(
            self.sampler, parent.trace_flags.sampled if parent else None
        )
        if known is not None:
            # The decision needs no call: ALWAYS_ON and ParentBased(ALWAYS_ON)
            # keep the attributes and the parent's trace state.
            recorded: dict[str, Any] | None = attributes if known else None
            state = parent.trace_state if parent is not None else None
        else:
            if current:
                context = None
            elif parent is None:
                context = otel_context.Context()
            else:
                context = set_span_in_context(NonRecordingSpan(parent))
            result = self.sampler.should_sample(
                context, trace_id, name, kind, attributes, links
            )
            known = result.decision is Decision.RECORD_AND_SAMPLE
            recorded = None
            if result.decision is not Decision.DROP:
                recorded = dict(result.attributes)
            state = result.trace_state
        flags = TraceFlags.SAMPLED if known else TraceFlags.DEFAULT
        if parent is None:
            random = self.ids.is_trace_id_random()
        else:
            random = parent.trace_flags.random_trace_id
        if random:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(
            trace_id,
            span_id,
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=state,
        )
        return span_context, recorded

    def write(
        self,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        start_time: int | None,
        end_time: int | None = None,
        events: Iterable[dict[str, Any]] = (),
        links: Sequence[Link] = (),
        status: Status | None = None,
    ) -> None:
        """Hand the processor the ended span (a recorded one: ``start``'s
        attributes not None)."""
        now = time.time_ns()
        limits = self.limits
        if not self.plain:
            attributes = BoundedAttributes(  # type: ignore[assignment]
                limits.max_span_attributes,
                attributes,
                immutable=True,
                max_value_len=limits.max_span_attribute_length,
            )
        bounded_events: Sequence[Event] = ()
        if events:
            bounded_events = BoundedList(limits.max_events)
            for item in events:
                bounded_events.append(
                    Event(
                        item["name"],
                        BoundedAttributes(
                            limits.max_event_attributes,
                            item.get("attributes") or {},
                            max_value_len=limits.max_attribute_length,
                            immutable=True,
                        ),
                        item.get("at") or now,
                    )
                )
        bounded_links: Sequence[Link] = ()
        if links:
            bounded_links = BoundedList.from_seq(
                limits.max_links,
                [
                    Link(
                        link.context,
                        BoundedAttributes(
                            limits.max_link_attributes,
                            link.attributes,
                            max_value_len=limits.max_attribute_length,
                            immutable=True,
                        ),
                    )
                    for link in links
                ],
            )
        self.processor.on_end(
            ReadableSpan(
                name,
                context,
                parent,
                self.resource,
                attributes,
                bounded_events,
                bounded_links,
                kind,
                status=status or _UNSET,
                start_time=start_time or now,
                end_time=end_time or now,
                instrumentation_scope=self.scope,
            )
        )


_UNSET = Status(StatusCode.UNSET)


class Send:
    """A create's ``send`` span while it runs, and the context the todo keeps."""

    __slots__ = ("attributes", "context", "name", "parent", "started", "stored")

    def __init__(
        self,
        stored: TraceContext | None,
        name: str = "",
        context: SpanContext | None = None,
        parent: SpanContext | None = None,
        attributes: dict[str, Any] | None = None,
        started: int = 0,
    ) -> None:
        self.stored = stored
        self.name = name
        self.context = context
        self.parent = parent
        self.attributes = attributes
        self.started = started

    def carrier(self) -> "dict[str, Any] | None":
        """What the store writes into ``trace_context``."""
        return self.stored.to_dict() if self.stored is not None else None

    def end(self, todo: "Traced | Exception", created: bool = True) -> None:
        """End the span with the todo the create made (or found, or the error)."""
        attributes = self.attributes
        recorder = _recorder
        if attributes is None or recorder is None or self.context is None:
            return  # no span, or not recorded, or tracing turned off since
        status = None
        if isinstance(todo, Exception):
            status = Status(StatusCode.ERROR, type(todo).__name__)
        else:
            attributes["messaging.message.id"] = todo.id
            attributes["messaging.switchboard.endpoint_id"] = todo.endpoint_id
            attributes["messaging.switchboard.created"] = created
        recorder.write(
            self.name,
            SpanKind.PRODUCER,
            self.context,
            self.parent,
            attributes,
            self.started,
            status=status,
        )


# A create with tracing off and no context: nothing to keep, nothing to end.
_NOT_SENT = Send(None)


def _send_parent(carried: TraceContext | None) -> tuple[SpanContext | None, bool]:
    """The parent of a ``send`` span, and whether it is the current context's:
    the request's span (the HTTP server span) when the create carries no
    context or one of the request's trace; else the context the create
    carries (MCP ``_meta``, an SQS message attribute), which names the
    message's own trace; else none."""
    current = get_current_span().get_span_context()
    if current.is_valid and (
        carried is None or carried.trace_id == _hex(current.trace_id, 32)
    ):
        return current, True
    if carried is None:
        return None, False
    return _span_context(carried), False


def send(queue: object, parent: TraceContext | None) -> Send:
    """Start a create's ``send <queue>`` span (producer), a child of ``parent``.

    Tracing off: no span, and the todo keeps ``parent`` as it came.
    """
    recorder = _recorder
    if recorder is None or not isinstance(queue, str):
        return Send(parent) if parent is not None else _NOT_SENT
    started = time.time_ns()
    parent_span, current = _send_parent(parent)
    if parent_span is None:
        trace_id = recorder.ids.generate_trace_id()
    else:
        trace_id = parent_span.trace_id
    name = f"send {queue}"
    span_context, attributes = recorder.start(
        name,
        SpanKind.PRODUCER,
        parent_span,
        trace_id,
        recorder.ids.generate_span_id(),
        {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": "create",
        },
        current=current,
    )
    flags = int(span_context.trace_flags)
    traceparent = (
        f"00-{_hex(trace_id, 32)}-{_hex(span_context.span_id, 16)}-{flags:02x}"
    )
    state = parent.tracestate if parent is not None else None
    return Send(
        TraceContext(traceparent, state),
        name,
        span_context,
        parent_span,
        attributes,
        started,
    )


def event(name: str, delivery: int, **attributes: Any) -> "dict[str, Any] | None":
    """A span event for delivery ``delivery``'s process span, as the todo
    keeps it (``trace_events``); None while tracing is off."""
    if _recorder is None:
        return None
    return {
        "delivery": delivery,
        "name": name,
        "at": time.time_ns(),
        "attributes": {
            f"switchboard.{key}": value
            for key, value in attributes.items()
            if value is not None
        },
    }


# A delivery's usage (CONTRACT §18) by OpenTelemetry's GenAI names; the cost
# has none there, so it is Switchboard's own.
USAGE_ATTRIBUTES = {
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cost_usd": "switchboard.usage.cost_usd",
}


def usage_attributes(todo: "Traced", delivery: int) -> dict[str, Any]:
    """The attributes of what the agent reported spending in ``delivery``
    (its last report: the delivery's running total); none without a report.
    The one ``model`` a report names is the request's and the response's."""
    usage = todo.attempt_usage
    if not usage or usage.get("delivery") != delivery:
        return {}
    attributes: dict[str, Any] = {
        name: usage[field]
        for field, name in USAGE_ATTRIBUTES.items()
        if usage.get(field) is not None
    }
    if "switchboard.usage.cost_usd" in attributes:
        attributes["switchboard.usage.cost_usd"] = float(
            attributes["switchboard.usage.cost_usd"]
        )
    if usage.get("model"):
        attributes["gen_ai.request.model"] = usage["model"]
        attributes["gen_ai.response.model"] = usage["model"]
    return attributes


def _ns(at: datetime | None) -> int | None:
    return int(at.timestamp() * 1e9) if at is not None else None


def ended(
    todo: "Traced",
    how: str,
    *,
    settle: str | None = None,
    error: str | None = None,
    events: Iterable[dict[str, Any]] = (),
    given_back: bool = False,
    worker: str | None = None,
    end_time: datetime | None = None,
) -> None:
    """Write the ``process`` span of the delivery that just ended, and its
    ``settle`` span when it ended in complete, fail or a dead letter.

    ``how`` names the end (complete, fail, release, ask, lapsed, …); ``events``
    are what happened in this request (a question asked), beside those the todo
    kept for this delivery. ``given_back``: the end gave the attempt back (an
    ask, a claim never received), so the delivery's attempt is one more.
    ``worker``: who held the delivery, when the end cleared the todo's owner.
    ``end_time``: when it ended, if not now (a lease that ran out). The
    process span carries the delivery's usage as last reported (a heartbeat's
    running total, or the complete's or fail's), as ``gen_ai.usage.*``.
    """
    recorder = _recorder
    if recorder is None:
        return
    number = max(todo.deliveries, 1)
    stored = from_stored(todo.trace_context)
    trace_id, span_id, parent = _delivery_span(todo.id, stored, number)
    links: Sequence[Link] = ()
    if number > 1:
        previous = _delivery_context(todo.id, todo.queue, stored, number - 1)
        links = [
            Link(
                _span_context(previous),
                {"messaging.switchboard.link": "previous delivery"},
            )
        ]
    attributes = _attributes(todo, "process", "claim")
    attributes["messaging.switchboard.delivery"] = number
    if given_back:
        attributes["messaging.switchboard.attempt"] = todo.attempt + 1
    attributes["messaging.switchboard.outcome"] = how
    attributes.update(usage_attributes(todo, number))
    if worker or todo.owner:
        attributes["messaging.client.id"] = worker or todo.owner
    name = f"process {todo.queue}"
    remote = _span_context(parent) if parent is not None else None
    process, recorded = recorder.start(
        name, SpanKind.CONSUMER, remote, trace_id, span_id, attributes, links
    )
    if settle is not None:
        # A child of the process span, written first as the SDK's ended first.
        settled, settle_attributes = recorder.start(
            f"settle {todo.queue}",
            SpanKind.CLIENT,
            process,
            trace_id,
            recorder.ids.generate_span_id(),
            _attributes(todo, "settle", settle),
        )
        if settle_attributes is not None:
            recorder.write(
                f"settle {todo.queue}",
                SpanKind.CLIENT,
                settled,
                process,
                settle_attributes,
                None,
            )
    if recorded is None:
        return
    kept = [e for e in (todo.trace_events or ()) if e.get("delivery") == number]
    recorder.write(
        name,
        SpanKind.CONSUMER,
        process,
        remote,
        recorded,
        _ns(todo.claimed_at),
        _ns(end_time),
        [*kept, *events],
        links,
        Status(StatusCode.ERROR, error[:200]) if error is not None else None,
    )


def settle_name(todo: "Traced", op: str) -> str | None:
    """How an acknowledgement settled the todo: complete, fail, dead_letter
    (None: it did not, a release hands it on; a canceled end is ``cancel``)."""
    if todo.is_canceled:
        return "cancel"
    if op == "complete":
        return "complete"
    if op == "fail":
        return "dead_letter" if todo.is_dead_letter else "fail"
    if op == "release" and todo.is_dead_letter:
        return "dead_letter"
    return None


def flush() -> None:
    """Export what is buffered now (tests; a management command's end)."""
    if _provider is not None:
        _provider.force_flush()
