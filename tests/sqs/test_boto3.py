"""The SQS surface driven by boto3, unchanged, against a real gunicorn (CONTRACT §11).

Every action, the documented error paths (both ``client.exceptions.<Shape>``
and the legacy ``Error.Code``), batches with mixed outcomes, visibility, long
polling, delays, attributes, and isolation between endpoints.
"""

import base64
import hashlib
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import botocore.auth
import pytest
from botocore.exceptions import ClientError
from django.db import connection
from django.utils import timezone

from tests.sqs.conftest import client_for
from todos import store
from todos.sqs import credentials

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


@pytest.fixture
def sqs(make_sqs):
    return make_sqs()


@pytest.fixture
def client(sqs):
    return sqs[2]


@pytest.fixture
def queue_url(client):
    return client.create_queue(QueueName="jobs")["QueueUrl"]


def error_of(call, *args, **kwargs):
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


def scope_of(endpoint):
    return store.Scope.for_endpoint(endpoint)


# --- Queues -----------------------------------------------------------------


def test_create_queue_answers_the_accounts_queue_url(sqs, sqs_url):
    _, issued, client = sqs
    url = client.create_queue(QueueName="jobs")["QueueUrl"]
    assert url == f"{sqs_url}/{issued.account_id}/jobs"
    assert client.get_queue_url(QueueName="jobs")["QueueUrl"] == url


def test_create_queue_gives_sqs_defaults_and_keeps_existing_settings(sqs):
    endpoint, _, client = sqs
    client.create_queue(QueueName="fresh")
    info = store.get_queue(scope_of(endpoint), "fresh")
    assert (info.lease_seconds, info.delay_seconds) == (30, 0)
    store.ensure_queue(scope_of(endpoint), "old", lease_seconds=300)
    client.create_queue(QueueName="old")
    assert store.get_queue(scope_of(endpoint), "old").lease_seconds == 300


def test_create_queue_with_other_attributes_than_the_existing_is_queue_name_exists(
    client,
):
    client.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "60"})
    client.create_queue(QueueName="q", Attributes={"VisibilityTimeout": "60"})
    error = error_of(
        client.create_queue, QueueName="q", Attributes={"VisibilityTimeout": "61"}
    )
    assert isinstance(error, client.exceptions.QueueNameExists)
    assert error.response["Error"]["Code"] == "QueueAlreadyExists"


@pytest.mark.parametrize("name", ["", "a.fifo", "with space", "x" * 81, "ü"])
def test_create_queue_refuses_names_sqs_refuses(client, name):
    error = error_of(client.create_queue, QueueName=name)
    assert error.response["Error"]["Code"] == "InvalidParameterValue"


def test_create_queue_outside_the_grant_is_access_denied(make_sqs):
    _, _, client = make_sqs(queues=("allowed",))
    client.create_queue(QueueName="allowed")
    error = error_of(client.create_queue, QueueName="other")
    assert error.response["Error"]["Code"] == "AccessDenied"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_create_queue_refuses_fifo_on_a_standard_name_and_unknown_attributes(client):
    error = error_of(
        client.create_queue, QueueName="f", Attributes={"FifoQueue": "true"}
    )
    assert error.response["Error"]["Code"] == "InvalidParameterValue"
    error = error_of(client.create_queue, QueueName="f", Attributes={"Policy": "{}"})
    assert isinstance(error, client.exceptions.InvalidAttributeName)


def test_get_queue_url_of_a_missing_queue_is_queue_does_not_exist(client):
    error = error_of(client.get_queue_url, QueueName="never")
    assert isinstance(error, client.exceptions.QueueDoesNotExist)
    assert error.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_list_queues_filters_by_prefix_and_pages(client, sqs):
    endpoint = sqs[0]
    for name in ("alpha", "alpine", "beta"):
        client.create_queue(QueueName=name)
    # A queue the JSON API made is an SQS queue too (when its name is one).
    store.create_todo(scope_of(endpoint), queue="api-made", title="t")
    store.create_todo(scope_of(endpoint), queue="not.sqs", title="t")
    names = [url.rsplit("/", 1)[1] for url in client.list_queues()["QueueUrls"]]
    assert names == ["alpha", "alpine", "api-made", "beta"]
    assert len(client.list_queues(QueueNamePrefix="alp")["QueueUrls"]) == 2
    first = client.list_queues(MaxResults=2)
    assert len(first["QueueUrls"]) == 2 and first["NextToken"]
    rest = client.list_queues(MaxResults=2, NextToken=first["NextToken"])
    assert [u.rsplit("/", 1)[1] for u in rest["QueueUrls"]] == ["api-made", "beta"]
    assert "NextToken" not in rest
    assert "QueueUrls" not in client.list_queues(QueueNamePrefix="zzz")


