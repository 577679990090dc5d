"""The 14 SQS actions of CONTRACT §11, each a translation to store calls.

Each action takes the authenticated ``Caller`` and the request's JSON members
and returns the response members; a failure is an ``SqsError``. No SQL and no
state rule lives here: a message is a todo, ReceiveMessage is a batch claim,
DeleteMessage completes, ChangeMessageVisibility heartbeats (0 releases).
"""

import base64
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, overload
from urllib.parse import urlsplit

from todos import store
from todos.access import auth
from todos.db import pool
from todos.db.pool import Runner, db
from todos.sqs import messages
from todos.sqs.protocol import Caller, SqsError, SqsRequest, invalid
from todos.store import admission, sqs_fifo
from todos.telemetry import tracing
from todos.web import http

logger = logging.getLogger("switchboard.sqs")

# Every pattern is matched against the whole string (fullmatch): "$" would
# let a trailing newline through. A FIFO queue's name ends in ".fifo", within
# the same 80 characters.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo")
BATCH_ENTRY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
DEDUPLICATION_ID_RE = re.compile(r"[\x21-\x7e]{1,128}")
MAX_BATCH_ENTRIES = 10
MAX_DELAY_SECONDS = 900
MAX_WAIT_SECONDS = 20
# What CreateQueue gives a queue it creates, when not told (SQS's defaults:
# without a RedrivePolicy a message is received again without limit).
CREATE_DEFAULTS = {
    "lease_seconds": 30,
    "delay_seconds": 0,
    "max_attempts": store.UNLIMITED_ATTEMPTS,
}
# Attributes SQS reports that Switchboard holds fixed: accepted when set (a
# client that sets its retention keeps working), reported as they are.
FIXED_ATTRIBUTES = {
    "MaximumMessageSize": str(messages.MAX_MESSAGE_BYTES),
    "MessageRetentionPeriod": "345600",
    "ReceiveMessageWaitTimeSeconds": "0",
    "SqsManagedSseEnabled": "false",
}
QUEUE_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
    "VisibilityTimeout",
    "DelaySeconds",
    "RedrivePolicy",
    *FIXED_ATTRIBUTES,
    "FifoQueue",
    *sqs_fifo.FIFO_DEFAULTS,
)
MESSAGE_SYSTEM_ATTRIBUTES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "MessageDeduplicationId",
    "AWSTraceHeader",
    "MessageGroupId",
    "SequenceNumber",
)
# A FIFO queue holds one message of a group in flight at a time (CONTRACT §17).
FIFO_GROUP_CONCURRENCY = 1
NOT_FOR_THIS_QUEUE_TYPE = (
    "The request include parameter that is not valid for this queue type."
)
CLAIMANT = "sqs"

# A request's or a response's members: JSON values.
type Body = dict[str, Any]


# --- Members ----------------------------------------------------------------


@overload
def _member[T](
    body: Body, name: str, kind: type[T], *, required: Literal[True]
) -> T: ...


@overload
def _member[T](
    body: Body, name: str, kind: type[T], *, required: bool = False
) -> T | None: ...


def _member[T](
    body: Body, name: str, kind: type[T], *, required: bool = False
) -> T | None:
    value = body.get(name)
    if value is None:
        if required:
            raise SqsError(
                "MissingParameter", f"The request must contain the parameter {name}."
            )
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SqsError(
            "SerializationException", f"{name}: expected {kind.__name__} value"
        )
    if isinstance(value, str):  # kind is str
        _check_storable(name, value)
    return value


def _check_storable(name: str, value: str) -> None:
    # The JSON API's text check: what PostgreSQL could not store is a 400.
    problem = http.text_problem(value)
    if problem:
        raise invalid(f"{name} {problem}")


def _integer(body: Body, name: str, minimum: int, maximum: int) -> int | None:
    value = _member(body, name, int)
    if value is not None and not minimum <= value <= maximum:
        raise invalid(
            f"Value {value} for parameter {name} is invalid. Reason: Must be "
            f"between {minimum} and {maximum}, if provided."
        )
    return value


def _string_list(body: Body, name: str) -> list[str]:
    values: list[Any] = _member(body, name, list) or []
    if not all(isinstance(value, str) for value in values):
        raise SqsError("SerializationException", f"{name}: expected strings")
    return values


def _queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. "
            "1 to 80 in length"
        )
    return name


@dataclass(frozen=True)
class Queue:
    """A queue addressed by a request: its name and the scope narrowed to it."""

    name: str
    scope: store.Scope


def _no_such_queue() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


def _queue_scope(caller: Caller, name: str) -> store.Scope:
    return store.Scope(caller.scope.endpoint_id, (name,))


def queue_url(request: SqsRequest, caller: Caller, name: str) -> str:
    return f"{request.scheme}://{request.get_host()}/{caller.account_id}/{name}"


