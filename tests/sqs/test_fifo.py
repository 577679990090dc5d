"""SQS FIFO queues driven by boto3 against a real gunicorn (CONTRACT §11, §17).

A ``.fifo`` queue is a queue with groups whose ``group_concurrency`` is 1: a
group's messages are received in the order they were sent, one in flight at
a time; ``MessageDeduplicationId`` (or the body's SHA-256 with
ContentBasedDeduplication) dedups as a standard queue's does.
"""

import hashlib

import pytest
from botocore.exceptions import ClientError
from django.db import connection

from todos import store
from todos.store import admission

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
def fifo_url(client):
    return client.create_queue(QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]


def error_of(call, *args, **kwargs):
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value.response["Error"]


def send(client, url, body, group, dedup=None):
    return client.send_message(
        QueueUrl=url,
        MessageBody=body,
        MessageGroupId=group,
        MessageDeduplicationId=dedup or body,
    )


def receive(client, url, count=10, **kwargs):
    return client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=count, AttributeNames=["All"], **kwargs
    ).get("Messages", [])


def test_a_fifo_queue_has_group_concurrency_one(sqs, client, fifo_url):
    endpoint = sqs[0]
    settings = admission.get_admission(store.Scope.for_endpoint(endpoint), "jobs.fifo")
    assert settings.group_concurrency == 1
    attributes = client.get_queue_attributes(QueueUrl=fifo_url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert attributes["FifoQueue"] == "true"
    assert attributes["ContentBasedDeduplication"] == "false"
    assert attributes["DeduplicationScope"] == "queue"
    assert attributes["FifoThroughputLimit"] == "perQueue"


def test_a_fifo_name_without_the_fifo_attribute_is_refused(client):
    # SQS makes a standard queue without FifoQueue, and no standard queue's
    # name holds a dot.
    error = error_of(client.create_queue, QueueName="alone.fifo")
    assert error["Code"] == "InvalidParameterValue"


def test_fifo_queue_attribute_must_agree_with_the_name(client):
    error = error_of(
        client.create_queue, QueueName="plain", Attributes={"FifoQueue": "true"}
    )
    assert error["Code"] == "InvalidParameterValue"
    error = error_of(
        client.create_queue, QueueName="x.fifo", Attributes={"FifoQueue": "false"}
    )
    assert error["Code"] == "InvalidParameterValue"


def test_fifo_attributes_on_a_standard_queue_are_unknown(client):
    error = error_of(
        client.create_queue,
        QueueName="plain",
        Attributes={"ContentBasedDeduplication": "true"},
    )
    assert error["Code"] == "InvalidAttributeName"


def test_fifo_attributes_are_kept_and_changed(client):
    url = client.create_queue(
        QueueName="kept.fifo",
        Attributes={
            "FifoQueue": "true",
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
        },
    )["QueueUrl"]
    client.set_queue_attributes(
        QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"}
    )
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert attributes["DeduplicationScope"] == "messageGroup"
    assert attributes["FifoThroughputLimit"] == "perMessageGroupId"
    assert attributes["ContentBasedDeduplication"] == "true"


def test_message_group_id_is_required_on_a_fifo_queue(client, fifo_url):
    error = error_of(
        client.send_message,
        QueueUrl=fifo_url,
        MessageBody="x",
        MessageDeduplicationId="1",
    )
    assert error["Code"] == "MissingParameter"
    error = error_of(
        client.send_message_batch,
        QueueUrl=fifo_url,
        Entries=[{"Id": "a", "MessageBody": "x", "MessageDeduplicationId": "1"}],
    )
    assert error["Code"] == "MissingParameter"


def test_a_fifo_send_needs_a_deduplication_id_without_content_dedup(client, fifo_url):
    error = error_of(
        client.send_message, QueueUrl=fifo_url, MessageBody="x", MessageGroupId="g"
    )
    assert error["Code"] == "InvalidParameterValue"
    assert "ContentBasedDeduplication" in error["Message"]


def test_a_fifo_message_takes_no_delay_of_its_own(client, fifo_url):
    error = error_of(
        client.send_message,
        QueueUrl=fifo_url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="1",
        DelaySeconds=5,
    )
    assert error["Code"] == "InvalidParameterValue"
    assert "DelaySeconds" in error["Message"]


def test_message_group_id_sets_the_todo_group(sqs, client, fifo_url):
    sent = send(client, fifo_url, "a", "repo/one")
    todo = store.get_todo(store.Scope.for_endpoint(sqs[0]), sent["MessageId"])
    assert todo.group == "repo/one"


def test_message_group_id_on_a_standard_queue_sets_the_group(sqs, client):
    url = client.create_queue(QueueName="plain")["QueueUrl"]
    sent = client.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    todo = store.get_todo(store.Scope.for_endpoint(sqs[0]), sent["MessageId"])
    assert todo.group == "g"
    (message,) = receive(client, url)
    assert message["Attributes"]["MessageGroupId"] == "g"
    assert "SequenceNumber" not in message["Attributes"]


def test_deduplication_id_dedups_a_fifo_send(client, fifo_url):
    first = send(client, fifo_url, "a", "g", dedup="same")
    again = send(client, fifo_url, "b", "g", dedup="same")
    assert again["MessageId"] == first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]
    assert [m["Body"] for m in receive(client, fifo_url)] == ["a"]


