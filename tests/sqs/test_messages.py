"""Messages as todos: exact MD5s, receipt handles, the payload and its body.

The expected MD5OfMessageAttributes values are the ones moto's SQS tests
(getmoto/moto, tests/test_sqs/test_sqs.py) assert for the same attributes.
"""

import base64
import uuid

import pytest

from todos.sqs import messages
from todos.sqs.protocol import SqsError


def test_md5_of_body_is_the_md5_of_its_utf8():
    assert messages.md5_of_body("derp") == "58fd9edd83341c29f1aebba81c31e257"


@pytest.mark.parametrize(
    "attributes, expected",
    [
        (
            {
                "SOME_Valid.attribute-Name": {
                    "StringValue": "1493147359900",
                    "DataType": "Number",
                }
            },
            "36655e7e9d7c0e8479fa3f3f42247ae7",
        ),
        (
            {
                "id": {
                    "StringValue": "2018fc74-4f77-1a5a-1be0-c2d037d5052b",
                    "DataType": "String",
                },
                "contentType": {
                    "StringValue": "application/json",
                    "DataType": "String",
                },
                "timestamp": {
                    "StringValue": "1602845432024",
                    "DataType": "Number.java.lang.Long",
                },
            },
            "b12289320bb6e494b18b645ef562b4a9",
        ),
        (
            {
                "id": {
                    "StringValue": "453ae55e-f03b-21a6-a4b1-70c2e2e8fe71",
                    "DataType": "String",
                },
                "mybin": {
                    "BinaryValue": base64.b64encode(b"kekchebukek").decode(),
                    "DataType": "Binary",
                },
                "timestamp": {
                    "StringValue": "1603134247654",
                    "DataType": "Number.java.lang.Long",
                },
                "contentType": {
                    "StringValue": "application/json",
                    "DataType": "String",
                },
            },
            "049075255ebc53fb95f7f9f3cedf3c50",
        ),
        (
            {
                "timestamp": {
                    "DataType": "Number.java.lang.Long",
                    "StringValue": "1493147359900",
                }
            },
            "2e2e4876d8e0bd6b8c2c8f556831c349",
        ),
    ],
)
def test_md5_of_message_attributes_is_sqs_own(attributes, expected):
    cleaned, _ = messages.clean_attributes(attributes)
    assert messages.md5_of_attributes(cleaned) == expected


def test_a_receipt_handle_carries_the_todo_id_and_lease_token():
    class Claimed:
        id = str(uuid.uuid4())
        lease_token = "tok_ABC-123"

    handle = messages.receipt_handle(Claimed)
    assert messages.parse_receipt_handle(handle) == (Claimed.id, "tok_ABC-123")


@pytest.mark.parametrize("spelling", [str.upper, lambda id: f"{{{id}}}"])
def test_a_handle_that_spells_its_todo_id_otherwise_names_the_same_todo(spelling):
    todo_id = str(uuid.uuid4())
    raw = f"{spelling(todo_id)}:tok".encode()
    handle = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert messages.parse_receipt_handle(handle) == (todo_id, "tok")


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "not base64 !",
        base64.urlsafe_b64encode(f"{uuid.uuid4()}x:tok".encode()).decode(),
        base64.urlsafe_b64encode(b"not-a-uuid:token").decode(),
        base64.urlsafe_b64encode(f"{uuid.uuid4()}:".encode()).decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        "x" * 2000,
        None,
        42,
    ],
)
def test_a_malformed_receipt_handle_is_receipt_handle_is_invalid(handle):
    with pytest.raises(SqsError) as caught:
        messages.parse_receipt_handle(handle)
    assert caught.value.shape == "ReceiptHandleIsInvalid"


def test_an_sqs_payload_round_trips_body_and_attributes():
    attributes = {"a": {"DataType": "String", "StringValue": "1"}}
    payload = messages.payload_of("hello\nworld", attributes)
    assert messages.body_and_attributes(payload) == ("hello\nworld", attributes)


def test_an_api_payload_is_received_as_compact_json():
    body, attributes = messages.body_and_attributes({"b": [1, 2], "a": "é"})
    assert body == '{"b":[1,2],"a":"é"}' and attributes == {}


def test_readable_body_pretty_prints_json_and_leaves_text_alone():
    assert (
        messages.readable_body(messages.payload_of('{"a":1}', {})) == '{\n  "a": 1\n}'
    )
    assert messages.readable_body(messages.payload_of("plain text", {})) == "plain text"
    assert messages.readable_body({"body": "x"}) is None


@pytest.mark.parametrize("body", ["", "bad \x00 char", "lone \ud800 surrogate", 5])
def test_an_invalid_body_is_refused(body):
    with pytest.raises(SqsError) as caught:
        messages.clean_body(body)
    assert caught.value.shape in {"InvalidParameterValue", "InvalidMessageContents"}


@pytest.mark.parametrize(
    "attributes",
    [
        {"AWS.reserved": {"DataType": "String", "StringValue": "x"}},
        {"öther": {"DataType": "String", "StringValue": "x"}},
        {"a..b": {"DataType": "String", "StringValue": "x"}},
        {"a": {"DataType": "Text", "StringValue": "x"}},
        {"a": {"DataType": "String", "StringValue": ""}},
        {"a": {"DataType": "Number", "StringValue": "twelve"}},
        {"a": {"DataType": "Binary", "BinaryValue": "!!"}},
        {f"a{i}": {"DataType": "String", "StringValue": "x"} for i in range(11)},
    ],
)
def test_invalid_message_attributes_are_refused(attributes):
    with pytest.raises(SqsError) as caught:
        messages.clean_attributes(attributes)
    assert caught.value.shape == "InvalidParameterValue"


def test_a_message_over_1_mib_is_refused():
    _, size = messages.clean_body("x" * (messages.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(SqsError, match="shorter than 1048576"):
        messages.check_size(size)