def _addressed(caller: Caller, body: Body, *, must_exist: bool = True) -> Queue:
    """Resolve QueueUrl: the caller's account, a granted name, an existing queue.

    Another endpoint's queue URL, a name outside the grant and a queue that
    never existed answer alike: QueueDoesNotExist. A bare queue name is the
    caller's own queue, as SQS takes it.
    """
    url = _member(body, "QueueUrl", str, required=True)
    path = urlsplit(url).path if "://" in url else url
    parts = path.strip("/").split("/")
    if len(parts) == 1 and "/" not in url:
        parts = [caller.account_id, url]
    if len(parts) != 2 or parts[0] != caller.account_id:
        raise _no_such_queue()
    name = parts[1]
    if not QUEUE_NAME_RE.fullmatch(name) or not caller.scope.covers(name):
        raise _no_such_queue()
    queue = Queue(name, _queue_scope(caller, name))
    if must_exist:
        _check_exists(caller, name)
    return queue


def _check_exists(caller: Caller, name: str) -> None:
    # One index probe: the figures get_queue computes are not needed here.
    if not store.queue_exists(caller.scope, name):
        raise _no_such_queue()


async def _acheck_exists(caller: Caller, name: str, on: Runner = db) -> None:
    """``_check_exists`` awaited in the loop (on the transaction ``on``)."""
    if not await store.arun_steps(store.queue_exists_steps(caller.scope, name), on):
        raise _no_such_queue()


async def _aaddressed(caller: Caller, body: Body) -> Queue:
    """``_addressed`` of a queue that must exist, awaited in the loop."""
    queue = _addressed(caller, body, must_exist=False)
    await _acheck_exists(caller, queue.name)
    return queue


def _existing(caller: Caller, name: str) -> store.QueueInfo:
    try:
        return store.get_queue(caller.scope, name)
    except store.NotFound:
        raise _no_such_queue() from None


# --- Queue attributes -------------------------------------------------------


def _settings_from_attributes(attributes: object) -> dict[str, int]:
    """Turn SQS queue attributes into §10 queue settings (validated)."""
    if not isinstance(attributes, dict):
        raise SqsError("SerializationException", "Attributes: expected a map")
    settings: dict[str, int] = {}
    for raw_name, value in attributes.items():
        # SQS takes "VisibilityTimeout " as "VisibilityTimeout".
        name = raw_name.strip()
        _check_storable("Attributes", name)
        if not isinstance(value, str):
            raise SqsError("SerializationException", f"Attributes.{name}: a string")
        if name == "VisibilityTimeout":
            settings["lease_seconds"] = _attribute_int(
                name, value, 0, store.MAX_LEASE_SECONDS
            )
        elif name == "DelaySeconds":
            settings["delay_seconds"] = _attribute_int(
                name, value, 0, MAX_DELAY_SECONDS
            )
        elif name == "RedrivePolicy":
            settings["max_attempts"] = _max_receive_count(value)
        elif name in FIXED_ATTRIBUTES:
            _check_fixed(name, value)
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    return settings


FIFO_NAME_RULE = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
    "or underscores, must end with .fifo suffix and be 1 to 80 in length."
)


def _fifo_split(
    queue: str, attributes: object, *, creating: bool = False
) -> tuple[Body, dict[str, str]]:
    """Split SQS's FIFO attributes off a queue's others: (the others, the
    FIFO ones but FifoQueue). FifoQueue must agree with the name (a FIFO
    queue's ends in .fifo, and CreateQueue says FifoQueue "true" for it, as
    SQS requires); a standard queue has none of them."""
    if not isinstance(attributes, dict):
        raise SqsError("SerializationException", "Attributes: expected a map")
    fifo = sqs_fifo.is_fifo_name(queue)
    named = {name.strip() for name in attributes if isinstance(name, str)}
    if creating and fifo and "FifoQueue" not in named:
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. "
            "1 to 80 in length"
        )
    rest: Body = {}
    kept: dict[str, str] = {}
    for raw_name, value in attributes.items():
        name = raw_name.strip() if isinstance(raw_name, str) else raw_name
        if name == "FifoQueue":
            if value not in ("true", "false"):
                raise SqsError(
                    "InvalidAttributeValue",
                    "Invalid value for the parameter FifoQueue.",
                )
            if (value == "true") != fifo:
                raise invalid(FIFO_NAME_RULE)
        elif name in sqs_fifo.FIFO_CHOICES:
            if not fifo:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
            if value not in sqs_fifo.FIFO_CHOICES[name]:
                raise SqsError(
                    "InvalidAttributeValue", f"Invalid value for the parameter {name}."
                )
            kept[name] = value
        else:
            if name == "RedrivePolicy":
                _check_dead_letter_type(fifo, value)
            rest[raw_name] = value
    return rest, kept


def _check_dead_letter_type(fifo: bool, value: object) -> None:
    """A RedrivePolicy's deadLetterTargetArn must name a queue of the same
    type, as SQS requires (dead letters stay in their own queue here: the
    target is checked, not used)."""
    try:
        policy = json.loads(value) if isinstance(value, str) and value else None
    except ValueError:
        return  # _max_receive_count answers a malformed policy
    target = policy.get("deadLetterTargetArn") if isinstance(policy, dict) else None
    if isinstance(target, str) and sqs_fifo.is_fifo_name(target) != fifo:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter "
            "queue must be same type of queue as the source.",
        )


def _attribute_int(name: str, value: str, minimum: int, maximum: int) -> int:
    try:
        number: int | None = int(value, 10)
    except ValueError:
        number = None
    if number is None or not minimum <= number <= maximum:
        raise SqsError(
            "InvalidAttributeValue", f"Invalid value for the parameter {name}."
        )
    return number