def test_queue_attributes_are_the_queue_settings(client, queue_url, sqs):
    endpoint = sqs[0]
    client.set_queue_attributes(
        QueueUrl=queue_url,
        Attributes={
            "VisibilityTimeout": "45",
            "DelaySeconds": "5",
            "RedrivePolicy": json.dumps({"maxReceiveCount": 3}),
            "MessageRetentionPeriod": "86400",
        },
    )
    info = store.get_queue(scope_of(endpoint), "jobs")
    assert (info.lease_seconds, info.delay_seconds, info.max_attempts) == (45, 5, 3)
    attributes = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"]
    )["Attributes"]
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["DelaySeconds"] == "5"
    assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 3
    assert attributes["QueueArn"].endswith(f":{sqs[1].account_id}:jobs")
    assert attributes["ApproximateNumberOfMessages"] == "0"
    only = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["DelaySeconds"]
    )["Attributes"]
    assert only == {"DelaySeconds": "5"}


def test_queue_attribute_errors(client, queue_url):
    error = error_of(
        client.get_queue_attributes, QueueUrl=queue_url, AttributeNames=["Bogus"]
    )
    assert isinstance(error, client.exceptions.InvalidAttributeName)
    for attributes in (
        {"VisibilityTimeout": "43201"},
        {"DelaySeconds": "-1"},
        {"RedrivePolicy": "not json"},
        {"RedrivePolicy": json.dumps({"maxReceiveCount": 0})},
    ):
        error = error_of(
            client.set_queue_attributes, QueueUrl=queue_url, Attributes=attributes
        )
        assert error.response["Error"]["Code"] == "InvalidAttributeValue", attributes


def test_approximate_counts_follow_the_todos(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="a")
    client.send_message(QueueUrl=queue_url, MessageBody="b")
    client.send_message(QueueUrl=queue_url, MessageBody="c", DelaySeconds=60)
    client.receive_message(QueueUrl=queue_url)
    attributes = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "1"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "1"
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"


def test_purge_queue_removes_its_live_messages_only(client, queue_url, sqs):
    endpoint = sqs[0]
    client.create_queue(QueueName="other")
    other = client.get_queue_url(QueueName="other")["QueueUrl"]
    client.send_message(QueueUrl=other, MessageBody="keep")
    for body in ("a", "b"):
        client.send_message(QueueUrl=queue_url, MessageBody=body)
    received = client.receive_message(QueueUrl=queue_url)["Messages"][0]
    client.purge_queue(QueueUrl=queue_url)
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)
    assert store.get_queue(scope_of(endpoint), "jobs").claimed == 0
    # The in-flight message went too: deleting it now deletes nothing.
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=received["ReceiptHandle"])
    assert client.receive_message(QueueUrl=other)["Messages"][0]["Body"] == "keep"


def test_delete_queue_removes_the_queue_and_its_messages(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="a")
    client.delete_queue(QueueUrl=queue_url)
    error = error_of(client.get_queue_url, QueueName="jobs")
    assert isinstance(error, client.exceptions.QueueDoesNotExist)
    error = error_of(client.send_message, QueueUrl=queue_url, MessageBody="x")
    assert isinstance(error, client.exceptions.QueueDoesNotExist)
    url = client.create_queue(QueueName="jobs")["QueueUrl"]
    assert "Messages" not in client.receive_message(QueueUrl=url)


# --- Messages ---------------------------------------------------------------

