"""OTLP/HTTP span export, encoded straight to protobuf's wire format.

The SDK's OTLP exporter builds an ``ExportTraceServiceRequest`` of protobuf
objects to serialize it: about 25 µs a span of Switchboard's (two Python
message objects per attribute, and each span copied into its parent message
twice), more than starting and ending the span. ``encode`` writes the same
message as bytes (opentelemetry-proto's trace v1 schema, as the SDK's encoder
fills it in: the same fields, the same resource and scope grouping; a test
holds the two equal) in about a fifth of the time, remembering the bytes of
the attributes a queue's spans repeat. ``SpanExporter`` is the SDK's OTLP/HTTP
exporter sending them: its endpoint, headers, compression, timeout and retries
as the ``OTEL_*`` variables set them, posting through urllib3 rather than
requests (the SDK's own transport for it, 150 µs of CPU a post in place of
400).
"""

import logging
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

logger = logging.getLogger(__name__)

# Span.SpanKind's numbers (SPAN_KIND_INTERNAL = 1 … SPAN_KIND_CONSUMER = 5), as
# the span's field 6.
KINDS = {
    SpanKind.INTERNAL: b"\x30\x01",
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}
# SpanFlags: the span says whether its parent (or a link) is remote, and if so.
HAS_IS_REMOTE = 0x100
IS_REMOTE = 0x200
# Encoded attributes kept for reuse, by field tag, then key, then text or
# integer value (a queue's spans repeat their system, queue, operation,
# endpoint, attempt; a todo's spans its message id); each value's dict emptied
# when full, as is a tag's when it holds too many keys.
MAX_REMEMBERED = 4096
MAX_VALUES = 1024

_remembered: dict[bytes, dict[str, dict[str | int, bytes]]] = {}
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return bytes((value,))
    if value < 0:
        value += 1 << 64  # an int64 below zero takes ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its bytes."""
    return tag + _varint(len(payload)) + payload


def _text(tag: bytes, value: str) -> bytes:
    return _field(tag, value.encode())


def _value(value: Any) -> bytes:
    """An ``AnyValue`` (a oneof: set even when it holds the zero value)."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = b"".join(
            _field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()
        )
        return _field(b"\x32", pairs)
    raise TypeError(f"an attribute of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _text(b"\x0a", key) + _field(b"\x12", _value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a ``KeyValue`` field ``tag``; a text or integer one
    remembered (not a bool: True == 1 would find 1's bytes)."""
    if not attributes:
        return b""
    out = []
    # A span's attributes copy to a plain dict far faster than their mapping
    # proxy iterates (the SDK's BoundedAttributes: a lookup per key).
    copy = getattr(attributes, "copy", None)
    items = copy().items() if copy is not None else attributes.items()
    keys = _remembered.get(tag)
    if keys is None or len(keys) >= MAX_REMEMBERED:
        keys = _remembered[tag] = {}
    for key, value in items:
        kind = type(value)
        if kind is str or kind is int:
            values = keys.get(key)
            if values is None:
                values = keys[key] = {}
            encoded = values.get(value)
            if encoded is None:
                if len(values) >= MAX_VALUES:
                    values.clear()
                encoded = values[value] = _field(tag, _key_value(key, value))
            out.append(encoded)
        else:
            try:
                out.append(_field(tag, _key_value(key, value)))
            except TypeError:
                logger.exception("attribute %s not exported", key)
    return b"".join(out)


def _count(tag: bytes, value: int) -> bytes:
    return tag + _varint(value) if value else b""


def _flags(context: Any) -> int:
    """SpanFlags of a span's parent or a link's context."""
    return HAS_IS_REMOTE | (IS_REMOTE if context and context.is_remote else 0)


# A span's last field, its SpanFlags: without a parent or with a local one,
# or with a remote one.
LOCAL_FLAGS = b"\x85\x01" + _FIXED32.pack(HAS_IS_REMOTE)
REMOTE_FLAGS = b"\x85\x01" + _FIXED32.pack(HAS_IS_REMOTE | IS_REMOTE)
# The encoded name and kind of a span (fields 5 and 6, adjacent), and its
# status (field 15), as spans repeat them; emptied when full.
_named: dict[str, tuple[Any, bytes]] = {}
_statuses: dict[tuple[int, str | None], bytes] = {}
_pack64 = _FIXED64.pack


def _name_and_kind(name: str, kind: Any) -> bytes:
    # By name, then the kind compared by identity: a SpanKind hashes in Python.
    known = _named.get(name)
    if known is not None and known[0] is kind:
        return known[1]
    if len(_named) >= MAX_REMEMBERED:
        _named.clear()
    encoded = (_text(b"\x2a", name) if name else b"") + KINDS[kind]
    _named[name] = (kind, encoded)
    return encoded


def _status(status: Any) -> bytes:
    """The ``Status`` field, always there, as the SDK's encoder writes it."""
    remembered = (status.status_code.value, status.description)
    encoded = _statuses.get(remembered)
    if encoded is None:
        if len(_statuses) >= MAX_REMEMBERED:
            _statuses.clear()
        fields = _text(b"\x12", status.description) if status.description else b""
        fields += _count(b"\x18", status.status_code.value)
        encoded = _field(b"\x7a", fields)
        _statuses[remembered] = encoded
    return encoded