def _check_fixed(name: str, value: str) -> None:
    limits = {
        "MaximumMessageSize": (1024, 1_048_576),
        "MessageRetentionPeriod": (60, 1_209_600),
        "ReceiveMessageWaitTimeSeconds": (0, MAX_WAIT_SECONDS),
    }
    if name in limits:
        _attribute_int(name, value, *limits[name])
    elif value not in ("true", "false"):
        raise SqsError(
            "InvalidAttributeValue", f"Invalid value for the parameter {name}."
        )


def _max_receive_count(value: str) -> int:
    if value == "":
        # SQS's way to remove a queue's RedrivePolicy.
        return store.UNLIMITED_ATTEMPTS
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict):
        raise SqsError(
            "InvalidAttributeValue", "Value for parameter RedrivePolicy is invalid."
        )
    count = policy.get("maxReceiveCount")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy "
            "does not contain mandatory attribute: maxReceiveCount.",
        )
    if not 1 <= count <= store.MAX_ATTEMPTS_CAP:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: "
            f"maxReceiveCount must be between 1 and {store.MAX_ATTEMPTS_CAP}.",
        )
    return count


def _arn(caller: Caller, name: str) -> str:
    return f"arn:aws:sqs:{caller.region}:{caller.account_id}:{name}"


def _epoch_seconds(moment: datetime) -> str:
    return str(int(moment.timestamp()))


COUNTED_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def _queue_attributes(
    caller: Caller, info: store.QueueInfo, wanted: Sequence[str]
) -> dict[str, str]:
    attributes = {
        "CreatedTimestamp": _epoch_seconds(info.created_at),
        "LastModifiedTimestamp": _epoch_seconds(info.updated_at),
        "QueueArn": _arn(caller, info.name),
        "VisibilityTimeout": str(info.lease_seconds),
        "DelaySeconds": str(info.delay_seconds),
        **FIXED_ATTRIBUTES,
    }
    if info.max_attempts != store.UNLIMITED_ATTEMPTS:
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": _arn(caller, info.name),
                "maxReceiveCount": info.max_attempts,
            },
            separators=(",", ":"),
        )
    if sqs_fifo.is_fifo_name(info.name):
        kept = sqs_fifo.fifo_attributes(caller.scope, info.name) or {}
        attributes["FifoQueue"] = "true"
        attributes.update({**sqs_fifo.FIFO_DEFAULTS, **kept})
    if "All" in wanted or set(wanted) & set(COUNTED_ATTRIBUTES):
        # What a receive could return now; in flight; everything else live
        # (delayed, a retry window, assigned to another worker, paused).
        counts = store.claimable(caller.scope, info.name, CLAIMANT)
        attributes["ApproximateNumberOfMessages"] = str(counts.ready)
        attributes["ApproximateNumberOfMessagesNotVisible"] = str(counts.in_flight)
        attributes["ApproximateNumberOfMessagesDelayed"] = str(counts.waiting)
    return attributes


def _differs(info: store.QueueInfo, settings: dict[str, int]) -> bool:
    current = {
        "lease_seconds": info.lease_seconds,
        "delay_seconds": info.delay_seconds,
        "max_attempts": info.max_attempts,
    }
    return any(current[key] != value for key, value in settings.items())


# --- Queue actions ----------------------------------------------------------


def create_queue(request: SqsRequest, caller: Caller, body: Body) -> Body:
    name = _queue_name(_member(body, "QueueName", str, required=True))
    rest, fifo = _fifo_split(
        name, _member(body, "Attributes", dict) or {}, creating=True
    )
    settings = _settings_from_attributes(rest)
    _member(body, "tags", dict)  # Tags are accepted and not kept (docs/sqs.md).
    if not caller.scope.covers(name):
        raise SqsError(
            "AccessDenied", f"The queue {name!r} is outside this endpoint's grant."
        )
    info, created = store.ensure_queue(
        caller.scope, name, **{**CREATE_DEFAULTS, **settings}
    )
    if sqs_fifo.is_fifo_name(name):
        _make_fifo(caller, name, fifo, created)
    if not created and _differs(info, settings):
        raise SqsError(
            "QueueNameExists",
            "A queue already exists with the same name and a different value "
            "for attribute(s) " + ", ".join(sorted(body.get("Attributes") or {})),
        )
    return {"QueueUrl": queue_url(request, caller, name)}


def _make_fifo(caller: Caller, name: str, given: dict[str, str], created: bool) -> None:
    """Make ``name`` a FIFO queue (one message of a group in flight, its
    attributes kept) when it is new or not yet one. An existing FIFO queue
    asked for other FIFO attributes is refused."""
    scope = _queue_scope(caller, name)
    kept = None if created else sqs_fifo.fifo_attributes(scope, name)
    if kept:
        current = {**sqs_fifo.FIFO_DEFAULTS, **kept}
        changed = sorted(key for key, value in given.items() if current[key] != value)
        if changed:
            raise SqsError(
                "QueueNameExists",
                "A queue already exists with the same name and a different value "
                "for attribute(s) " + ", ".join(changed),
            )
        return
    admission.set_admission(scope, name, group_concurrency=FIFO_GROUP_CONCURRENCY)
    sqs_fifo.set_fifo_attributes(scope, name, given)


