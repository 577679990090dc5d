"""The SQS surface's wire protocol with hand-built (and hand-broken) requests.

Signed with botocore's own SigV4 signer, so what is broken is only what each
test breaks: the target, the JSON, the size, the signature. Every answer is
SQS's error shape, never a 500, and nothing is half-applied.
"""

import json
import urllib.error
import urllib.request

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from todos import store

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


@pytest.fixture
def keyed(make_sqs):
    endpoint, issued, client = make_sqs()
    return endpoint, issued, client


def send(
    url,
    body,
    *,
    target="AmazonSQS.ListQueues",
    issued=None,
    headers=None,
    path="/",
    unsigned=None,
):
    """POST a body to ``path`` (signed when ``issued`` is given; the headers of
    ``unsigned`` are added after signing): (status, headers, json)."""
    data = body if isinstance(body, bytes) else body.encode()
    request = AWSRequest(
        method="POST",
        url=url + path,
        data=data,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            **({"X-Amz-Target": target} if target else {}),
            **(headers or {}),
        },
    )
    if issued is not None:
        creds = Credentials(issued.access_key_id, issued.secret_access_key)
        SigV4Auth(creds, "sqs", "us-east-1").add_auth(request)
    prepared = urllib.request.Request(
        url + path,
        data=data,
        headers={**dict(request.headers.items()), **(unsigned or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(prepared, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, error.headers, json.loads(raw) if raw else None


def assert_error(answer, status, shape, query_code=None):
    got_status, headers, body = answer
    assert got_status == status, body
    assert body["__type"] == f"com.amazonaws.sqs#{shape}"
    assert body["message"]
    assert headers["x-amzn-query-error"] == f"{query_code or shape};Sender"
    assert headers["Content-Type"] == "application/x-amz-json-1.0"
    # The Board's sessions and CSRF are not in the way: no cookie is set.
    assert headers.get("Set-Cookie") is None


def test_get_root_still_leads_to_the_board(sqs_url):
    request = urllib.request.Request(sqs_url + "/", method="GET")
    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as caught:
        opener.open(request, timeout=5)
    assert caught.value.code == 302
    assert caught.value.headers["Location"] == "/board/"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_an_unsigned_request_is_missing_authentication_token(sqs_url, db):
    assert_error(send(sqs_url, "{}"), 403, "MissingAuthenticationToken")


def test_a_mis_signed_request_is_signature_does_not_match(sqs_url, keyed):
    _, issued, _ = keyed
    status, headers, body = send(sqs_url, "{}", issued=issued)
    assert status == 200
    # Sign one body, send another.
    request = AWSRequest(
        method="POST",
        url=sqs_url + "/",
        data=b'{"QueueNamePrefix": "a"}',
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.ListQueues",
        },
    )
    creds = Credentials(issued.access_key_id, issued.secret_access_key)
    SigV4Auth(creds, "sqs", "us-east-1").add_auth(request)
    tampered = urllib.request.Request(
        sqs_url + "/",
        data=b'{"QueueNamePrefix": "b"}',
        headers=dict(request.headers.items()),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(tampered, timeout=5)
    assert caught.value.code == 403
    assert json.loads(caught.value.read())["__type"].endswith("#SignatureDoesNotMatch")


def test_a_signature_for_another_service_is_refused(sqs_url, keyed):
    _, issued, _ = keyed
    request = AWSRequest(
        method="POST",
        url=sqs_url + "/",
        data=b"{}",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    creds = Credentials(issued.access_key_id, issued.secret_access_key)
    SigV4Auth(creds, "s3", "us-east-1").add_auth(request)
    prepared = urllib.request.Request(
        sqs_url + "/", data=b"{}", headers=dict(request.headers.items()), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(prepared, timeout=5)
    assert caught.value.code == 403


def test_an_unknown_action_is_invalid_action(sqs_url, keyed):
    answer = send(sqs_url, "{}", target="AmazonSQS.LaunchRockets", issued=keyed[1])
    assert_error(answer, 400, "InvalidAction")
    assert_error(
        send(sqs_url, "{}", target=None, issued=keyed[1]), 400, "InvalidAction"
    )


def test_a_known_but_unsupported_action_is_unsupported_operation(sqs_url, keyed):
    answer = send(sqs_url, "{}", target="AmazonSQS.AddPermission", issued=keyed[1])
    assert_error(
        answer,
        400,
        "UnsupportedOperation",
        "AWS.SimpleQueueService.UnsupportedOperation",
    )


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '"text"', "\xff"])
def test_malformed_json_is_a_serialization_exception(sqs_url, keyed, body):
    raw = body.encode("latin-1")
    answer = send(sqs_url, raw, target="AmazonSQS.CreateQueue", issued=keyed[1])
    assert_error(answer, 400, "SerializationException")
    assert not store.list_queues(store.Scope.for_endpoint(keyed[0]))


def test_wrong_member_types_are_serialization_exceptions(sqs_url, keyed):
    body = json.dumps({"QueueName": 5})
    answer = send(sqs_url, body, target="AmazonSQS.CreateQueue", issued=keyed[1])
    assert_error(answer, 400, "SerializationException")


def test_a_missing_member_is_missing_parameter(sqs_url, keyed):
    answer = send(sqs_url, "{}", target="AmazonSQS.CreateQueue", issued=keyed[1])
    assert_error(answer, 400, "MissingParameter")


def test_an_oversize_body_is_request_entity_too_large(sqs_url, keyed):
    body = json.dumps({"QueueName": "q", "x": "y" * (5 * 1024 * 1024)})
    answer = send(sqs_url, body, target="AmazonSQS.CreateQueue", issued=keyed[1])
    assert_error(answer, 413, "RequestEntityTooLarge")
    assert not store.list_queues(store.Scope.for_endpoint(keyed[0]))


def test_eleven_batch_entries_apply_nothing(sqs_url, keyed):
    endpoint, issued, client = keyed
    url = client.create_queue(QueueName="q")["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "x"} for i in range(11)]
    body = json.dumps({"QueueUrl": url, "Entries": entries})
    answer = send(sqs_url, body, target="AmazonSQS.SendMessageBatch", issued=issued)
    assert_error(
        answer,
        400,
        "TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    )
    assert store.get_queue(store.Scope.for_endpoint(endpoint), "q").pending == 0


def test_duplicate_entry_ids_apply_nothing(sqs_url, keyed):
    endpoint, issued, client = keyed
    url = client.create_queue(QueueName="q")["QueueUrl"]
    entries = [{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}]
    body = json.dumps({"QueueUrl": url, "Entries": entries})
    answer = send(sqs_url, body, target="AmazonSQS.SendMessageBatch", issued=issued)
    assert_error(
        answer,
        400,
        "BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    )
    assert store.get_queue(store.Scope.for_endpoint(endpoint), "q").pending == 0


def test_a_session_token_is_refused(sqs_url, keyed):
    _, issued, _ = keyed
    request = AWSRequest(
        method="POST",
        url=sqs_url + "/",
        data=b"{}",
        headers={"X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    creds = Credentials(issued.access_key_id, issued.secret_access_key, "session")
    SigV4Auth(creds, "sqs", "us-east-1").add_auth(request)
    prepared = urllib.request.Request(
        sqs_url + "/", data=b"{}", headers=dict(request.headers.items()), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(prepared, timeout=5)
    assert json.loads(caught.value.read())["__type"].endswith("#InvalidClientTokenId")


def test_other_surfaces_still_answer_beside_the_sqs_root(sqs_url, keyed):
    with urllib.request.urlopen(sqs_url + "/healthz", timeout=5) as response:
        assert response.status == 200
    request = urllib.request.Request(sqs_url + "/api/v1/todos", method="GET")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 401


def test_an_unsigned_x_amz_target_cannot_replay_a_request_as_another_action(
    sqs_url, keyed
):
    """A body signed without its target cannot be sent as PurgeQueue."""
    endpoint, issued, client = keyed
    url = client.create_queue(QueueName="q")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="keep me")
    body = json.dumps({"QueueUrl": url})
    answer = send(
        sqs_url,
        body,
        target=None,
        issued=issued,
        unsigned={"X-Amz-Target": "AmazonSQS.PurgeQueue"},
    )
    assert_error(answer, 403, "SignatureDoesNotMatch")
    assert store.get_queue(store.Scope.for_endpoint(endpoint), "q").pending == 1


def test_a_post_to_a_queue_url_is_answered_in_sqs_error_shape(sqs_url, keyed):
    _, issued, client = keyed
    url = client.create_queue(QueueName="q")["QueueUrl"]
    path = "/" + url.split("/", 3)[3]
    body = json.dumps({"QueueUrl": url})
    target = "AmazonSQS.GetQueueAttributes"
    answer = send(sqs_url, body, target=target, issued=issued, path=path)
    assert_error(answer, 404, "InvalidAddress")
    # Unsigned, it is refused like any unsigned call.
    answer = send(sqs_url, body, target=target, path=path)
    assert_error(answer, 403, "MissingAuthenticationToken")


@pytest.mark.parametrize("target", ["AmazonSQS.CreateQueue", "AmazonSQS.ListQueues"])
def test_a_host_outside_allowed_hosts_is_refused_before_the_action(
    sqs_url, keyed, target
):
    endpoint, issued, _ = keyed
    body = json.dumps({"QueueName": "made"})
    answer = send(
        sqs_url, body, target=target, issued=issued, headers={"Host": "evil.example"}
    )
    assert_error(answer, 404, "InvalidAddress")
    assert not store.list_queues(store.Scope.for_endpoint(endpoint))
