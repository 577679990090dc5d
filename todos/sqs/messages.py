"""SQS messages as todos: payload shape, attributes, MD5s and receipt handles.

A message sent over SQS becomes a todo whose payload is
``{"sqs_message": {"body": "<Body>", "message_attributes": {...}}}``: the body
and its attributes round-trip exactly, and the Board can show the body apart
(pretty-printed when it is JSON). Any other todo (one created by the JSON API)
is received with its payload as compact JSON in ``Body``.

A receipt handle is ``base64url("<todo id>:<lease token>")``: new on every
receive, since every claim mints a lease token, so a handle from an earlier
receive is superseded and deletes nothing.
"""

import base64
import binascii
import hashlib
import json
import re
import struct
import uuid
from typing import Any

from todos import store
from todos.sqs.protocol import SqsError, invalid

PAYLOAD_KEY = "sqs_message"
# SQS raised its limit from 256 KiB to 1 MiB in 2025.
MAX_MESSAGE_BYTES = 1_048_576
MAX_ATTRIBUTES = 10
# Matched against the whole string (fullmatch): "$" lets a trailing newline by.
ATTRIBUTE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
DATA_TYPE_RE = re.compile(r"(String|Number|Binary)(\.[^\s]{1,255})?")
# A receipt handle's lease token (the store's are 32 hex digits).
LEASE_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
# A todo id as the store writes it, and so as every handle minted here holds it.
CANONICAL_UUID_RE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
# The characters SQS accepts in a body or a string attribute (XML 1.0's).
INVALID_CHARACTER_RE = re.compile(
    "[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)
TITLE_LENGTH = 120

# Message attributes by name, each {"DataType", "StringValue" | "BinaryValue"}.
type Attributes = dict[str, dict[str, str]]


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_of_body(body: str) -> str:
    return md5_hex(body.encode("utf-8"))


def md5_of_attributes(attributes: Attributes) -> str:
    """The MD5 of message attributes, as AWS documents it and SDKs check it.

    For each attribute by name: the name, the data type and the value, each
    as a 4-byte big-endian length and its UTF-8 bytes, the value preceded by a
    transport byte (1 = string, 2 = binary).
    """
    digest = hashlib.md5(usedforsecurity=False)

    def part(data: bytes) -> None:
        digest.update(struct.pack(">I", len(data)))
        digest.update(data)

    for name in sorted(attributes):
        attribute = attributes[name]
        data_type = attribute["DataType"]
        part(name.encode("utf-8"))
        part(data_type.encode("utf-8"))
        if data_type.startswith("Binary"):
            digest.update(b"\x02")
            part(base64.b64decode(attribute["BinaryValue"]))
        else:
            digest.update(b"\x01")
            part(attribute["StringValue"].encode("utf-8"))
    return digest.hexdigest()


def check_text(value: str, what: str) -> None:
    if INVALID_CHARACTER_RE.search(value):
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid characters found in the {what}: only #x9 | #xA | #xD | "
            "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF are allowed.",
        )