def get_queue_url(request: SqsRequest, caller: Caller, body: Body) -> Body:
    name = _member(body, "QueueName", str, required=True)
    owner = _member(body, "QueueOwnerAWSAccountId", str)
    if owner is not None and owner != caller.account_id:
        raise _no_such_queue()
    if not QUEUE_NAME_RE.fullmatch(name) or not caller.scope.covers(name):
        raise _no_such_queue()
    _check_exists(caller, name)
    return {"QueueUrl": queue_url(request, caller, name)}


def list_queues(request: SqsRequest, caller: Caller, body: Body) -> Body:
    prefix = _member(body, "QueueNamePrefix", str) or ""
    limit = _integer(body, "MaxResults", 1, 1000)
    after = _member(body, "NextToken", str)
    if after is not None:
        try:
            after = base64.urlsafe_b64decode(after.encode("ascii")).decode("utf-8")
        except (ValueError, UnicodeError):
            raise invalid("Invalid NextToken value.") from None
    names = sorted(
        info.name
        for info in store.list_queues(caller.scope)
        if QUEUE_NAME_RE.fullmatch(info.name) and info.name.startswith(prefix)
    )
    if after is not None:
        names = [name for name in names if name > after]
    page = names[: limit or 1000]
    out: Body = {}
    if page:
        out["QueueUrls"] = [queue_url(request, caller, name) for name in page]
    if limit is not None and len(names) > len(page):
        out["NextToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
    return out


def get_queue_attributes(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body, must_exist=False)
    wanted = _string_list(body, "AttributeNames")
    for name in wanted:
        if name != "All" and name not in QUEUE_ATTRIBUTES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    info = _existing(caller, queue.name)
    attributes = _queue_attributes(caller, info, wanted)
    if "All" not in wanted:
        attributes = {name: attributes[name] for name in wanted if name in attributes}
    return {"Attributes": attributes} if attributes else {}


def set_queue_attributes(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body)
    attributes = _member(body, "Attributes", dict, required=True)
    rest, fifo = _fifo_split(queue.name, attributes)
    settings = _settings_from_attributes(rest)
    if settings:
        store.update_queue(caller.scope, queue.name, **settings)
    if fifo:
        sqs_fifo.set_fifo_attributes(queue.scope, queue.name, fifo)
    return {}


def purge_queue(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body)
    store.purge_queue(caller.scope, queue.name)
    return {}


def delete_queue(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body)
    store.delete_queue(caller.scope, queue.name)
    return {}


# --- Send -------------------------------------------------------------------


@dataclass(frozen=True)
class Outgoing:
    """A validated message to send, with its MD5s."""

    body: str
    attributes: messages.Attributes
    size: int
    delay_seconds: int | None
    deduplication_id: str | None
    trace_context: tracing.TraceContext | None = None
    group: str | None = None
    # A FIFO queue's DeduplicationScope is messageGroup: the id is the group's.
    dedup_in_group: bool = False
    fifo: bool = False

    def create_args(self, queue: Queue) -> dict[str, Any]:
        return {
            "queue": queue.name,
            "title": messages.title_of(self.body),
            "payload": messages.payload_of(self.body, self.attributes),
            "idempotency_key": _idempotency_key(
                queue.name,
                self.deduplication_id,
                self.group if self.dedup_in_group else None,
            ),
            "delay_seconds": self.delay_seconds,
            "trace_context": self.trace_context,
            "group": self.group,
        }

    def sent(self, todo: store.Todo) -> dict[str, str]:
        out = {
            "MessageId": todo.id,
            "MD5OfMessageBody": messages.md5_of_body(self.body),
        }
        if self.attributes:
            out["MD5OfMessageAttributes"] = messages.md5_of_attributes(self.attributes)
        if self.fifo:
            out["SequenceNumber"] = _sequence_number(todo)
        return out


def _actor(caller: Caller) -> str:
    return f"sqs:{caller.endpoint.name}"


# A MessageDeduplicationId is scoped to its queue, as in SQS, while a todo's
# idempotency key is scoped to its endpoint: the key is stored under the
# queue's name (no queue name holds a ":" or a "#"), and under its group too
# in a FIFO queue whose DeduplicationScope is messageGroup.
def _idempotency_key(
    queue: str, deduplication_id: str | None, group: str | None = None
) -> str | None:
    if deduplication_id is None:
        return None
    if group is not None:
        return f"sqs:{queue}#{group}:{deduplication_id}"
    return f"sqs:{queue}:{deduplication_id}"


def _deduplication_id(todo: store.Todo) -> str | None:
    key = todo.idempotency_key
    if key is None:
        return None
    in_group = f"sqs:{todo.queue}#{todo.group}:"
    if todo.group is not None and key.startswith(in_group):
        return key.removeprefix(in_group)
    return key.removeprefix(f"sqs:{todo.queue}:")


def _sequence_number(todo: store.Todo) -> str:
    """A FIFO message's SequenceNumber: the microsecond its send made it, 20
    digits. Within a group it grows in the order the group is received."""
    moment = todo.created_at
    micros = int(moment.timestamp()) * 1_000_000 + moment.microsecond
    return f"{micros:020d}"


MISSING_GROUP = "The request must contain the parameter MessageGroupId."
NO_DEDUPLICATION = (
    "The queue should either have ContentBasedDeduplication enabled "
    "or MessageDeduplicationId provided explicitly"
)


def _message_group(entry: Body, fifo: bool) -> str | None:
    """A message's MessageGroupId: required on a FIFO queue; on a standard
    queue optional (SQS's fair queues), and either way the todo's group."""
    group = _member(entry, "MessageGroupId", str)
    if group is None:
        if fifo:
            raise SqsError("MissingParameter", MISSING_GROUP)
        return None
    if not DEDUPLICATION_ID_RE.fullmatch(group):
        raise invalid("MessageGroupId: 1 to 128 printable ASCII characters")
    return group


def _outgoing(entry: Body, fifo: dict[str, str] | None = None) -> Outgoing:
    """Validate one message (SendMessage's, or a batch entry) for a standard
    queue, or for a FIFO queue with these attributes; its size is checked by
    the caller: a batch checks the sum of its entries first."""
    body, size = messages.clean_body(entry.get("MessageBody"))
    attributes, attributes_size = messages.clean_attributes(
        entry.get("MessageAttributes")
    )
    size += attributes_size
    delay = _integer(entry, "DelaySeconds", 0, MAX_DELAY_SECONDS)
    dedup = _member(entry, "MessageDeduplicationId", str)
    if dedup is not None and not DEDUPLICATION_ID_RE.fullmatch(dedup):
        raise invalid("MessageDeduplicationId: 1 to 128 printable ASCII characters")
    group = _message_group(entry, fifo is not None)
    # MessageSystemAttributes' AWSTraceHeader is the trace context.
    system = _member(entry, "MessageSystemAttributes", dict)
    trace_context = _trace_context(system, attributes)
    if fifo is None:
        return Outgoing(body, attributes, size, delay, dedup, trace_context, group)
    if delay:
        # A FIFO queue delays its messages as a whole, never one by one.
        raise invalid(
            f"Value {delay} for parameter DelaySeconds is invalid. Reason: "
            + NOT_FOR_THIS_QUEUE_TYPE
        )
    if dedup is None:
        if fifo.get("ContentBasedDeduplication") != "true":
            raise invalid(NO_DEDUPLICATION)
        dedup = hashlib.sha256(body.encode("utf-8")).hexdigest()
    in_group = fifo.get("DeduplicationScope") == "messageGroup"
    return Outgoing(
        body, attributes, size, None, dedup, trace_context, group, in_group, True
    )


def _trace_context(
    system: Body | None, attributes: messages.Attributes
) -> tracing.TraceContext | None:
    """The W3C context a message carries (todos.telemetry.tracing): its AWSTraceHeader
    (X-Ray's format), else its traceparent attribute; a malformed one is
    ignored, as SQS passes on what it cannot read."""
    header = (system or {}).get(tracing.AWS_TRACE_HEADER)
    if isinstance(header, dict):
        context = tracing.from_xray(header.get("StringValue"))
        if context is not None:
            return context
    carried = attributes.get(tracing.TRACEPARENT)
    if carried is None:
        return None
    state = attributes.get(tracing.TRACESTATE) or {}
    return tracing.parse(carried.get("StringValue"), state.get("StringValue"))


def _trace_attributes(carrier: dict[str, str]) -> dict[str, Any]:
    """A claim's trace context as the message attributes it is received with."""
    return {
        name: {"DataType": "String", "StringValue": value}
        for name, value in carrier.items()
    }


def _create_failure(exc: Exception) -> Exception:
    if isinstance(exc, store.KeyHeld):
        # Only a key made outside SQS can be held by another queue's todo.
        return invalid(
            "MessageDeduplicationId: a live todo of another queue holds this id"
        )
    if isinstance(exc, store.Conflict):
        return invalid(f"MessageDeduplicationId: {exc.detail}")
    if isinstance(exc, store.BudgetExhausted):
        return SqsError("BudgetExhausted", exc.detail)
    return exc


async def _fifo_of(caller: Caller, queue: Queue) -> dict[str, str] | None:
    """A FIFO queue's attributes (SQS's defaults under those kept), None for
    a standard queue; either way the queue must exist."""
    if not sqs_fifo.is_fifo_name(queue.name):
        await _acheck_exists(caller, queue.name)
        return None
    kept = await sqs_fifo.afifo_attributes(queue.scope, queue.name)
    if kept is None:
        raise _no_such_queue()
    return {**sqs_fifo.FIFO_DEFAULTS, **kept}


async def send_message(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body, must_exist=False)
    outgoing = _outgoing(body, await _fifo_of(caller, queue))
    messages.check_size(outgoing.size)
    try:
        todo, _ = await store.acreate_todo(
            queue.scope, **outgoing.create_args(queue), actor=_actor(caller)
        )
    except (store.Conflict, store.BudgetExhausted) as exc:
        raise _create_failure(exc) from None
    return outgoing.sent(todo)


def _entries(body: Body, entry_shape: str) -> list[Body]:
    """Validate a batch's Entries: 1 to 10, well-formed and distinct ids."""
    entries = _member(body, "Entries", list, required=True)
    if not entries:
        raise SqsError(
            "EmptyBatchRequest",
            f"There should be at least one {entry_shape} in the request.",
        )
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. "
            f"You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise SqsError("SerializationException", "Entries: expected structures")
        entry_id = entry.get("Id")
        if not isinstance(entry_id, str) or not BATCH_ENTRY_ID_RE.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens "
                "and underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failed(entry_id: str, error: SqsError) -> Body:
    return {
        "Id": entry_id,
        "SenderFault": True,
        "Code": error.shape,
        "Message": error.message,
    }


def _entry_failure(entry_id: str, result: Exception) -> Body:
    """The Failed item of an entry the store refused (never raised: by then
    other entries may be applied, and a 500 would make the client send them
    all again)."""
    if isinstance(result, SqsError):
        return _failed(entry_id, result)
    logger.error(
        "sqs: a batch entry failed in the store",
        extra={"fields": {"error": type(result).__name__}},
    )
    return {
        "Id": entry_id,
        "SenderFault": False,
        "Code": "InternalError",
        "Message": "The entry could not be applied; send it again.",
    }


async def send_message_batch(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body, must_exist=False)
    fifo = await _fifo_of(caller, queue)
    entries = _entries(body, "SendMessageBatchRequestEntry")
    prepared: list[tuple[str, Outgoing]] = []
    failed: list[Body] = []
    total = 0
    for entry in entries:
        try:
            outgoing = _outgoing(entry, fifo)
        except SqsError as error:
            # A FIFO batch without a group or a deduplication id is refused
            # whole, before any entry is sent.
            if error.message in (MISSING_GROUP, NO_DEDUPLICATION):
                raise
            failed.append(_failed(entry["Id"], error))
            continue
        total += outgoing.size
        prepared.append((entry["Id"], outgoing))
    # The whole batch is refused when its messages together are too long
    # (one entry over the limit among them), as SQS does; each entry then
    # fits on its own.
    if total > messages.MAX_MESSAGE_BYTES:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {messages.MAX_MESSAGE_BYTES} "
            f"bytes. You have sent {total} bytes.",
        )
    successful: list[Body] = []
    if prepared:
        # Every entry was validated above; the answer is built before the
        # commit, so nothing that follows the commit can fail.
        async with pool.transaction() as tx:
            creates = store.create_many_steps(
                queue.scope,
                [outgoing.create_args(queue) for _, outgoing in prepared],
                actor=_actor(caller),
            )
            results = await store.arun_steps(creates, tx)
            for (entry_id, outgoing), result in zip(prepared, results, strict=True):
                if isinstance(result, Exception):
                    failed.append(_entry_failure(entry_id, _create_failure(result)))
                else:
                    successful.append({"Id": entry_id, **outgoing.sent(result[0])})
    return {"Successful": successful, "Failed": failed}