def _span(span: ReadableSpan) -> bytes:
    """One ``Span`` message, the fields the SDK's encoder sets."""
    context = span.context
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16),
        b"\x12\x08",
        context.span_id.to_bytes(8),
    ]
    state = context.trace_state
    if state:
        parts.append(_text(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items())))
    parent = span.parent
    if parent:
        parts.append(b"\x22\x08")
        parts.append(parent.span_id.to_bytes(8))
    parts.append(_name_and_kind(span.name, span.kind))
    if span.start_time:
        parts.append(b"\x39")
        parts.append(_pack64(span.start_time))
    if span.end_time:
        parts.append(b"\x41")
        parts.append(_pack64(span.end_time))
    parts.append(_attributes(b"\x4a", span.attributes))
    dropped = span.dropped_attributes
    if dropped:
        parts.append(b"\x50" + _varint(dropped))
    for event in span.events:
        fields = b"\x09" + _pack64(event.timestamp) if event.timestamp else b""
        fields += _text(b"\x12", event.name) if event.name else b""
        fields += _attributes(b"\x1a", event.attributes)
        fields += _count(b"\x20", event.dropped_attributes)
        parts.append(_field(b"\x5a", fields))
    dropped = span.dropped_events
    if dropped:
        parts.append(b"\x60" + _varint(dropped))
    for link in span.links:
        fields = b"\x0a\x10" + link.context.trace_id.to_bytes(16)
        fields += b"\x12\x08" + link.context.span_id.to_bytes(8)
        fields += _attributes(b"\x22", link.attributes)
        fields += _count(b"\x28", link.dropped_attributes)
        fields += b"\x35" + _FIXED32.pack(_flags(link.context))
        parts.append(_field(b"\x6a", fields))
    dropped = span.dropped_links
    if dropped:
        parts.append(b"\x70" + _varint(dropped))
    parts.append(_status(span.status))
    parts.append(REMOTE_FLAGS if parent and parent.is_remote else LOCAL_FLAGS)
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    """An ``InstrumentationScope`` (empty when the span has none)."""
    if scope is None:
        return b""
    fields = _text(b"\x0a", scope.name) if scope.name else b""
    fields += _text(b"\x12", scope.version) if scope.version else b""
    return fields + _attributes(b"\x1a", scope.attributes)


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``spans``, serialized: grouped by
    resource, then by instrumentation scope, in the order first seen."""
    grouped: dict[Any, dict[Any, list[bytes]]] = {}
    resource = scopes = scope = encoded = None
    for span in spans:
        # A resource hashes through a JSON dump of its attributes, a scope in
        # Python: each looked up only when it changes (one provider's spans
        # share one resource, one tracer's one scope).
        if span.resource is not resource:
            resource = span.resource
            scopes = grouped.setdefault(resource, {})
            scope = encoded = None
        if encoded is None or span.instrumentation_scope is not scope:
            assert scopes is not None
            scope = span.instrumentation_scope
            encoded = scopes.setdefault(scope or None, [])
        encoded.append(_span(span))
    out = []
    for resource, scopes in grouped.items():
        fields = [_field(b"\x0a", _attributes(b"\x0a", resource.attributes))]
        for scope, encoded in scopes.items():
            scope_spans = [_field(b"\x0a", _scope(scope))]
            scope_spans.extend(_field(b"\x12", span) for span in encoded)
            if scope is not None and scope.schema_url:
                scope_spans.append(_text(b"\x1a", scope.schema_url))
            fields.append(_field(b"\x12", b"".join(scope_spans)))
        if resource.schema_url:
            fields.append(_text(b"\x1a", resource.schema_url))
        out.append(_field(b"\x0a", b"".join(fields)))
    return b"".join(out)


# The variables that name a credential provider (a requests session of the
# provider's): with one, the exporter posts through requests as the SDK does.
CREDENTIAL_PROVIDERS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)


def _first(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _urllib3_transport(
    certificate_file: str | None,
    client_key_file: str | None,
    client_certificate_file: str | None,
) -> Any:
    """The SDK's urllib3 transport, with the certificates the SDK's requests
    transport would take: the arguments, else the traces' variables, else
    the generic ones."""
    from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport

    verify = certificate_file or _first(
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"
    )
    key = client_key_file or _first(
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"
    )
    certificate = client_certificate_file or _first(
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    )
    cert = (certificate, key) if certificate and key else certificate
    return Urllib3HTTPTransport(verify=verify or True, cert=cert)


class SpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, sending what ``encode`` writes.

    Its ``export`` less the encoding, which is ours: the same checks, its
    exporter metrics, and its client's post with its retries and backoff.
    (The size check it makes against its ``max_request_size``, 64 MiB unless
    its constructor is told otherwise, is left out: a batch of the span
    processor's at most 512 spans is far below it.) It posts through the
    SDK's urllib3 transport, unless given a requests session or a credential
    provider's.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        certificate_file: str | None = None,
        client_key_file: str | None = None,
        client_certificate_file: str | None = None,
        **options: Any,
    ) -> None:
        if options.get("session") is None and _first(*CREDENTIAL_PROVIDERS) is None:
            options["_transport"] = _urllib3_transport(
                certificate_file, client_key_file, client_certificate_file
            )
        super().__init__(
            endpoint,
            certificate_file,
            client_key_file,
            client_certificate_file,
            **options,
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                body = encode(spans)
            except Exception as error:
                logger.exception("span batch not encoded")
                result.error = error
                return SpanExportResult.FAILURE
            sent = self._client.export(body)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {"http.response.status_code": sent.status_code}
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