ATTRIBUTES = {
    "text": {"DataType": "String", "StringValue": "héllo"},
    "count": {"DataType": "Number", "StringValue": "42"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe"},
    "custom": {"DataType": "String.json", "StringValue": "{}"},
}


def test_send_receive_delete_round_trip_with_attributes(client, queue_url, sqs):
    sent = client.send_message(
        QueueUrl=queue_url, MessageBody="héllo wörld", MessageAttributes=ATTRIBUTES
    )
    assert sent["MD5OfMessageBody"] == md5("héllo wörld")
    received = client.receive_message(
        QueueUrl=queue_url,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    assert len(received) == 1
    message = received[0]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == "héllo wörld"
    assert message["MD5OfBody"] == md5("héllo wörld")
    assert message["MessageAttributes"] == ATTRIBUTES
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert message["Attributes"]["SenderId"] == sqs[1].account_id
    sent_ms = int(message["Attributes"]["SentTimestamp"])
    assert abs(sent_ms / 1000 - time.time()) < 60
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert todo.state == "done"
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)


def test_receive_returns_only_the_message_attributes_asked_for(client, queue_url):
    client.send_message(
        QueueUrl=queue_url, MessageBody="x", MessageAttributes=ATTRIBUTES
    )
    message = client.receive_message(
        QueueUrl=queue_url, MessageAttributeNames=["text", "cou.*", "blo.*"]
    )["Messages"][0]
    # "cou.*" selects the names that start with "cou".
    assert set(message["MessageAttributes"]) == {"text", "count", "blob"}
    assert "Attributes" not in message


def test_the_same_message_received_again_counts_its_receives(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="x")
    first = client.receive_message(QueueUrl=queue_url, VisibilityTimeout=1)
    handle = first["Messages"][0]["ReceiptHandle"]
    client.change_message_visibility(
        QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=0
    )
    second = client.receive_message(QueueUrl=queue_url, AttributeNames=["All"])
    message = second["Messages"][0]
    assert message["Attributes"]["ApproximateReceiveCount"] == "2"
    assert message["ReceiptHandle"] != handle
    # The superseded handle deletes nothing; the current one does.
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)
    assert (
        client.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
        == "1"
    )
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    # Deleting again with the same handle is retry-safe.
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def test_visibility_timeout_hides_a_message_until_it_lapses(client, queue_url, sqs):
    sent = client.send_message(QueueUrl=queue_url, MessageBody="x")
    client.receive_message(QueueUrl=queue_url, VisibilityTimeout=600)
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert 590 < (todo.lease_expires_at - timezone.now()).total_seconds() <= 600
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            [sent["MessageId"]],
        )
    again = client.receive_message(QueueUrl=queue_url, AttributeNames=["All"])
    assert again["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "2"


def test_receive_with_visibility_timeout_zero_leaves_the_message_visible(
    client, queue_url
):
    """Defect (moto's test_receive_message_with_explicit_visibility_timeout and
    test_receive_message_again_preserves_attributes): VisibilityTimeout 0 was
    taken as 1 s, so the message stayed hidden; in SQS it is visible at once."""
    sent = client.send_message(
        QueueUrl=queue_url,
        MessageBody="x",
        MessageAttributes={"a": {"DataType": "String", "StringValue": "1"}},
    )
    first = client.receive_message(
        QueueUrl=queue_url, VisibilityTimeout=0, AttributeNames=["All"]
    )["Messages"]
    assert [m["MessageId"] for m in first] == [sent["MessageId"]]
    assert (
        client.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "1"
    )
    again = client.receive_message(
        QueueUrl=queue_url, AttributeNames=["All"], MessageAttributeNames=["All"]
    )["Messages"]
    assert [m["MessageId"] for m in again] == [sent["MessageId"]]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    assert again[0]["MessageAttributes"] == {
        "a": {"DataType": "String", "StringValue": "1"}
    }
    # The second receive's visibility timeout (the queue's 30 s) holds.
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)


def test_a_handle_received_with_visibility_timeout_zero_deletes_until_received_again(
    client, queue_url
):
    client.send_message(QueueUrl=queue_url, MessageBody="x")
    (message,) = client.receive_message(QueueUrl=queue_url, VisibilityTimeout=0)[
        "Messages"
    ]
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)
    counts = client.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
        ],
    )["Attributes"]
    assert counts == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


def test_a_lapsed_visibility_timeout_counts_as_visible_before_any_sweep(
    client, queue_url
):
    """Defect: a message whose visibility timeout ran out was counted as not
    visible until the sweep requeued it, though the next receive took it."""
    sent = client.send_message(QueueUrl=queue_url, MessageBody="x")
    client.send_message(QueueUrl=queue_url, MessageBody="y")
    client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=2)

    def counts():
        attributes = client.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )["Attributes"]
        return (
            attributes["ApproximateNumberOfMessages"],
            attributes["ApproximateNumberOfMessagesNotVisible"],
        )

    assert counts() == ("0", "2")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            [sent["MessageId"]],
        )
    assert counts() == ("1", "1")
    again = client.receive_message(QueueUrl=queue_url)["Messages"]
    assert [m["MessageId"] for m in again] == [sent["MessageId"]]
    assert counts() == ("0", "2")