# --- Receive ----------------------------------------------------------------


def _epoch_millis(moment: datetime) -> str:
    return str(int(moment.timestamp() * 1000))


def _system_attributes(
    caller: Caller, todo: store.Todo, wanted: set[str]
) -> dict[str, str]:
    if not wanted:
        return {}
    assert todo.claimed_at is not None  # a received todo is claimed
    values = {
        "SenderId": caller.account_id,
        "SentTimestamp": _epoch_millis(todo.created_at),
        "ApproximateReceiveCount": str(todo.attempt),
        # The first receive's time is not kept apart: this receive's time.
        "ApproximateFirstReceiveTimestamp": _epoch_millis(todo.claimed_at),
    }
    deduplication_id = _deduplication_id(todo)
    if deduplication_id is not None:
        values["MessageDeduplicationId"] = deduplication_id
    context = tracing.claim_context(todo)
    if context is not None:
        values["AWSTraceHeader"] = tracing.to_xray(context)
    if todo.group is not None:
        values["MessageGroupId"] = todo.group
    if sqs_fifo.is_fifo_name(todo.queue):
        values["SequenceNumber"] = _sequence_number(todo)
    if "All" in wanted:
        return values
    return {name: values[name] for name in wanted if name in values}


def _selected_attributes(
    attributes: dict[str, Any], wanted: set[str]
) -> dict[str, Any]:
    if not wanted or not attributes:
        return {}
    if "All" in wanted or ".*" in wanted:
        return attributes
    # "bar.*" selects the names that start with "bar".
    prefixes = tuple(name[:-2] for name in wanted if name.endswith(".*"))
    return {
        name: value
        for name, value in attributes.items()
        if name in wanted or (prefixes and name.startswith(prefixes))
    }


