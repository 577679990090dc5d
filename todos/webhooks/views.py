"""``POST /hooks/<slug>``: signed deliveries from GitHub and other senders.

The checks run cheapest-first and write nothing until the signature holds:
unknown slug 404, oversized body 413, a secret the server's keys cannot read
503, missing, wrong or stale signature 401, unusable delivery 400. Only then
does the delivery fan out (``deliveries.ingest``), all targets in one
transaction, answered 202 with each target's outcome (409 for a replay of a
timestamped delivery already received). A target whose scope a reject_new
budget at its limit refuses (CONTRACT §18) refuses the whole delivery: 429
``budget_exhausted`` with Retry-After, nothing applied and nothing
remembered, so the sender's redelivery is taken once the window ends or the
owner raises the budget (a paused budget's queue takes deliveries as a paused
queue does: they wait in it).
"""

import logging

from django.core.validators import slug_re
from django.views.decorators.csrf import csrf_exempt

from todos import store
from todos.access import crypto
from todos.models import WebhookSource
from todos.web import http
from todos.webhooks import deliveries, signatures

logger = logging.getLogger("switchboard.webhooks")


@csrf_exempt
def receive(request, slug):
    """Verify a signed delivery and fan it out to the source's routes."""
    if request.method != "POST":
        return http.error_response(
            405, "method_not_allowed", "deliveries are POSTed", {"Allow": "POST"}
        )
    try:
        return _receive(request, slug)
    except (store.Unavailable, *store.OUTAGES) as exc:
        # Nothing was applied (the delivery is one transaction): a 503 with
        # Retry-After, which senders redeliver. A deadlock is a busy database,
        # not a down one, and the answer says so.
        busy = store.is_deadlock(exc)
        logger.warning(
            "webhook delivery failed: "
            + ("deadlock, the database is up" if busy else "database unavailable"),
            extra={"fields": {"source": slug}},
        )
        detail = (
            "the database is busy: this delivery and a concurrent request"
            " waited for each other, and this one was stopped (a deadlock);"
            " nothing was applied, redeliver"
            if busy
            else "the database is unavailable; redeliver"
        )
        return http.error_response(
            503,
            "unavailable",
            detail,
            {"Retry-After": str(store.Unavailable.retry_after)},
        )


def _receive(request, slug):
    # A slug that no source can have is not looked up (a NUL, say, which
    # PostgreSQL refuses in text): the same 404 as an unknown one.
    source = (
        WebhookSource.objects.filter(slug=slug).first()
        if slug_re.fullmatch(slug)
        else None
    )
    if source is None:
        return http.error_response(404, "not_found", "no webhook source with this slug")
    try:
        body = http.read_body(request)
    except (http.BodyTooLarge, http.BadBody) as exc:
        return http.error_response(exc.status, exc.code, exc.detail)
    try:
        verified = signatures.verify(source, request.headers, body)
    except crypto.DecryptionFailed:
        # The secret was encrypted under a key this server no longer has (a
        # key rotation half done). Not the sender's fault: a 503, which senders
        # retry, and the log tells the operator which key to restore.
        logger.error(
            "webhook delivery failed: the source's secret does not decrypt with "
            "any configured key (SECRET_KEY_FALLBACKS, SWITCHBOARD_ENCRYPTION_KEY;"
            " see `manage.py check --deploy`)",
            extra={"fields": {"source": slug}},
        )
        return http.error_response(
            503,
            "secret_unreadable",
            "this source's signing secret cannot be read with the server's keys;"
            " nothing was applied, redeliver",
        )
    except signatures.BadSignature as exc:
        logger.warning(
            "webhook delivery rejected: missing, wrong or stale signature",
            extra={"fields": {"source": slug, "reason": exc.detail}},
        )
        return http.error_response(401, "unauthorized", exc.detail)
    try:
        delivery = deliveries.Delivery.parse(
            source, request.headers, body, request.content_type
        )
    except deliveries.BadDelivery as exc:
        return http.error_response(400, "bad_request", exc.detail)
    try:
        outcome = deliveries.ingest(source, delivery, verified)
    except store.Conflict as exc:
        return http.error_response(409, "conflict", exc.detail)
    except store.BudgetExhausted as exc:
        logger.warning(
            "webhook delivery refused: a budget is exhausted; nothing applied",
            extra={"fields": {"source": slug, "budget": exc.budget.id}},
        )
        return http.error_response(
            429,
            "budget_exhausted",
            f"{exc.detail}; nothing was applied, redeliver later",
            {"Retry-After": str(exc.retry_after)},
        )
    except signatures.Replayed as exc:
        logger.warning(
            "webhook delivery rejected: a replay",
            extra={"fields": {"source": slug, "delivery": delivery.delivery_id}},
        )
        return http.error_response(409, "replayed", exc.detail)
    return http.JsonResponse(outcome.to_dict(source, delivery), status=202)
