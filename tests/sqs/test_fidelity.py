"""Where Switchboard's SQS answers must be SQS's own, driven by boto3.

Redelivery without a RedrivePolicy, the queue's message counts, receipt
handles of another queue, deduplication ids scoped to their queue, batches
that fail entry by entry (never a 500 after storing), and input that must be
refused whole-string.
"""

import base64
import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from django.db import connection

from todos import store

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


def scope_of(endpoint):
    return store.Scope.for_endpoint(endpoint)


def error_of(call, *args, **kwargs):
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value


def counts(client, url):
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])[
        "Attributes"
    ]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        int(attributes["ApproximateNumberOfMessagesDelayed"]),
    )


def stored_bodies(endpoint, queue):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT payload->'sqs_message'->>'body' FROM todos"
            " WHERE endpoint_id = %s AND queue = %s ORDER BY created_at",
            [str(endpoint.id), queue],
        )
        return [row[0] for row in cursor.fetchall()]


# --- Redelivery and counts ---------------------------------------------------


def test_a_queue_without_redrive_policy_redelivers_without_limit(client, queue_url):
    client.send_message(QueueUrl=queue_url, MessageBody="again")
    for receive in range(1, 9):
        (message,) = client.receive_message(
            QueueUrl=queue_url, VisibilityTimeout=0, AttributeNames=["All"]
        )["Messages"]
        assert message["Attributes"]["ApproximateReceiveCount"] == str(receive)
    assert counts(client, queue_url) == (1, 0, 0)
    attributes = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"]
    )["Attributes"]
    assert "RedrivePolicy" not in attributes
    asked = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["RedrivePolicy"]
    )
    assert "RedrivePolicy" not in asked.get("Attributes", {})


def test_redrive_policy_is_reported_when_set_and_removed_by_an_empty_value(
    client, queue_url
):
    policy = json.dumps({"maxReceiveCount": 3})
    client.set_queue_attributes(
        QueueUrl=queue_url, Attributes={"RedrivePolicy": policy}
    )
    attributes = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["RedrivePolicy"]
    )["Attributes"]
    assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 3
    client.set_queue_attributes(QueueUrl=queue_url, Attributes={"RedrivePolicy": ""})
    asked = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert "RedrivePolicy" not in asked["Attributes"]


def test_approximate_number_of_messages_counts_only_what_a_receive_could_return(
    client, queue_url, sqs
):
    endpoint = sqs[0]
    scope = scope_of(endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="ready")
    client.send_message(QueueUrl=queue_url, MessageBody="later", DelaySeconds=600)
    # Assigned to another worker: a receive never takes it.
    store.create_todo(scope, queue="jobs", title="theirs", assignee="someone-else")
    # A lapsed lease at the attempt cap: the sweep dead-letters it.
    capped, _ = store.create_todo(scope, queue="jobs", title="capped", max_attempts=1)
    store.claim_todo(scope, capped.id, "w", lease_seconds=60)
    # A lapsed lease under a cancel request: the sweep ends it canceled.
    canceling, _ = store.create_todo(scope, queue="jobs", title="canceling")
    store.claim_todo(scope, canceling.id, "w", lease_seconds=60)
    store.cancel_todo(scope, canceling.id, reason="not needed")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = ANY(%s::uuid[])",
            [[capped.id, canceling.id]],
        )
    assert counts(client, queue_url) == (1, 2, 2)
    assert len(client.receive_message(QueueUrl=queue_url)["Messages"]) == 1
    assert "Messages" not in client.receive_message(QueueUrl=queue_url)
    assert counts(client, queue_url) == (0, 3, 2)
    store.pause_queue(scope, "jobs")
    client.send_message(QueueUrl=queue_url, MessageBody="paused")
    assert counts(client, queue_url) == (0, 3, 3)


# --- Receipt handles and deduplication ---------------------------------------


