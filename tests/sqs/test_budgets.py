"""The SQS surface and budgets (CONTRACT §18), driven by boto3 against a real
gunicorn: a send a reject_new budget at its limit refuses is the error
``BudgetExhausted`` (HTTP 429) naming the budget; in a batch, that entry
fails and the others are sent."""

import pytest
from botocore.exceptions import ClientError

from tests.support import exhausted_budget
from todos import store

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_send_into_an_exhausted_reject_new_scope_is_budget_exhausted(make_sqs):
    endpoint, _, client = make_sqs()
    url = client.create_queue(QueueName="jobs")["QueueUrl"]
    other = client.create_queue(QueueName="other")["QueueUrl"]
    budget = exhausted_budget(store.Scope.for_endpoint(endpoint), "jobs")

    with pytest.raises(ClientError) as caught:
        client.send_message(QueueUrl=url, MessageBody="hello")
    error = caught.value.response
    assert error["Error"]["Code"] == "BudgetExhausted"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert budget.id in error["Error"]["Message"]

    batch = client.send_message_batch(
        QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}]
    )
    assert batch["Failed"][0]["Code"] == "BudgetExhausted"
    assert batch["Failed"][0]["SenderFault"] is True
    assert client.send_message(QueueUrl=other, MessageBody="fine")["MessageId"]