def test_a_lapsed_handle_deletes_its_message_until_the_sweep_requeues_it(
    client, queue_url, sqs
):
    first, second = (
        client.send_message(QueueUrl=queue_url, MessageBody=body)["MessageId"]
        for body in ("x", "y")
    )
    handles = {
        m["MessageId"]: m["ReceiptHandle"]
        for m in client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=2)[
            "Messages"
        ]
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = ANY(%s::uuid[])",
            [[first, second]],
        )
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handles[first])
    assert store.get_todo(scope_of(sqs[0]), first).state == "done"

    assert [moved.id for moved in store.reap_expired()] == [second]
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handles[second])
    assert store.get_todo(scope_of(sqs[0]), second).state == "pending"


def test_change_message_visibility_extends_the_lease(client, queue_url, sqs):
    sent = client.send_message(QueueUrl=queue_url, MessageBody="x")
    handle = client.receive_message(QueueUrl=queue_url)["Messages"][0]["ReceiptHandle"]
    client.change_message_visibility(
        QueueUrl=queue_url, ReceiptHandle=handle, VisibilityTimeout=3600
    )
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert (todo.lease_expires_at - timezone.now()).total_seconds() > 3500


def test_change_message_visibility_errors(client, queue_url):
    error = error_of(
        client.change_message_visibility,
        QueueUrl=queue_url,
        ReceiptHandle="garbage",
        VisibilityTimeout=10,
    )
    assert isinstance(error, client.exceptions.ReceiptHandleIsInvalid)
    client.send_message(QueueUrl=queue_url, MessageBody="x")
    handle = client.receive_message(QueueUrl=queue_url)["Messages"][0]["ReceiptHandle"]
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)
    error = error_of(
        client.change_message_visibility,
        QueueUrl=queue_url,
        ReceiptHandle=handle,
        VisibilityTimeout=10,
    )
    assert isinstance(error, client.exceptions.MessageNotInflight)
    assert error.response["Error"]["Code"] == (
        "AWS.SimpleQueueService.MessageNotInflight"
    )


def test_delete_message_with_a_malformed_handle_is_receipt_handle_is_invalid(
    client, queue_url
):
    error = error_of(client.delete_message, QueueUrl=queue_url, ReceiptHandle="x!y")
    assert isinstance(error, client.exceptions.ReceiptHandleIsInvalid)
    assert error.response["Error"]["Code"] == "ReceiptHandleIsInvalid"


def test_delay_seconds_hides_a_new_message(client, queue_url, sqs):
    sent = client.send_message(QueueUrl=queue_url, MessageBody="x", DelaySeconds=120)
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert 110 < (todo.available_at - todo.created_at).total_seconds() <= 120
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET available_at = now() WHERE id = %s", [sent["MessageId"]]
        )
    assert client.receive_message(QueueUrl=queue_url)["Messages"][0]["Body"] == "x"


def test_the_queues_delay_applies_when_a_message_names_none(client):
    url = client.create_queue(QueueName="slow", Attributes={"DelaySeconds": "60"})[
        "QueueUrl"
    ]
    client.send_message(QueueUrl=url, MessageBody="x")
    assert "Messages" not in client.receive_message(QueueUrl=url)
    client.send_message(QueueUrl=url, MessageBody="now", DelaySeconds=0)
    assert client.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "now"


def test_delay_seconds_over_900_is_invalid(client, queue_url):
    error = error_of(
        client.send_message, QueueUrl=queue_url, MessageBody="x", DelaySeconds=901
    )
    assert error.response["Error"]["Code"] == "InvalidParameterValue"


def test_max_receive_count_dead_letters_after_that_many_receives(client, sqs):
    url = client.create_queue(
        QueueName="dlq-test",
        Attributes={"RedrivePolicy": json.dumps({"maxReceiveCount": "2"})},
    )["QueueUrl"]
    sent = client.send_message(QueueUrl=url, MessageBody="x")
    for _ in range(2):
        handle = client.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0
        )
    assert "Messages" not in client.receive_message(QueueUrl=url)
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert todo.is_dead_letter


def test_message_deduplication_id_is_the_idempotency_key(client, queue_url, sqs):
    first = client.send_message(
        QueueUrl=queue_url, MessageBody="x", MessageDeduplicationId="order-7"
    )
    again = client.send_message(
        QueueUrl=queue_url, MessageBody="x", MessageDeduplicationId="order-7"
    )
    assert again["MessageId"] == first["MessageId"]
    todo = store.get_todo(scope_of(sqs[0]), first["MessageId"])
    # Stored under its queue's name; received as sent.
    assert todo.idempotency_key == "sqs:jobs:order-7"
    (message,) = client.receive_message(QueueUrl=queue_url, AttributeNames=["All"])[
        "Messages"
    ]
    assert message["Attributes"]["MessageDeduplicationId"] == "order-7"