def test_content_based_deduplication_dedups_by_the_body(client):
    url = client.create_queue(
        QueueName="content.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    first = client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="1")
    again = client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="2")
    other = client.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="2")
    assert again["MessageId"] == first["MessageId"]
    assert other["MessageId"] != first["MessageId"]
    messages = receive(client, url)
    assert messages[0]["Attributes"]["MessageDeduplicationId"] == (
        hashlib.sha256(b"same").hexdigest()
    )


def test_deduplication_scope_message_group_dedups_within_a_group(client):
    url = client.create_queue(
        QueueName="scoped.fifo",
        Attributes={"FifoQueue": "true", "DeduplicationScope": "messageGroup"},
    )["QueueUrl"]
    first = send(client, url, "a", "g1", dedup="d")
    other_group = send(client, url, "a", "g2", dedup="d")
    same_group = send(client, url, "a", "g1", dedup="d")
    assert other_group["MessageId"] != first["MessageId"]
    assert same_group["MessageId"] == first["MessageId"]
    ids = {m["Attributes"]["MessageDeduplicationId"] for m in receive(client, url)}
    assert ids == {"d"}


def test_a_fifo_receive_keeps_group_order_one_in_flight_per_group(client, fifo_url):
    for n in range(3):
        send(client, fifo_url, f"a{n}", "a")
        send(client, fifo_url, f"b{n}", "b")
    seen: dict[str, list[str]] = {"a": [], "b": []}
    for _ in range(3):
        messages = receive(client, fifo_url)
        groups = [m["Attributes"]["MessageGroupId"] for m in messages]
        # One message per group in flight: never two of a group at once.
        assert sorted(groups) == ["a", "b"]
        assert receive(client, fifo_url) == []
        for message in messages:
            seen[message["Attributes"]["MessageGroupId"]].append(message["Body"])
            client.delete_message(
                QueueUrl=fifo_url, ReceiptHandle=message["ReceiptHandle"]
            )
    assert seen == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}


def test_a_batch_send_keeps_its_order_within_a_group(client, fifo_url):
    response = client.send_message_batch(
        QueueUrl=fifo_url,
        Entries=[
            {
                "Id": f"m{n}",
                "MessageBody": f"m{n}",
                "MessageGroupId": "g",
                "MessageDeduplicationId": f"m{n}",
            }
            for n in range(5)
        ],
    )
    numbers = [entry["SequenceNumber"] for entry in response["Successful"]]
    assert numbers == sorted(numbers) and len(set(numbers)) == 5
    bodies = []
    for _ in range(5):
        (message,) = receive(client, fifo_url)
        bodies.append(message["Body"])
        client.delete_message(QueueUrl=fifo_url, ReceiptHandle=message["ReceiptHandle"])
    assert bodies == [f"m{n}" for n in range(5)]


def test_a_released_fifo_message_is_received_again_before_its_group(client, fifo_url):
    send(client, fifo_url, "first", "g")
    send(client, fifo_url, "second", "g")
    (message,) = receive(client, fifo_url)
    client.change_message_visibility(
        QueueUrl=fifo_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    (again,) = receive(client, fifo_url)
    assert again["Body"] == "first"
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


def test_a_lapsed_fifo_message_holds_its_group_until_received_again(client, fifo_url):
    send(client, fifo_url, "first", "g")
    send(client, fifo_url, "second", "g")
    (message,) = receive(client, fifo_url, VisibilityTimeout=60)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            [message["MessageId"]],
        )
    (again,) = receive(client, fifo_url)
    assert again["Body"] == "first"
    assert receive(client, fifo_url) == []


def test_sequence_numbers_grow_within_a_group(client, fifo_url):
    sent = [send(client, fifo_url, f"m{n}", "g")["SequenceNumber"] for n in range(3)]
    assert sent == sorted(sent) and len(set(sent)) == 3
    (message,) = receive(client, fifo_url)
    assert message["Attributes"]["SequenceNumber"] == sent[0]


def test_a_fifo_queue_dead_letter_target_must_be_a_fifo_queue(client):
    policy = (
        '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:1:plain", "maxReceiveCount": 2}'
    )
    error = error_of(
        client.create_queue,
        QueueName="dl.fifo",
        Attributes={"FifoQueue": "true", "RedrivePolicy": policy},
    )
    assert error["Code"] == "InvalidAttributeValue"
    client.create_queue(
        QueueName="dl.fifo",
        Attributes={
            "FifoQueue": "true",
            "RedrivePolicy": policy.replace("plain", "x.fifo"),
        },
    )


def test_a_queue_name_serves_as_its_queue_url(client, fifo_url):
    # As SQS takes it: QueueUrl may be the bare name of the caller's queue.
    sent = send(client, "jobs.fifo", "by-name", "g")
    (message,) = receive(client, "jobs.fifo")
    assert message["MessageId"] == sent["MessageId"]
    error = error_of(
        client.send_message,
        QueueUrl="jobs.fifo",
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="2",
        DelaySeconds=5,
    )
    assert error["Code"] == "InvalidParameterValue"
    assert error_of(receive, client, "missing")["Code"] == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