def _received(
    caller: Caller,
    todo: store.Todo,
    system_wanted: set[str],
    attributes_wanted: set[str],
) -> Body:
    body, attributes = messages.body_and_attributes(todo.payload)
    carrier = todo.trace_carrier()
    if carrier is not None:
        # The claim's trace context rides along (CONTRACT §19).
        attributes = {**attributes, **_trace_attributes(carrier)}
    message: Body = {
        "MessageId": todo.id,
        "ReceiptHandle": messages.receipt_handle(todo),
        "MD5OfBody": messages.md5_of_body(body),
        "Body": body,
    }
    system = _system_attributes(caller, todo, system_wanted)
    if system:
        message["Attributes"] = system
    selected = _selected_attributes(attributes, attributes_wanted)
    if selected:
        message["MD5OfMessageAttributes"] = messages.md5_of_attributes(selected)
        message["MessageAttributes"] = selected
    return message


async def receive_message(request: SqsRequest, caller: Caller, body: Body) -> "Receive":
    """ReceiveMessage: a batch claim that may wait (``Receive``, a long poll)."""
    queue = _addressed(caller, body, must_exist=False)
    return Receive(
        caller,
        queue,
        limit=_integer(body, "MaxNumberOfMessages", 1, MAX_BATCH_ENTRIES) or 1,
        visibility=_integer(body, "VisibilityTimeout", 0, store.MAX_LEASE_SECONDS),
        wait=_integer(body, "WaitTimeSeconds", 0, MAX_WAIT_SECONDS) or 0,
        system_wanted=set(_string_list(body, "AttributeNames"))
        | set(_string_list(body, "MessageSystemAttributeNames")),
        attributes_wanted=set(_string_list(body, "MessageAttributeNames")),
    )


