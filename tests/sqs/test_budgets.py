"""The SQS surface and budgets (CONTRACT §18), driven by boto3 against a real
gunicorn: a send a reject_new budget at its limit refuses is the error
``BudgetExhausted`` (HTTP 429) naming the budget; in a batch, that entry
fails and the others are sent."""

import pytest
from botocore.exceptions import ClientError

from todos import store

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_send_into_an_exhausted_reject_new_scope_is_budget_exhausted(make_sqs):
    endpoint, _, client = make_sqs()
    url = client.create_queue(QueueName="jobs")["QueueUrl"]
    other = client.create_queue(QueueName="other")["QueueUrl"]
    scope = store.Scope.for_endpoint(endpoint)
    budget = store.create_budget(
        scope,
        scope="queue",
        queue="jobs",
        window="day",
        limit_usd=1,
        action="reject_new",
    )
    store.report_usage(scope, queue="jobs", usage={"cost_usd": 1})

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
