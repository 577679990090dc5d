"""SigV4 verification against AWS's own test suite (tests/sqs/sigv4_vectors)."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from todos.sqs import sigv4

VECTORS = Path(__file__).parent / "sigv4_vectors"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SIGNED_AT = datetime(2015, 8, 30, 12, 36, tzinfo=UTC)
NAMES = sorted(path.stem for path in VECTORS.glob("*.sreq"))


def parse_signed_request(text):
    """Split a .sreq file into method, path, query, headers and body."""
    head, _, body = text.partition("\n\n")
    request_line, *header_lines = head.split("\n")
    # A path may hold a space (get-space): the protocol is the last word.
    method, rest = request_line.split(" ", 1)
    target = rest.rsplit(" ", 1)[0]
    path, _, query = target.partition("?")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        # Repeated headers are combined in order, as a WSGI server does.
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    authorization = headers.pop("authorization").strip()
    return method, path, query, headers, body.encode("utf-8"), authorization


def check(name, *, mutate=None, now=SIGNED_AT, secret=SECRET):
    method, path, query, headers, body, header = parse_signed_request(
        (VECTORS / f"{name}.sreq").read_text(encoding="utf-8")
    )
    if mutate:
        method, path, query, headers, body = mutate(method, path, query, headers, body)
    authorization = sigv4.parse_authorization(header)
    sigv4.check_signature(
        authorization=authorization,
        secret=secret,
        method=method,
        raw_path=path,
        query_string=query,
        headers=headers,
        payload=body,
        now=now,
        service="service",
    )
    return method, path, query, headers, body, authorization


def test_the_suite_is_here():
    assert len(NAMES) >= 25


@pytest.mark.parametrize("name", NAMES)
def test_canonical_request_matches_the_suite(name):
    method, path, query, headers, body, header = parse_signed_request(
        (VECTORS / f"{name}.sreq").read_text(encoding="utf-8")
    )
    authorization = sigv4.parse_authorization(header)
    creq = sigv4.canonical_request(
        method, path, query, headers, authorization.signed_headers, body
    )
    assert creq == (VECTORS / f"{name}.creq").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", NAMES)
def test_signature_of_the_suite_verifies(name):
    check(name)


@pytest.mark.parametrize("name", NAMES)
def test_signature_of_the_suite_fails_with_another_secret(name):
    with pytest.raises(sigv4.SignatureError) as caught:
        check(name, secret=SECRET[:-1] + "X")
    assert caught.value.code == "SignatureDoesNotMatch"


def test_a_changed_body_fails():
    def mutate(method, path, query, headers, body):
        return method, path, query, headers, body + b"x"

    with pytest.raises(sigv4.SignatureError):
        check("post-x-www-form-urlencoded", mutate=mutate)


def test_a_changed_signed_header_fails():
    def mutate(method, path, query, headers, body):
        return method, path, query, {**headers, "host": "evil.example"}, body

    with pytest.raises(sigv4.SignatureError):
        check("get-vanilla", mutate=mutate)


def test_a_changed_query_fails():
    def mutate(method, path, query, headers, body):
        return method, path, "Param1=value2", headers, body

    with pytest.raises(sigv4.SignatureError):
        check("get-vanilla-query-order-key-case", mutate=mutate)


@pytest.mark.parametrize("minutes, passes", [(14, True), (16, False), (-16, False)])
def test_clock_skew_of_fifteen_minutes_is_allowed(minutes, passes):
    from datetime import timedelta

    now = SIGNED_AT + timedelta(minutes=minutes)
    if passes:
        check("get-vanilla", now=now)
    else:
        with pytest.raises(sigv4.SignatureError, match="Signature"):
            check("get-vanilla", now=now)


@pytest.mark.parametrize(
    "header, code",
    [
        ("", "MissingAuthenticationToken"),
        ("Bearer abc", "IncompleteSignature"),
        (
            "AWS4-HMAC-SHA256 Credential=AKID/20150830/us-east-1/service, "
            "SignedHeaders=host, Signature=" + "0" * 64,
            "IncompleteSignature",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKID/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=x-amz-date;host, Signature=" + "0" * 64,
            "IncompleteSignature",
        ),
    ],
)
def test_malformed_authorization_headers_are_refused(header, code):
    with pytest.raises(sigv4.SignatureError) as caught:
        sigv4.parse_authorization(header)
    assert caught.value.code == code


def test_amz_date_is_read_strictly_without_strptime():
    assert sigv4.parse_amz_date("20150830T123600Z") == SIGNED_AT
    for bad in (
        None,
        "",
        "20150830T123600",  # no Z
        "2015083T123600Z",  # a digit short
        "20151330T123600Z",  # month 13
        "20150830T246000Z",  # hour 24
        "２０150830T123600Z",  # non-ASCII digits
        " 20150830T123600Z",
    ):
        with pytest.raises(sigv4.SignatureError) as raised:
            sigv4.parse_amz_date(bad)
        assert raised.value.code == "IncompleteSignature"


def test_an_unsigned_x_amz_target_is_refused():
    """A captured request cannot be replayed with another X-Amz-Target."""

    def mutate(method, path, query, headers, body):
        return method, path, query, {**headers, "x-amz-target": "Purge"}, body

    with pytest.raises(sigv4.SignatureError) as caught:
        check("get-vanilla", mutate=mutate)
    assert caught.value.code == "SignatureDoesNotMatch"
    assert "x-amz-target" in caught.value.message


def test_an_unsigned_x_amz_date_is_refused():
    method, path, query, headers, body, _ = parse_signed_request(
        (VECTORS / "get-vanilla.sreq").read_text(encoding="utf-8")
    )
    only_host = sigv4.Authorization(
        "AKIDEXAMPLE", "20150830", "us-east-1", "service", ("host",), "0" * 64
    )
    with pytest.raises(sigv4.SignatureError) as caught:
        sigv4.check_signature(
            authorization=only_host,
            secret=SECRET,
            method=method,
            raw_path=path,
            query_string=query,
            headers=headers,
            payload=body,
            now=SIGNED_AT,
            service="service",
        )
    assert "x-amz-date" in caught.value.message
