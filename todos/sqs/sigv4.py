"""AWS Signature Version 4, verified on the server side.

The client signs a canonical form of its request with a key derived from its
secret, the date, the region and the service; the server rebuilds the same
canonical request from what it received, derives the same key from the stored
secret and compares the two signatures in constant time. The steps follow
AWS's "Create a signed AWS API request" guide, and tests/sqs/sigv4_vectors
holds AWS's own test suite (as botocore ships it) that this module must pass.

Only the ``Authorization`` header form is accepted (no presigned query
strings), with ``X-Amz-Date``; the payload hash is always computed from the
body that arrived, never taken from a header.
"""

import contextlib
import functools
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=15)
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"

AUTHORIZATION_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+"
    r"Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed_headers>[^,\s]+)\s*,\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})\s*$"
)


class SignatureError(Exception):
    """A request that cannot be authenticated; ``code`` is the AWS error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Authorization:
    """The parts of an ``Authorization: AWS4-HMAC-SHA256 …`` header."""

    access_key_id: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def parse_authorization(header: str | None) -> Authorization:
    """Parse the Authorization header, or raise SignatureError."""
    if not header:
        raise SignatureError(
            "MissingAuthenticationToken",
            "Request is missing Authentication Token",
        )
    match = AUTHORIZATION_RE.match(header.strip())
    if match is None:
        raise SignatureError(
            "IncompleteSignature",
            "Authorization header requires 'Credential', 'SignedHeaders' and "
            "'Signature' of the AWS4-HMAC-SHA256 algorithm",
        )
    parts = match["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not all(parts[:4]):
        raise SignatureError(
            "IncompleteSignature",
            "Credential must be <key id>/<date>/<region>/<service>/aws4_request",
        )
    signed = tuple(match["signed_headers"].split(";"))
    if list(signed) != sorted(set(signed)) or any(
        name != name.lower() for name in signed
    ):
        raise SignatureError(
            "IncompleteSignature", "SignedHeaders must be lowercase and sorted"
        )
    key_id, date, region, service = parts[:4]
    return Authorization(key_id, date, region, service, signed, match["signature"])


def _raw_bytes(text: str) -> bytes:
    # A WSGI server hands the raw request line over as latin-1 text; a caller
    # holding a real string (a test vector) has UTF-8 in mind.
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


def canonical_uri(raw_path: str) -> str:
    """Normalize the path and URI-encode each segment (again), as non-S3 services."""
    path = raw_path.split("?", 1)[0]
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    trailing = "/" if path.endswith("/") and segments else ""
    encoded = "/".join(quote(_raw_bytes(segment), safe="-_.~") for segment in segments)
    return "/" + encoded + trailing


def canonical_query(query_string: str) -> str:
    """Sort the decoded query parameters and encode them as SigV4 does."""
    pairs = []
    for item in query_string.split("&") if query_string else ():
        if not item:
            continue
        key, _, value = item.partition("=")
        pairs.append(
            (
                quote(unquote(key), safe="-_.~"),
                quote(unquote(value), safe="-_.~"),
            )
        )
    return "&".join(f"{key}={value}" for key, value in sorted(pairs))


def canonical_header_value(value: str) -> str:
    return " ".join(value.split())


def canonical_request(
    method: str,
    raw_path: str,
    query_string: str,
    headers: Mapping[str, str],
    signed: Iterable[str],
    payload: bytes,
) -> str:
    """Return the canonical request; ``headers`` maps lowercase names to values."""
    lines = [method.upper(), canonical_uri(raw_path), canonical_query(query_string)]
    for name in signed:
        value = headers.get(name)
        if value is None:
            raise SignatureError(
                "SignatureDoesNotMatch", f"the signed header {name!r} is missing"
            )
        lines.append(f"{name}:{canonical_header_value(value)}")
    lines.append("")
    lines.append(";".join(signed))
    lines.append(hashlib.sha256(payload).hexdigest())
    return "\n".join(lines)


def string_to_sign(amz_date: str, scope: str, creq: str) -> str:
    digest = hashlib.sha256(creq.encode("utf-8")).hexdigest()
    return "\n".join([ALGORITHM, amz_date, scope, digest])


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.digest(key, text.encode("utf-8"), "sha256")


# A signing key is a function of the secret, the day, the region and the
# service alone, so each is derived once (four HMACs a request before): a
# rotated key has another secret, and a revoked or rotated key's secret is
# never looked up again (todos.access.auth), so nothing kept here can sign
# for a key that is gone.
@functools.lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(("AWS4" + secret).encode("utf-8"), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def signature(
    secret: str, authorization: Authorization, amz_date: str, creq: str
) -> str:
    key = signing_key(
        secret, authorization.date, authorization.region, authorization.service
    )
    sts = string_to_sign(amz_date, authorization.scope, creq)
    return _hmac(key, sts).hex()


# AMZ_DATE_FORMAT's shape, read without strptime (a tenth of its CPU).
AMZ_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z", re.ASCII)


def parse_amz_date(value: str | None) -> datetime:
    matched = AMZ_DATE.fullmatch(value or "")
    if matched is not None:
        # The right shape may still be no date (month 13, hour 24).
        with contextlib.suppress(ValueError):
            year, month, day, hour, minute, second = map(int, matched.groups())
            return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    raise SignatureError(
        "IncompleteSignature",
        "the X-Amz-Date header must be a date like 20150830T123600Z",
    )


def check_signature(
    *,
    authorization: Authorization,
    secret: str,
    method: str,
    raw_path: str,
    query_string: str,
    headers: Mapping[str, str],
    payload: bytes,
    now: datetime,
    service: str,
) -> None:
    """Raise SignatureError unless the request is signed by ``secret`` in time.

    ``headers`` maps lowercase header names to their (combined) values.
    """
    if authorization.service != service:
        raise SignatureError(
            "SignatureDoesNotMatch",
            f"Credential should be scoped to correct service: '{service}'.",
        )
    if "host" not in authorization.signed_headers:
        raise SignatureError("SignatureDoesNotMatch", "the Host header must be signed")
    # An unsigned x-amz-* header could be changed by anyone who captured the
    # request: X-Amz-Target would turn a signed GetQueueAttributes into a
    # PurgeQueue of the same body.
    unsigned = sorted(
        name
        for name in headers
        if name.startswith("x-amz-") and name not in authorization.signed_headers
    )
    if unsigned:
        raise SignatureError(
            "SignatureDoesNotMatch",
            "There were headers present in the request which were not signed: "
            + ", ".join(unsigned),
        )
    amz_date = headers.get("x-amz-date", "")
    signed_at = parse_amz_date(amz_date)
    if amz_date[:8] != authorization.date:
        raise SignatureError(
            "SignatureDoesNotMatch",
            "Date in Credential scope does not match the X-Amz-Date header",
        )
    if abs(now - signed_at) > MAX_SKEW:
        raise SignatureError(
            "SignatureDoesNotMatch",
            f"Signature expired: {amz_date} is now earlier than "
            f"{(now - MAX_SKEW).strftime(AMZ_DATE_FORMAT)} "
            f"({now.strftime(AMZ_DATE_FORMAT)} - 15 min.)"
            if signed_at < now
            else f"Signature not yet current: {amz_date} is still later than "
            f"{(now + MAX_SKEW).strftime(AMZ_DATE_FORMAT)} "
            f"({now.strftime(AMZ_DATE_FORMAT)} + 15 min.)",
        )
    creq = canonical_request(
        method, raw_path, query_string, headers, authorization.signed_headers, payload
    )
    expected = signature(secret, authorization, amz_date, creq)
    if not hmac.compare_digest(expected, authorization.signature):
        raise SignatureError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature "
            "you provided. Check your AWS Secret Access Key and signing method.",
        )