@dataclass
class Receive:
    """A ReceiveMessage, read and checked; the view claims it as a long poll
    (todos.waiting.longpoll) and renders what it claimed."""

    caller: Caller
    queue: Queue
    limit: int
    visibility: int | None
    wait: int
    system_wanted: set[str]
    attributes_wanted: set[str]
    # The queue's existence is checked only when nothing is claimed: a claim
    # in a queue that does not exist claims nothing, and the hot path (work
    # to take) saves a statement.
    checked: bool = False

    async def attempt(self, scope: store.Scope) -> list[store.Todo]:
        claimed = await store.aclaim_many(
            scope,
            CLAIMANT,
            limit=self.limit,
            queue=self.queue.name,
            # VisibilityTimeout 0: received, and visible again at once (SQS's
            # own meaning); the receipt handle works until someone receives it.
            lease_seconds=self.visibility or None,
            visible_at_once=self.visibility == 0,
        )
        if not claimed and not self.checked:
            await _acheck_exists(self.caller, self.queue.name)
            self.checked = True
        return claimed

    async def revalidate(self) -> store.Scope:
        """A revoked endpoint or a rotated key ends the wait; so does a grant
        that no longer covers the queue."""
        found = await auth.aendpoint_for_access_key(self.caller.access_key_id)
        if found is None:
            raise SqsError(
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            )
        if not store.Scope.for_endpoint(found[0]).covers(self.queue.name):
            raise _no_such_queue()
        return self.queue.scope

    def render(self, claimed: Iterable[store.Todo]) -> Body:
        if not claimed:
            return {}
        return {
            "Messages": [
                _received(self.caller, todo, self.system_wanted, self.attributes_wanted)
                for todo in claimed
            ]
        }


# --- Delete and visibility --------------------------------------------------

# DeleteMessage with a handle whose lease is over (the message was received
# again, or deleted already) deletes nothing and succeeds, as SQS documents.
STALE = (store.NotFound, store.Conflict)


async def _handle_of(caller: Caller, queue: Queue, body: Body) -> tuple[str, str]:
    """The todo id and lease token of a single call's ReceiptHandle. A
    malformed one is a missing queue's error first, when the queue is missing
    (as SQS answers)."""
    try:
        return messages.parse_receipt_handle(
            _member(body, "ReceiptHandle", str, required=True)
        )
    except SqsError as error:
        if error.shape != "ReceiptHandleIsInvalid":
            raise
        await _acheck_exists(caller, queue.name)
        raise SqsError(
            "ReceiptHandleIsInvalid", "The input receipt handle is invalid."
        ) from None


async def _in_another_queue(caller: Caller, todo_id: str, on: Runner = db) -> bool:
    """Say whether a todo not found in the addressed queue is in another one of
    the endpoint (its handle is then invalid here, not stale)."""
    endpoint = store.Scope(caller.scope.endpoint_id)
    try:
        await store.arun_steps(store.get_todo_steps(endpoint, todo_id), on)
    except store.NotFound:
        return False
    return True


def _handle_of_another_queue() -> SqsError:
    return SqsError(
        "ReceiptHandleIsInvalid",
        "The input receipt handle is of a message in another queue.",
    )


async def delete_message(request: SqsRequest, caller: Caller, body: Body) -> Body:
    queue = _addressed(caller, body, must_exist=False)
    todo_id, token = await _handle_of(caller, queue, body)
    try:
        await store.acomplete_todo(queue.scope, todo_id, None, lease_token=token)
    except store.NotFound:
        # Stale (the message is gone), unless there is no such queue at all
        # or the handle is another queue's.
        await _acheck_exists(caller, queue.name)
        if await _in_another_queue(caller, todo_id):
            raise _handle_of_another_queue() from None
    except store.Conflict:
        pass
    return {}


async def delete_message_batch(request: SqsRequest, caller: Caller, body: Body) -> Body:
    def action(entry: Body) -> store.Ack:
        todo_id, token = messages.parse_receipt_handle(entry.get("ReceiptHandle"))
        return store.Ack("complete", todo_id, lease_token=token)

    async def failure(
        result: store.Todo | Exception, todo_id: str, on: Runner
    ) -> Exception | None:
        if isinstance(result, store.NotFound) and await _in_another_queue(
            caller, todo_id, on
        ):
            return _handle_of_another_queue()
        # A stale handle deletes nothing and succeeds, as DeleteMessage does.
        if isinstance(result, Exception) and not isinstance(result, STALE):
            return result
        return None

    return await _acknowledge_batch(
        caller, body, "DeleteMessageBatchRequestEntry", action, failure
    )


