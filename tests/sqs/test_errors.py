"""The SQS error a store failure is answered with, and what boto3 makes of it."""

import botocore.session
import pytest
from botocore import parsers, retryhandler, translate
from botocore.awsrequest import AWSResponse
from botocore.retries.standard import RetryContext, StandardRetryConditions

from tests.support import deadlocked_heartbeat
from todos import store
from todos.sqs import protocol


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_is_service_unavailable_saying_busy_which_boto3_retries(
    make_endpoint,
):
    """A deadlock is a busy database, not a down one: AWS's own 503
    ServiceUnavailable (a Receiver fault), which botocore retries in both its
    legacy and standard modes, its message saying busy."""
    scope = store.Scope.for_endpoint(make_endpoint("sqs-deadlock"))
    _, raised = deadlocked_heartbeat(scope)

    error = protocol.error_for(raised)
    response = protocol.error_response(error.shape, error.message)

    assert response.status_code == 503
    assert response["x-amzn-query-error"] == "ServiceUnavailable;Receiver"
    session = botocore.session.get_session()
    operation = session.get_service_model("sqs").operation_model(
        "ChangeMessageVisibility"
    )
    headers = dict(response.items())
    parsed = parsers.create_parser("json").parse(
        {"status_code": 503, "headers": headers, "body": response.content},
        operation.output_shape,
    )
    assert parsed["Error"]["Code"] == "ServiceUnavailable"
    message = parsed["Error"]["Message"]
    assert message.startswith("the database is busy") and "unavailable" not in message
    answer = AWSResponse("http://sqs", 503, headers, None)
    standard = RetryContext(
        1, operation_model=operation, parsed_response=parsed, http_response=answer
    )
    assert StandardRetryConditions().is_retryable(standard)
    retry = session.get_component("data_loader").load_data("_retry")
    legacy = retryhandler.create_checker_from_retry_config(
        translate.build_retry_config("sqs", retry["retry"], retry["definitions"]),
        "ChangeMessageVisibility",
    )
    assert legacy(
        attempt_number=1,
        response=(answer, parsed),
        caught_exception=None,
        retries_context={},
    )