def test_delete_message_with_another_queues_handle_is_receipt_handle_is_invalid(
    client, queue_url, sqs
):
    other = client.create_queue(QueueName="other")["QueueUrl"]
    sent = client.send_message(QueueUrl=other, MessageBody="x")
    handle = client.receive_message(QueueUrl=other)["Messages"][0]["ReceiptHandle"]
    error = error_of(client.delete_message, QueueUrl=queue_url, ReceiptHandle=handle)
    assert isinstance(error, client.exceptions.ReceiptHandleIsInvalid)
    answer = client.delete_message_batch(
        QueueUrl=queue_url, Entries=[{"Id": "a", "ReceiptHandle": handle}]
    )
    assert not answer.get("Successful")
    assert answer["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    todo = store.get_todo(scope_of(sqs[0]), sent["MessageId"])
    assert todo.state == "claimed"
    # Its own queue still deletes it; a handle of a message gone entirely
    # (deleted, purged) succeeds and deletes nothing, as SQS documents.
    client.delete_message(QueueUrl=other, ReceiptHandle=handle)
    client.delete_queue(QueueUrl=other)
    client.delete_message(QueueUrl=queue_url, ReceiptHandle=handle)


def test_a_deduplication_id_is_scoped_to_its_queue(client, queue_url):
    other = client.create_queue(QueueName="other")["QueueUrl"]
    first = client.send_message(
        QueueUrl=queue_url, MessageBody="a", MessageDeduplicationId="order-7"
    )
    second = client.send_message(
        QueueUrl=other, MessageBody="b", MessageDeduplicationId="order-7"
    )
    assert second["MessageId"] != first["MessageId"]
    batch = client.send_message_batch(
        QueueUrl=other,
        Entries=[{"Id": "e", "MessageBody": "c", "MessageDeduplicationId": "order-8"}],
    )
    assert batch["Successful"]
    again = client.send_message(
        QueueUrl=other, MessageBody="b", MessageDeduplicationId="order-7"
    )
    assert again["MessageId"] == second["MessageId"]


# --- Batches -----------------------------------------------------------------


def test_a_batch_with_an_unencodable_attribute_name_stores_the_good_entry_once(
    sqs, sqs_url, queue_url
):
    endpoint, issued = sqs[0], sqs[1]
    # boto3's own retries on: a 500 after the commit would store "good" 3 times.
    retrying = boto3.client(
        "sqs",
        endpoint_url=sqs_url,
        region_name="us-east-1",
        aws_access_key_id=issued.access_key_id,
        aws_secret_access_key=issued.secret_access_key,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
    )
    attribute = {"DataType": "String", "StringValue": "v"}
    answer = retrying.send_message_batch(
        QueueUrl=queue_url,
        Entries=[
            {"Id": "good", "MessageBody": "good"},
            {
                "Id": "bad",
                "MessageBody": "bad",
                "MessageAttributes": {"\udc80": attribute},
            },
        ],
    )
    assert [entry["Id"] for entry in answer["Successful"]] == ["good"]
    (failed,) = answer["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "bad",
        "InvalidParameterValue",
        True,
    )
    assert stored_bodies(endpoint, "jobs") == ["good"]


@pytest.mark.parametrize("data_type", ["String.\x00", "String.\udc80", "Number.a\x01"])
def test_an_attribute_data_type_with_a_character_sqs_refuses_is_invalid(
    client, queue_url, sqs, data_type
):
    attributes = {"a": {"DataType": data_type, "StringValue": "1"}}
    error = error_of(
        client.send_message,
        QueueUrl=queue_url,
        MessageBody="x",
        MessageAttributes=attributes,
    )
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error.response["Error"]["Code"] == "InvalidParameterValue"
    answer = client.send_message_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": "e", "MessageBody": "x", "MessageAttributes": attributes}],
    )
    assert answer["Failed"][0]["Code"] == "InvalidParameterValue"
    assert stored_bodies(sqs[0], "jobs") == []


def test_a_receipt_handle_with_a_nul_in_its_token_is_invalid(client, queue_url, sqs):
    sent = client.send_message(QueueUrl=queue_url, MessageBody="x")
    raw = f"{sent['MessageId']}:\x00abc".encode()
    handle = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    error = error_of(client.delete_message, QueueUrl=queue_url, ReceiptHandle=handle)
    assert isinstance(error, client.exceptions.ReceiptHandleIsInvalid)
    answer = client.change_message_visibility_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": "a", "ReceiptHandle": handle, "VisibilityTimeout": 5}],
    )
    assert answer["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"


# --- Whole-string matches ----------------------------------------------------


def test_names_and_ids_with_a_trailing_newline_are_refused(client, queue_url, sqs):
    error = error_of(client.create_queue, QueueName="q\n")
    assert error.response["Error"]["Code"] == "InvalidParameterValue"
    assert [info.name for info in store.list_queues(scope_of(sqs[0]))] == ["jobs"]
    error = error_of(client.get_queue_url, QueueName="jobs\n")
    assert isinstance(error, client.exceptions.QueueDoesNotExist)
    error = error_of(
        client.send_message_batch,
        QueueUrl=queue_url,
        Entries=[{"Id": "a\n", "MessageBody": "x"}],
    )
    assert isinstance(error, client.exceptions.InvalidBatchEntryId)
    for kwargs in (
        {"MessageAttributes": {"a\n": {"DataType": "String", "StringValue": "v"}}},
        {"MessageAttributes": {"a": {"DataType": "String\n", "StringValue": "v"}}},
        {"MessageDeduplicationId": "d\n"},
    ):
        error = error_of(
            client.send_message, QueueUrl=queue_url, MessageBody="x", **kwargs
        )
        assert error.response["Error"]["Code"] == "InvalidParameterValue", kwargs
    assert stored_bodies(sqs[0], "jobs") == []
