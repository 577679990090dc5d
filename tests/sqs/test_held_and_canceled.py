"""SQS never receives a held or canceled todo and does not count them as
visible (CONTRACT §14)."""

import pytest

from todos import store

# A real gunicorn serves the SQS calls: the data must be committed.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sqs(make_sqs):
    return make_sqs()


def test_held_and_canceled_todos_are_never_received_nor_counted(sqs):
    endpoint, client = sqs[0], sqs[2]
    queue_url = client.create_queue(QueueName="jobs")["QueueUrl"]
    scope = store.Scope.for_endpoint(endpoint)
    held, _ = store.create_todo(scope, queue="jobs", title="held")
    store.claim_todo(scope, held.id, "w1")
    store.ask(scope, held.id, "w1", question="go?", return_to="pool")
    canceled, _ = store.create_todo(scope, queue="jobs", title="canceled")
    store.cancel_todo(scope, canceled.id)
    client.send_message(QueueUrl=queue_url, MessageBody="visible")

    attributes = client.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "1"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    received = client.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
    )["Messages"]
    assert [message["Body"] for message in received] == ["visible"]
    again = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    assert again.get("Messages", []) == []