# What a batch entry's result fails with (``_acknowledge_batch``), read on
# the batch's transaction.
type Failure = Callable[
    [store.Todo | Exception, str, Runner], Awaitable[Exception | None]
]


async def _acknowledge_batch(
    caller: Caller,
    body: Body,
    member: str,
    action: Callable[[Body], store.Ack],
    failure: Failure,
) -> Body:
    """The batch acknowledgements' shared run: one store action per entry
    (``action(entry)``, or the entry fails with its SqsError), applied in one
    statement; ``failure(result, todo_id, tx)`` returns what an entry fails with
    (an SqsError, or another exception: an internal failure), None for a
    success. Every entry is validated first and the answer is built before
    the commit, so nothing that follows the commit can fail.
    """
    queue = _addressed(caller, body, must_exist=False)
    actions: list[store.Ack] = []
    ids: list[str] = []
    failed: list[Body] = []
    for entry in _entries(body, member):
        try:
            actions.append(action(entry))
        except SqsError as error:
            failed.append(_failed(entry["Id"], error))
            continue
        ids.append(entry["Id"])
    successful: list[Body] = []
    if not actions:
        await _acheck_exists(caller, queue.name)
        return {"Successful": successful, "Failed": failed}
    async with pool.transaction() as tx:
        acknowledged = store.acknowledge_many_steps(queue.scope, actions)
        results = await store.arun_steps(acknowledged, tx)
        if any(isinstance(result, store.NotFound) for result in results):
            # A todo not found may mean no such queue: look once, only then.
            await _acheck_exists(caller, queue.name, tx)
        for entry_id, ack, result in zip(ids, actions, results, strict=True):
            refused = await failure(result, ack.todo_id, tx)
            if refused is None:
                successful.append({"Id": entry_id})
            else:
                failed.append(_entry_failure(entry_id, refused))
    return {"Successful": successful, "Failed": failed}


def _visibility_error(exc: Exception) -> Exception:
    if isinstance(exc, store.NotFound):
        return SqsError(
            "ReceiptHandleIsInvalid", "The input receipt handle is invalid."
        )
    if isinstance(exc, store.Conflict):
        return SqsError("MessageNotInflight", "The message is not in flight.")
    return exc


def _visibility_ack(todo_id: str, token: str, timeout: int) -> store.Ack:
    if timeout == 0:
        return store.Ack("release", todo_id, lease_token=token)
    return store.Ack("heartbeat", todo_id, lease_token=token, lease_seconds=timeout)


async def change_message_visibility(
    request: SqsRequest, caller: Caller, body: Body
) -> Body:
    queue = _addressed(caller, body, must_exist=False)
    todo_id, token = await _handle_of(caller, queue, body)
    timeout = _member(body, "VisibilityTimeout", int, required=True)
    _integer(body, "VisibilityTimeout", 0, store.MAX_LEASE_SECONDS)
    try:
        if timeout == 0:
            await store.arelease_todo(queue.scope, todo_id, None, lease_token=token)
        else:
            await store.aheartbeat(
                queue.scope, todo_id, None, lease_seconds=timeout, lease_token=token
            )
    except (store.NotFound, store.Conflict) as exc:
        if isinstance(exc, store.NotFound):
            await _acheck_exists(caller, queue.name)
        raise _visibility_error(exc) from None
    return {}


async def change_message_visibility_batch(
    request: SqsRequest, caller: Caller, body: Body
) -> Body:
    def action(entry: Body) -> store.Ack:
        todo_id, token = messages.parse_receipt_handle(entry.get("ReceiptHandle"))
        timeout = _member(entry, "VisibilityTimeout", int, required=True)
        _integer(entry, "VisibilityTimeout", 0, store.MAX_LEASE_SECONDS)
        return _visibility_ack(todo_id, token, timeout)

    async def failure(
        result: store.Todo | Exception, todo_id: str, on: Runner
    ) -> Exception | None:
        if not isinstance(result, Exception):
            return None
        return _visibility_error(result)

    return await _acknowledge_batch(
        caller, body, "ChangeMessageVisibilityBatchRequestEntry", action, failure
    )


# An action: its response members, or the Receive the view claims (a long
# poll). The agent's hot path (send, receive, delete, visibility) is async,
# awaited in the event loop on the async store; the queue administration is
# sync, run in a pooled thread on Django's connection.
type Action = Callable[[SqsRequest, Caller, Body], "Body | Receive"]
type AsyncAction = Callable[[SqsRequest, Caller, Body], Awaitable["Body | Receive"]]

ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "DeleteQueue": delete_queue,
}
ASYNC_ACTIONS: dict[str, AsyncAction] = {
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
}
# SQS actions Switchboard does not offer (permissions, tags, DLQ moves).
UNSUPPORTED = (
    "AddPermission",
    "RemovePermission",
    "TagQueue",
    "UntagQueue",
    "ListQueueTags",
    "ListDeadLetterSourceQueues",
    "StartMessageMoveTask",
    "CancelMessageMoveTask",
    "ListMessageMoveTasks",
)