def test_message_body_limits_and_characters(client, queue_url):
    error = error_of(
        client.send_message, QueueUrl=queue_url, MessageBody="x" * 1_048_577
    )
    assert error.response["Error"]["Code"] == "InvalidParameterValue"
    error = error_of(client.send_message, QueueUrl=queue_url, MessageBody="a\x00b")
    assert isinstance(error, client.exceptions.InvalidMessageContents)
    big = "y" * 1_048_576
    client.send_message(QueueUrl=queue_url, MessageBody=big)
    assert client.receive_message(QueueUrl=queue_url)["Messages"][0]["Body"] == big


def test_invalid_message_attributes_are_invalid_parameter_value(client, queue_url):
    error = error_of(
        client.send_message,
        QueueUrl=queue_url,
        MessageBody="x",
        MessageAttributes={"AWS.x": {"DataType": "String", "StringValue": "v"}},
    )
    assert error.response["Error"]["Code"] == "InvalidParameterValue"


def test_receive_parameter_ranges(client, queue_url):
    for kwargs in (
        {"MaxNumberOfMessages": 11},
        {"MaxNumberOfMessages": 0},
        {"WaitTimeSeconds": 21},
        {"VisibilityTimeout": 43_201},
    ):
        error = error_of(client.receive_message, QueueUrl=queue_url, **kwargs)
        assert error.response["Error"]["Code"] == "InvalidParameterValue", kwargs


def test_a_todo_created_by_the_json_api_is_received_as_compact_json(
    client, queue_url, sqs
):
    todo, _ = store.create_todo(
        scope_of(sqs[0]), queue="jobs", title="t", payload={"n": 1, "s": "é"}
    )
    message = client.receive_message(QueueUrl=queue_url)["Messages"][0]
    assert message["MessageId"] == todo.id
    assert message["Body"] == '{"n":1,"s":"é"}'
    assert message["MD5OfBody"] == md5('{"n":1,"s":"é"}')


def test_an_sqs_message_is_a_todo_the_json_api_can_complete(client, queue_url, sqs):
    sent = client.send_message(QueueUrl=queue_url, MessageBody='{"job": 1}')
    scope = scope_of(sqs[0])
    todo = store.claim_next(scope, "api-worker", queue="jobs")
    assert todo.id == sent["MessageId"]
    assert todo.payload == {"sqs_message": {"body": '{"job": 1}'}}
    store.complete_todo(scope, todo.id, "api-worker")


# --- Batches ----------------------------------------------------------------


def test_send_message_batch_with_mixed_outcomes(client, queue_url):
    result = client.send_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "ok1", "MessageBody": "one"},
            {"Id": "bad", "MessageBody": "bad\x00"},
            {"Id": "ok2", "MessageBody": "two", "MessageAttributes": ATTRIBUTES},
            {"Id": "late", "MessageBody": "three", "DelaySeconds": 901},
        ],
    )
    assert [entry["Id"] for entry in result["Successful"]] == ["ok1", "ok2"]
    assert result["Successful"][0]["MD5OfMessageBody"] == md5("one")
    assert "MD5OfMessageAttributes" in result["Successful"][1]
    failed = {entry["Id"]: entry for entry in result["Failed"]}
    assert set(failed) == {"bad", "late"}
    assert failed["bad"]["Code"] == "InvalidMessageContents"
    assert failed["bad"]["SenderFault"] is True
    bodies = [
        m["Body"]
        for m in client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)[
            "Messages"
        ]
    ]
    assert sorted(bodies) == ["one", "two"]


def test_receive_up_to_ten_and_delete_them_in_a_batch(client, queue_url):
    client.send_message_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)],
    )
    received = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)[
        "Messages"
    ]
    assert len(received) == 10
    entries = [
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]}
        for i, m in enumerate(received)
    ]
    entries[3]["ReceiptHandle"] = "not-a-handle"
    result = client.delete_message_batch(QueueUrl=queue_url, Entries=entries)
    assert len(result["Successful"]) == 9
    assert result["Failed"] == [
        {
            "Id": "d3",
            "SenderFault": True,
            "Code": "ReceiptHandleIsInvalid",
            "Message": (
                'The input receipt handle "not-a-handle" is not a valid receipt handle.'
            ),
        }
    ]


