"""Realistic demo work for the Board: endpoints, and todos in every state.

Used by the browser tests and the screenshots, and handy for trying the Board:

    .venv/bin/python manage.py shell -c \
        "from todos import board_demo; board_demo.seed()"

Everything goes through the store, as agents would do it: create, claim,
complete, fail (until some dead-letter).
"""

import hashlib

from django.contrib.auth import get_user_model

from todos import store
from todos.access import endpoints as lifecycle

ENDPOINTS = [
    ("triage-bot", "alice", ["github", "reviews"]),
    ("release-agent", "bob", ["deploys", "reviews"]),
    ("nightly-etl", "carol", ["*"]),
]

# (endpoint, queue, title, payload, what happens to it)
TODOS = [
    (
        "triage-bot",
        "github",
        "Label issue #2291: crash on empty payload",
        {"repo": "acme/switchboard", "issue": 2291, "action": "opened"},
        "pending",
    ),
    (
        "triage-bot",
        "github",
        "Label issue #2290: docs typo in README",
        {"repo": "acme/switchboard", "issue": 2290, "action": "opened"},
        "done",
    ),
    (
        "triage-bot",
        "github",
        "Summarize discussion #88 for the weekly notes",
        {"repo": "acme/switchboard", "discussion": 88},
        "claimed",
    ),
    (
        "triage-bot",
        "reviews",
        "Review PR #1432: fix race in lease renewal",
        {"repo": "acme/switchboard", "pr": 1432, "head": "9f2c1e7"},
        "dead_letter",
    ),
    (
        "triage-bot",
        "reviews",
        "Review PR #1437: bump psycopg to 3.2.4",
        {"repo": "acme/switchboard", "pr": 1437, "head": "1b7d0a2"},
        "retry",
    ),
    (
        "triage-bot",
        "reviews",
        "Review PR #1440: add retention command",
        {"repo": "acme/switchboard", "pr": 1440, "head": "c0ffee1"},
        "pending",
    ),
    (
        "release-agent",
        "deploys",
        "Deploy api v2.14.0 to staging",
        {"service": "api", "version": "2.14.0", "env": "staging"},
        "done",
    ),
    (
        "release-agent",
        "deploys",
        "Deploy api v2.14.0 to production",
        {"service": "api", "version": "2.14.0", "env": "production"},
        "dead_letter",
    ),
    (
        "release-agent",
        "deploys",
        "Roll back worker v1.9.3 in eu-west",
        {"service": "worker", "version": "1.9.2", "region": "eu-west"},
        "claimed",
    ),
    (
        "release-agent",
        "reviews",
        "Check changelog of v2.14.0",
        {"version": "2.14.0"},
        "pending",
    ),
    (
        "nightly-etl",
        "imports",
        "Import invoices for 2026-11-29",
        {"source": "s3://acme-billing/2026-11-29.csv", "rows": 18234},
        "done",
    ),
    (
        "nightly-etl",
        "imports",
        "Import refunds for 2026-11-29",
        {"source": "s3://acme-billing/refunds-2026-11-29.csv"},
        "dead_letter",
    ),
    (
        "nightly-etl",
        "imports",
        "Import invoices for 2026-11-30",
        {"source": "s3://acme-billing/2026-11-30.csv"},
        "pending",
    ),
    (
        "nightly-etl",
        "reports",
        "Rebuild the revenue dashboard",
        {"dashboard": "revenue", "window": "30d"},
        "retry",
    ),
]

ERRORS = {
    "Review PR #1432: fix race in lease renewal": [
        "TimeoutError: GitHub API did not answer within 30s (GET /repos/acme/"
        "switchboard/pulls/1432/files)",
        "TimeoutError: GitHub API did not answer within 30s",
        "RuntimeError: diff too large for the review model (412 files, limit 300)",
    ],
    "Deploy api v2.14.0 to production": [
        "deploy blocked: staging health check failed (HTTP 503 from /healthz)",
        "deploy blocked: change freeze active until 2026-12-01T08:00Z",
    ],
    "Import refunds for 2026-11-29": [
        "botocore.exceptions.NoSuchKey: refunds-2026-11-29.csv does not exist",
    ],
    "Review PR #1437: bump psycopg to 3.2.4": ["CI still running; will look again"],
    "Rebuild the revenue dashboard": [
        "psycopg.errors.QueryCanceled: canceling statement due to statement timeout"
    ],
}

RESULTS = {
    "Label issue #2290: docs typo in README": {"labels": ["docs", "good first issue"]},
    "Deploy api v2.14.0 to staging": {
        "url": "https://staging.acme.dev",
        "duration_s": 184,
    },
    "Import invoices for 2026-11-29": {"rows": 18234, "rejected": 3},
}

WORKERS = {
    "triage-bot": "claude-triage-1",
    "release-agent": "deployer-7",
    "nightly-etl": "etl-runner-2",
}


def seed():
    """Create the demo endpoints and todos; return {name: Endpoint}."""
    users = get_user_model().objects
    endpoints = {}
    for name, owner, queues in ENDPOINTS:
        user, _ = users.get_or_create(username=owner)
        endpoints[name], _ = lifecycle.create(name, user, queues)
    for name, queue, title, payload, fate in TODOS:
        _play(endpoints[name], queue, title, payload, fate)
    return endpoints


def _play(endpoint, queue, title, payload, fate):
    scope = store.Scope.for_endpoint(endpoint)
    errors = ERRORS.get(title, ["failed"])
    max_attempts = len(errors) if fate == "dead_letter" else 5
    todo, _ = store.create_todo(
        scope,
        queue=queue,
        title=title,
        payload=payload,
        max_attempts=max_attempts,
        idempotency_key="demo-" + hashlib.sha1(title.encode()).hexdigest()[:10],
        actor="webhook:github",
    )
    if fate == "pending":
        return todo
    worker = WORKERS[endpoint.name]
    if fate == "claimed":
        return store.claim_todo(scope, todo.id, worker)
    if fate == "done":
        store.claim_todo(scope, todo.id, worker)
        return store.complete_todo(scope, todo.id, worker, result=RESULTS.get(title))
    rounds = errors if fate == "dead_letter" else errors[:1]
    for error in rounds:
        # A parked retry is claimable again only once its window opens; the
        # demo retries it explicitly, as an impatient agent would.
        if todo.state == "failed":
            store.retry_todo(scope, todo.id, actor=worker)
        store.claim_todo(scope, todo.id, worker)
        todo = store.fail_todo(scope, todo.id, worker, error=error)
    return todo