def clean_attributes(raw: object) -> tuple[Attributes, int]:
    """Validate MessageAttributes; return them in a canonical form and their size."""
    if raw is None:
        return {}, 0
    if not isinstance(raw, dict):
        raise invalid("MessageAttributes must be a map of name to attribute value")
    if len(raw) > MAX_ATTRIBUTES:
        raise invalid(
            f"Number of message attributes [{len(raw)}] exceeds the allowed "
            f"maximum [{MAX_ATTRIBUTES}]."
        )
    cleaned: Attributes = {}
    size = 0
    for name, attribute in raw.items():
        if (
            not isinstance(name, str)
            or not ATTRIBUTE_NAME_RE.fullmatch(name)
            or name.startswith((".", "AWS.", "Amazon."))
            or name.endswith(".")
            or ".." in name
        ):
            raise invalid(
                f"The message attribute name '{name}' is invalid. Attribute name "
                "can contain A-Z, a-z, 0-9, underscore (_), hyphen (-), and period "
                "(.) characters."
            )
        if not isinstance(attribute, dict):
            raise invalid(f"The message attribute '{name}' must be a structure.")
        data_type = attribute.get("DataType")
        if (
            not isinstance(data_type, str)
            or not DATA_TYPE_RE.fullmatch(data_type)
            or INVALID_CHARACTER_RE.search(data_type)
        ):
            raise invalid(
                f"The message attribute '{name}' has an invalid message attribute "
                "type, the set of supported type prefixes is Binary, Number, and "
                "String."
            )
        value = {"DataType": data_type}
        if data_type.startswith("Binary"):
            binary = attribute.get("BinaryValue")
            try:
                decoded = base64.b64decode(binary or "", validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise invalid(
                    f"The message attribute '{name}' has an invalid binary value."
                ) from None
            if not decoded:
                raise invalid(
                    f"The message attribute '{name}' must contain non-empty message "
                    "attribute value for message attribute type 'Binary'."
                )
            value["BinaryValue"] = base64.b64encode(decoded).decode("ascii")
            size += len(decoded)
        else:
            text = attribute.get("StringValue")
            if not isinstance(text, str) or not text:
                raise invalid(
                    f"The message attribute '{name}' must contain non-empty message "
                    f"attribute value for message attribute type '{data_type}'."
                )
            check_text(text, f"message attribute '{name}'")
            if data_type.startswith("Number"):
                _check_number(name, text)
            value["StringValue"] = text
            size += len(text.encode("utf-8"))
        size += len(name.encode("utf-8")) + len(data_type.encode("utf-8"))
        cleaned[name] = value
    return cleaned, size


def _check_number(name: str, text: str) -> None:
    try:
        number: float | None = float(text)
    except ValueError:
        number = None
    if number is None or number != number or abs(number) == float("inf"):
        raise invalid(
            f"Can't cast the value of message (user) attribute '{name}' to a number."
        )


def clean_body(body: object) -> tuple[str, int]:
    """Validate a MessageBody; return it and its size in bytes."""
    if body is None:
        raise SqsError(
            "MissingParameter", "The request must contain the parameter MessageBody."
        )
    if not isinstance(body, str):
        raise invalid("MessageBody must be a string")
    if not body:
        raise invalid("The request must contain a non-empty message body.")
    check_text(body, "message body")
    return body, len(body.encode("utf-8"))


def check_size(size: int) -> None:
    if size > MAX_MESSAGE_BYTES:
        raise invalid(
            "One or more parameters are invalid. Reason: Message must be shorter "
            f"than {MAX_MESSAGE_BYTES} bytes."
        )


def payload_of(body: str, attributes: Attributes) -> dict[str, Any]:
    message: dict[str, Any] = {"body": body}
    if attributes:
        message["message_attributes"] = attributes
    return {PAYLOAD_KEY: message}


def title_of(body: str) -> str:
    """A short, readable title for the Board: the body's first line."""
    first = " ".join(body.strip().split("\n", 1)[0].split())
    return first[: TITLE_LENGTH - 1] + "…" if len(first) > TITLE_LENGTH else first


def sqs_message(payload: object) -> dict[str, Any] | None:
    """Return the {"body", "message_attributes"} of an SQS payload, or None."""
    if not isinstance(payload, dict) or set(payload) != {PAYLOAD_KEY}:
        return None
    message = payload[PAYLOAD_KEY]
    if not isinstance(message, dict) or not isinstance(message.get("body"), str):
        return None
    attributes = message.get("message_attributes") or {}
    if not isinstance(attributes, dict):
        return None
    return {"body": message["body"], "message_attributes": attributes}


def body_and_attributes(payload: object) -> tuple[str, dict[str, Any]]:
    """The Body and MessageAttributes a todo is received with."""
    message = sqs_message(payload)
    if message is not None:
        return message["body"], message["message_attributes"]
    compact = json.dumps(
        {} if payload is None else payload, separators=(",", ":"), ensure_ascii=False
    )
    return compact, {}


def readable_body(payload: object) -> str | None:
    """The body of an SQS todo for a person (pretty JSON when it parses), or None."""
    message = sqs_message(payload)
    if message is None:
        return None
    body: str = message["body"]
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if isinstance(parsed, dict | list):
        return json.dumps(parsed, indent=2, ensure_ascii=False)
    return body


# --- Receipt handles ------------------------------------------------------------


def receipt_handle(todo: store.Todo) -> str:
    raw = f"{todo.id}:{todo.lease_token}".encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_receipt_handle(handle: object) -> tuple[str, str]:
    """Return (todo id, lease token) of a handle, or raise ReceiptHandleIsInvalid."""
    if not isinstance(handle, str) or not handle or len(handle) > 1024:
        raise _invalid_handle(handle)
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        todo_id, _, token = raw.decode("ascii").partition(":")
        if not CANONICAL_UUID_RE.fullmatch(todo_id):
            # Another spelling uuid.UUID reads (upper case, braces): its
            # canonical form, as the store compares it.
            todo_id = str(uuid.UUID(todo_id))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _invalid_handle(handle) from None
    if not LEASE_TOKEN_RE.fullmatch(token):
        raise _invalid_handle(handle)
    return todo_id, token


def _invalid_handle(handle: object) -> SqsError:
    shown = handle if isinstance(handle, str) and len(handle) <= 100 else "…"
    return SqsError(
        "ReceiptHandleIsInvalid",
        f'The input receipt handle "{shown}" is not a valid receipt handle.',
    )
