"""Typed errors: one class per status of the API's error table, each carrying
the error body (``{"error": "<code>", "detail": "…"}``) the server sent."""

from __future__ import annotations

import contextlib
from typing import Any


class SwitchboardError(Exception):
    """Anything this client raises."""


class TransportError(SwitchboardError):
    """The server could not be reached (or the answer was lost) and the call
    was not safe to repeat, or its retries ran out."""


class APIError(SwitchboardError):
    """The API answered with an error: its status, code and detail."""

    status: int = 0

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.error = str(body.get("error", ""))
        self.detail = str(body.get("detail", ""))
        super().__init__(f"{status} {self.error}: {self.detail}")


class BadRequest(APIError):
    """400: invalid JSON, or a field fails its rule (``detail`` names it)."""


class Unauthorized(APIError):
    """401: a missing, unknown or revoked token."""


class Forbidden(APIError):
    """403: a queue outside the endpoint's grant."""


class NotFound(APIError):
    """404: no such todo here, or no claimable work."""


class MethodNotAllowed(APIError):
    """405: the path does not take this method."""


class Conflict(APIError):
    """409: the todo is not in the state the call needs, or not this worker's."""


class LeaseSuperseded(Conflict):
    """409 for a lease token that is no longer the todo's current lease: the
    lease lapsed and another worker claimed it. Stop working on it."""


class PayloadTooLarge(APIError):
    """413: the body, a checkpoint or an answer schema is over its limit."""


class RateLimited(APIError):
    """429: too many requests, or a budget refuses new work
    (``retry_after`` holds the server's Retry-After, in seconds, if any)."""

    retry_after: float | None = None


class BudgetExhausted(RateLimited):
    """429 ``budget_exhausted``: a reject_new spend budget of the todo's
    endpoint, queue or group is at its limit (``detail`` names it). Creates
    are refused until its window ends (``retry_after``) or its owner raises
    it; retrying sooner does not help."""


class Unavailable(APIError):
    """503: the server cannot reach its database; try again."""


class ServerError(APIError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
    503: Unavailable,
}


def error_for(
    status: int, body: dict[str, Any], retry_after: str | None = None
) -> APIError:
    """The typed error for an error answer."""
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    if kind is Conflict and "lease superseded" in str(body.get("detail", "")):
        kind = LeaseSuperseded
    if kind is RateLimited and body.get("error") == "budget_exhausted":
        kind = BudgetExhausted
    error = kind(status, body)
    if isinstance(error, RateLimited) and retry_after:
        with contextlib.suppress(ValueError):
            error.retry_after = float(retry_after)
    return error