def test_change_message_visibility_batch_with_mixed_outcomes(client, queue_url):
    client.send_message_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": f"m{i}", "MessageBody": str(i)} for i in range(3)],
    )
    received = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=3)[
        "Messages"
    ]
    client.delete_message(
        QueueUrl=queue_url, ReceiptHandle=received[2]["ReceiptHandle"]
    )
    result = client.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[
            {
                "Id": "a",
                "ReceiptHandle": received[0]["ReceiptHandle"],
                "VisibilityTimeout": 0,
            },
            {
                "Id": "b",
                "ReceiptHandle": received[1]["ReceiptHandle"],
                "VisibilityTimeout": 900,
            },
            {
                "Id": "c",
                "ReceiptHandle": received[2]["ReceiptHandle"],
                "VisibilityTimeout": 5,
            },
            {"Id": "d", "ReceiptHandle": "junk", "VisibilityTimeout": 5},
        ],
    )
    assert sorted(entry["Id"] for entry in result["Successful"]) == ["a", "b"]
    codes = {entry["Id"]: entry["Code"] for entry in result["Failed"]}
    assert codes == {"c": "MessageNotInflight", "d": "ReceiptHandleIsInvalid"}
    again = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in again["Messages"]] == ["0"]


@pytest.mark.parametrize(
    "entries, shape, code",
    [
        ([], "EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            [{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)],
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            [{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}],
            "BatchEntryIdsNotDistinct",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
        (
            [{"Id": "bad id!", "MessageBody": "x"}],
            "InvalidBatchEntryId",
            "AWS.SimpleQueueService.InvalidBatchEntryId",
        ),
        (
            [{"Id": f"e{i}", "MessageBody": "x" * 110_000} for i in range(10)],
            "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong",
        ),
    ],
)
def test_bad_batches_are_refused_whole(client, queue_url, entries, shape, code):
    error = error_of(client.send_message_batch, QueueUrl=queue_url, Entries=entries)
    assert isinstance(error, getattr(client.exceptions, shape))
    assert error.response["Error"]["Code"] == code
    # Nothing was half-applied.
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)


def test_bad_delete_batches_are_refused_whole(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="x")
    handle = client.receive_message(QueueUrl=queue_url)["Messages"][0]["ReceiptHandle"]
    entries = [{"Id": "a", "ReceiptHandle": handle}, {"Id": "a", "ReceiptHandle": "z"}]
    error = error_of(client.delete_message_batch, QueueUrl=queue_url, Entries=entries)
    assert isinstance(error, client.exceptions.BatchEntryIdsNotDistinct)
    assert (
        client.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
        == "1"
    )


# --- Long polling -----------------------------------------------------------


def test_long_poll_wakes_when_a_message_arrives(client, queue_url, sqs):
    result = {}

    def receive():
        started = time.monotonic()
        result["response"] = client.receive_message(
            QueueUrl=queue_url, WaitTimeSeconds=10
        )
        result["seconds"] = time.monotonic() - started

    waiter = threading.Thread(target=receive)
    waiter.start()
    time.sleep(0.5)
    client.send_message(QueueUrl=queue_url, MessageBody="wake up")
    waiter.join(timeout=15)
    assert result["response"]["Messages"][0]["Body"] == "wake up"
    assert result["seconds"] < 5


def test_long_poll_answers_empty_at_its_deadline(client, queue_url):
    started = time.monotonic()
    assert "Messages" not in client.receive_message(
        QueueUrl=queue_url, WaitTimeSeconds=1
    )
    assert 0.9 < time.monotonic() - started < 5


# --- Authentication and isolation -------------------------------------------


def test_another_endpoints_queue_url_is_a_queue_that_never_existed(make_sqs, sqs_url):
    _, _, alice = make_sqs("a", owner="alice")
    _, bob_key, bob = make_sqs("b", owner="bob")
    alice_url = alice.create_queue(QueueName="private")["QueueUrl"]
    alice.send_message(QueueUrl=alice_url, MessageBody="secret")
    never = f"{sqs_url}/{bob_key.account_id}/never-made"
    for url in (alice_url, never):
        responses = []
        for call in (
            lambda u: bob.send_message(QueueUrl=u, MessageBody="x"),
            lambda u: bob.receive_message(QueueUrl=u),
            lambda u: bob.get_queue_attributes(QueueUrl=u, AttributeNames=["All"]),
            lambda u: bob.purge_queue(QueueUrl=u),
            lambda u: bob.delete_queue(QueueUrl=u),
        ):
            error = error_of(call, url)
            assert isinstance(error, bob.exceptions.QueueDoesNotExist)
            responses.append(
                (
                    error.response["Error"],
                    error.response["ResponseMetadata"]["HTTPStatusCode"],
                )
            )
        if url == alice_url:
            foreign = responses
        else:
            assert responses == foreign
    # Bob's own queue of the same name is his, and empty.
    bob_url = bob.create_queue(QueueName="private")["QueueUrl"]
    assert bob_url != alice_url
    assert "Messages" not in bob.receive_message(QueueUrl=bob_url)
    assert alice.receive_message(QueueUrl=alice_url)["Messages"][0]["Body"] == "secret"


