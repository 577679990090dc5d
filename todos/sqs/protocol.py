"""AWS JSON 1.0 plumbing of the SQS surface: errors, responses, body, SigV4.

SQS answers errors as ``{"__type": "com.amazonaws.sqs#<Shape>", "message": …}``
plus an ``x-amzn-query-error: <legacy code>;Sender`` header. botocore reads
the header to raise the modelled exception (``client.exceptions.
QueueDoesNotExist``) while ``Error.Code`` keeps the legacy query-protocol code
(``AWS.SimpleQueueService.NonExistentQueue``) that older code compares with.
"""

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from todos import store
from todos.access import auth, crypto
from todos.models import Endpoint
from todos.sqs import sigv4
from todos.web import http

logger = logging.getLogger("switchboard.sqs")

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
SERVICE = "sqs"

# Shape -> (HTTP status, legacy query error code). The codes are SQS's own.
ERRORS = {
    "QueueDoesNotExist": (400, "AWS.SimpleQueueService.NonExistentQueue"),
    "QueueNameExists": (400, "QueueAlreadyExists"),
    "ReceiptHandleIsInvalid": (400, "ReceiptHandleIsInvalid"),
    "MessageNotInflight": (400, "AWS.SimpleQueueService.MessageNotInflight"),
    "InvalidAttributeName": (400, "InvalidAttributeName"),
    "InvalidAttributeValue": (400, "InvalidAttributeValue"),
    "InvalidMessageContents": (400, "InvalidMessageContents"),
    "InvalidParameterValue": (400, "InvalidParameterValue"),
    "MissingParameter": (400, "MissingParameter"),
    "EmptyBatchRequest": (400, "AWS.SimpleQueueService.EmptyBatchRequest"),
    "TooManyEntriesInBatchRequest": (
        400,
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    ),
    "BatchEntryIdsNotDistinct": (
        400,
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    ),
    "InvalidBatchEntryId": (400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    "BatchRequestTooLong": (400, "AWS.SimpleQueueService.BatchRequestTooLong"),
    "UnsupportedOperation": (400, "AWS.SimpleQueueService.UnsupportedOperation"),
    "InvalidAction": (400, "InvalidAction"),
    "SerializationException": (400, "SerializationException"),
    "RequestEntityTooLarge": (413, "RequestEntityTooLarge"),
    "AccessDenied": (403, "AccessDenied"),
    "MissingAuthenticationToken": (403, "MissingAuthenticationToken"),
    "IncompleteSignature": (400, "IncompleteSignature"),
    "InvalidClientTokenId": (403, "InvalidClientTokenId"),
    "SignatureDoesNotMatch": (403, "SignatureDoesNotMatch"),
    "InvalidAddress": (404, "InvalidAddress"),
    # A reject_new budget at its limit (CONTRACT §18): a throttle the caller
    # must not retry at once; the message names the budget.
    "BudgetExhausted": (429, "BudgetExhausted"),
    "ServiceUnavailable": (503, "ServiceUnavailable"),
    "InternalFailure": (500, "InternalFailure"),
}


class SqsRequest(HttpRequest):
    """What the SQS surface adds to a request, for the request log: the
    endpoint its signature authenticated and the action it named."""

    endpoint: Endpoint
    sqs_action: str


class SqsError(Exception):
    """A failure answered in SQS's error shape; ``shape`` is a key of ERRORS."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        self.shape = shape
        self.message = message


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def error_response(shape: str, message: str) -> HttpResponse:
    status, query_code = ERRORS[shape]
    response = HttpResponse(
        json.dumps({"__type": f"com.amazonaws.sqs#{shape}", "message": message}),
        status=status,
        content_type=CONTENT_TYPE,
    )
    fault = "Receiver" if status >= 500 else "Sender"
    response["x-amzn-query-error"] = f"{query_code};{fault}"
    response["x-amzn-RequestId"] = str(uuid.uuid4())
    response.error_code = shape  # type: ignore[attr-defined]  # the request log's
    return response


def json_response(data: dict[str, Any]) -> HttpResponse:
    """The answer's JSON as UTF-8; it cannot fail to encode.

    An answer may echo what a caller sent (a batch entry's error names the
    attribute that was wrong, lone surrogates and all): such text is sent as
    JSON escapes rather than failing after the action has been applied.
    """
    response = HttpResponse(http.dumps(data), content_type=CONTENT_TYPE)
    response["x-amzn-RequestId"] = str(uuid.uuid4())
    return response


def error_for(exc: BaseException) -> SqsError | None:
    """Map a store or database failure to its SqsError, or None when unknown."""
    if isinstance(exc, SqsError):
        return exc
    if isinstance(exc, store.QueueNotGranted):
        return SqsError("AccessDenied", exc.detail)
    if isinstance(exc, store.BudgetExhausted):
        return SqsError("BudgetExhausted", exc.detail)
    if isinstance(exc, store.Unavailable):
        # What happened: the database is down, or a statement timed out.
        return SqsError("ServiceUnavailable", exc.detail)
    if store.is_deadlock(exc):
        # A deadlock no store call mapped (an ORM statement's): busy, too.
        return error_for(store.Deadlocked("database", exc))
    if isinstance(exc, OperationalError | InterfaceError):
        return SqsError(
            "ServiceUnavailable", "the database is unavailable; try again shortly"
        )
    return None


def check_host(request: HttpRequest) -> None:
    """Refuse a Host outside ALLOWED_HOSTS before anything else runs.

    Queue URLs are made of the request's Host, so an action must not run
    (CreateQueue would create, then fail to answer) for a host not served.
    """
    try:
        request.get_host()
    except DisallowedHost:
        raise SqsError(
            "InvalidAddress", "The Host header names a host this server does not serve."
        ) from None


def read_body(request: HttpRequest) -> bytes:
    """Return the raw body, bounded by SWITCHBOARD_SQS_MAX_REQUEST_BYTES."""
    try:
        return http.read_body(request, settings.SWITCHBOARD_SQS_MAX_REQUEST_BYTES)
    except http.BodyTooLarge as exc:
        raise SqsError("RequestEntityTooLarge", exc.detail) from None
    except http.BadBody as exc:
        raise SqsError("SerializationException", exc.detail) from None


def parse_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body ({} when empty), or raise SerializationException."""
    if not raw.strip():
        return {}
    try:
        data = http.loads(raw)
    except (ValueError, RecursionError):
        raise SqsError("SerializationException", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise SqsError("SerializationException", "the body must be a JSON object")
    return data


def _headers(meta: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers by lowercase name, as a WSGI server combined them."""
    headers: dict[str, str] = {}
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            headers[key[5:].replace("_", "-").lower()] = value
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value != "":
            headers[key.replace("_", "-").lower()] = value
    return headers


def _raw_path(request: HttpRequest) -> str:
    # gunicorn keeps the request line as sent; elsewhere PATH_INFO is decoded
    # and its encoding is redone the way a client would have sent it.
    raw: str | None = request.META.get("RAW_URI")
    if raw:
        return raw.split("?", 1)[0]
    return quote(request.path, safe="/-_.~")


class Caller:
    """The authenticated SQS caller: endpoint, scope, account id, signing region."""

    def __init__(
        self, endpoint: Endpoint, account_id: str, region: str, access_key_id: str
    ) -> None:
        self.endpoint = endpoint
        self.account_id = account_id
        self.region = region
        self.access_key_id = access_key_id
        self.scope = store.Scope.for_endpoint(endpoint)


def authenticate(request: SqsRequest, raw_body: bytes) -> Caller:
    """Verify the request's SigV4 signature; return its Caller or raise SqsError."""
    headers, authorization = _authorization(request)
    try:
        found = auth.endpoint_for_access_key(authorization.access_key_id)
    except (OperationalError, InterfaceError) as exc:
        raise store.Unavailable("authenticate", exc) from exc
    return _caller(request, raw_body, headers, authorization, found)


async def aauthenticate(request: SqsRequest, raw_body: bytes) -> Caller:
    """``authenticate`` for the async view: the key's lookup awaited in the loop."""
    headers, authorization = _authorization(request)
    try:
        found = await auth.aendpoint_for_access_key(authorization.access_key_id)
    except (OperationalError, InterfaceError) as exc:
        raise store.Unavailable("authenticate", exc) from exc
    return _caller(request, raw_body, headers, authorization, found)


def _authorization(request: SqsRequest) -> tuple[dict[str, str], sigv4.Authorization]:
    """The request's headers and its parsed SigV4 Authorization."""
    headers = _headers(request.META)
    try:
        authorization = sigv4.parse_authorization(headers.get("authorization"))
        if http.text_problem(authorization.access_key_id):
            raise sigv4.SignatureError(
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            )
        if "x-amz-security-token" in headers:
            raise sigv4.SignatureError(
                "InvalidClientTokenId",
                "session tokens are not supported: sign with the endpoint's key",
            )
    except sigv4.SignatureError as exc:
        raise SqsError(exc.code, exc.message) from None
    return headers, authorization


def _caller(
    request: SqsRequest,
    raw_body: bytes,
    headers: dict[str, str],
    authorization: sigv4.Authorization,
    found: tuple[Endpoint, str, str] | None,
) -> Caller:
    """Check the signature with the key ``found``; the Caller it proves."""
    try:
        if found is None:
            raise sigv4.SignatureError(
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            )
        endpoint, ciphertext, account_id = found
        try:
            secret = crypto.decrypt(ciphertext)
        except crypto.DecryptionFailed:
            logger.error(
                "sqs: a stored secret does not decrypt (SWITCHBOARD_ENCRYPTION_KEY?)",
                extra={"fields": {"endpoint_id": str(endpoint.id)}},
            )
            raise sigv4.SignatureError(
                "InvalidClientTokenId",
                "The security token included in the request is invalid.",
            ) from None
        sigv4.check_signature(
            authorization=authorization,
            secret=secret,
            method=request.method or "",
            raw_path=_raw_path(request),
            query_string=request.META.get("QUERY_STRING", ""),
            headers=headers,
            payload=raw_body,
            now=timezone.now(),
            service=SERVICE,
        )
    except sigv4.SignatureError as exc:
        raise SqsError(exc.code, exc.message) from None
    request.endpoint = endpoint
    return Caller(
        endpoint, account_id, authorization.region, authorization.access_key_id
    )