def test_a_foreign_receipt_handle_deletes_nothing(make_sqs):
    _, _, alice = make_sqs("a", owner="alice")
    _, _, bob = make_sqs("b", owner="bob")
    alice_url = alice.create_queue(QueueName="q")["QueueUrl"]
    bob_url = bob.create_queue(QueueName="q")["QueueUrl"]
    alice.send_message(QueueUrl=alice_url, MessageBody="x")
    handle = alice.receive_message(QueueUrl=alice_url)["Messages"][0]["ReceiptHandle"]
    bob.delete_message(QueueUrl=bob_url, ReceiptHandle=handle)
    error = error_of(
        bob.change_message_visibility,
        QueueUrl=bob_url,
        ReceiptHandle=handle,
        VisibilityTimeout=5,
    )
    assert isinstance(error, bob.exceptions.ReceiptHandleIsInvalid)
    alice.delete_message(QueueUrl=alice_url, ReceiptHandle=handle)


def test_a_wrong_secret_is_signature_does_not_match(sqs, sqs_url):
    _, issued, _ = sqs
    wrong = client_for(sqs_url, issued.access_key_id, issued.secret_access_key + "x")
    error = error_of(wrong.list_queues)
    assert error.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_an_unknown_key_is_invalid_client_token_id(sqs_url, db):
    stranger = client_for(sqs_url, "SBIAUNKNOWNKEY000000", "secret")
    error = error_of(stranger.list_queues)
    assert error.response["Error"]["Code"] == "InvalidClientTokenId"


def test_any_region_signs(make_sqs):
    _, _, client = make_sqs(region="ap-southeast-2")
    url = client.create_queue(QueueName="far")["QueueUrl"]
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    assert attributes["Attributes"]["QueueArn"].startswith(
        "arn:aws:sqs:ap-southeast-2:"
    )


@pytest.mark.parametrize("minutes, passes", [(-14, True), (-16, False), (16, False)])
def test_a_skewed_client_clock_is_refused_past_fifteen_minutes(
    client, monkeypatch, minutes, passes
):
    skewed = datetime.now(UTC) + timedelta(minutes=minutes)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: skewed)
    if passes:
        client.list_queues()
        return
    error = error_of(client.list_queues)
    assert error.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert "Signature" in error.response["Error"]["Message"]


def test_a_revoked_endpoints_key_stops_at_once(sqs):
    endpoint, _, client = sqs
    client.list_queues()
    endpoint.revoked_at = timezone.now()
    endpoint.save()
    error = error_of(client.list_queues)
    assert error.response["Error"]["Code"] == "InvalidClientTokenId"


def test_a_rotated_key_stops_at_once(sqs, sqs_url):
    endpoint, old, client = sqs
    url = client.create_queue(QueueName="q")["QueueUrl"]
    new = credentials.issue(endpoint)
    error = error_of(client.list_queues)
    assert error.response["Error"]["Code"] == "InvalidClientTokenId"
    fresh = client_for(sqs_url, new.access_key_id, new.secret_access_key)
    assert fresh.get_queue_url(QueueName="q")["QueueUrl"] == url


def test_the_old_secret_signs_for_nothing_after_rotation(sqs, sqs_url):
    """A signing key is kept per secret, never per key id (todos.sqs.sigv4):
    the old secret, whose key was derived and kept before the rotation,
    cannot sign for the new key id."""
    endpoint, old, client = sqs
    client.create_queue(QueueName="q")
    new = credentials.issue(endpoint)
    mixed = client_for(sqs_url, new.access_key_id, old.secret_access_key)
    error = error_of(mixed.list_queues)
    assert error.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_unsupported_actions_are_unsupported_operation(client, queue_url):
    error = error_of(client.tag_queue, QueueUrl=queue_url, Tags={"a": "b"})
    assert isinstance(error, client.exceptions.UnsupportedOperation)
    assert error.response["Error"]["Code"] == (
        "AWS.SimpleQueueService.UnsupportedOperation"
    )


def test_a_base64_binary_attribute_round_trips_byte_for_byte(client, queue_url, sqs):
    data = bytes(range(256))
    sent = client.send_message(
        QueueUrl=queue_url,
        MessageBody="b",
        MessageAttributes={"raw": {"DataType": "Binary", "BinaryValue": data}},
    )
    message = client.receive_message(QueueUrl=queue_url, MessageAttributeNames=["raw"])
    assert message["Messages"][0]["MessageAttributes"]["raw"]["BinaryValue"] == data
    # Stored as its base64 text in the todo's JSON payload.
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert todo.payload["sqs_message"]["message_attributes"]["raw"] == {
        "DataType": "Binary",
        "BinaryValue": base64.b64encode(data).decode("ascii"),
    }


def test_message_actions_on_a_missing_queue_are_queue_does_not_exist(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="x")
    handle = client.receive_message(QueueUrl=queue_url)["Messages"][0]["ReceiptHandle"]
    missing = queue_url.rsplit("/", 1)[0] + "/never-made"
    for call in (
        lambda: client.receive_message(QueueUrl=missing, WaitTimeSeconds=1),
        lambda: client.delete_message(QueueUrl=missing, ReceiptHandle=handle),
        lambda: client.change_message_visibility(
            QueueUrl=missing, ReceiptHandle=handle, VisibilityTimeout=5
        ),
        lambda: client.delete_message_batch(
            QueueUrl=missing, Entries=[{"Id": "a", "ReceiptHandle": handle}]
        ),
        lambda: client.change_message_visibility_batch(
            QueueUrl=missing,
            Entries=[{"Id": "a", "ReceiptHandle": handle, "VisibilityTimeout": 5}],
        ),
    ):
        assert isinstance(error_of(call), client.exceptions.QueueDoesNotExist)
    # The message in the real queue was not touched by any of them.
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)


def test_a_malformed_handle_on_a_missing_queue_is_queue_does_not_exist(
    client, queue_url
):
    """moto's test_delete_message_from_unknown_url: SQS names the missing
    queue before it reads the handle."""
    missing = queue_url.rsplit("/", 1)[0] + "/never-made"
    for call in (
        lambda: client.delete_message(QueueUrl=missing, ReceiptHandle="unknown"),
        lambda: client.change_message_visibility(
            QueueUrl=missing, ReceiptHandle="unknown", VisibilityTimeout=5
        ),
    ):
        assert isinstance(error_of(call), client.exceptions.QueueDoesNotExist)
    # On a queue that exists the same handle is still ReceiptHandleIsInvalid.
    error = error_of(client.delete_message, QueueUrl=queue_url, ReceiptHandle="x")
    assert error.response["Error"]["Code"] == "ReceiptHandleIsInvalid"


def test_a_batch_with_one_message_over_the_limit_is_batch_request_too_long(
    client, queue_url, sqs
):
    """moto's test_send_message_batch_errors: the batch is refused whole (400),
    not answered 200 with the entry under Failed."""
    error = error_of(
        client.send_message_batch,
        QueueUrl=queue_url,
        Entries=[
            {"Id": "small", "MessageBody": "x"},
            {"Id": "big", "MessageBody": "b" * 1_048_577},
        ],
    )
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert (
        error.response["Error"]["Code"] == "AWS.SimpleQueueService.BatchRequestTooLong"
    )
    assert error.response["Error"]["Message"] == (
        "Batch requests cannot be longer than 1048576 bytes. "
        "You have sent 1048578 bytes."
    )
    assert store.list_todos(scope_of(sqs[0]), queue="jobs").todos == []


def test_a_queue_with_visibility_timeout_zero_shows_a_received_message_at_once(
    client,
):
    """SQS allows a queue's VisibilityTimeout to be 0: a message received
    without a timeout of its own is visible again at once (it was kept as 1)."""
    url = client.create_queue(
        QueueName="instant", Attributes={"VisibilityTimeout": "0"}
    )["QueueUrl"]
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout"]
    )["Attributes"]
    assert attributes == {"VisibilityTimeout": "0"}
    sent = client.send_message(QueueUrl=url, MessageBody="x")
    first = client.receive_message(QueueUrl=url)["Messages"]
    again = client.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert [m["MessageId"] for m in first + again] == [sent["MessageId"]] * 2
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # A later change of the visibility still extends the latest receive's lease.
    client.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"], VisibilityTimeout=60
    )
    assert "Messages" not in client.receive_message(QueueUrl=url)
