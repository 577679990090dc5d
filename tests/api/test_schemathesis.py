"""Property-based conformance: the running API against its own OpenAPI document.

Schemathesis generates requests from /api/v1/openapi.json and sends them, with
a valid endpoint token, to a live server on the test database. Every response
must be documented, match its schema, and never be a 5xx.
"""

import pytest
import schemathesis
from django.conf import settings as settings_module
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, settings

from todos.access import tokens
from todos.api import openapi
from todos.models import Endpoint
from todos.store import MAX_CRON_CHARS

pytestmark = pytest.mark.slow

# The event stream never ends, so it cannot be called and validated as a whole;
# tests/api/test_events.py covers it.
schema = schemathesis.openapi.from_dict(openapi.build_document()).exclude(
    path="/api/v1/events"
)


# One token for the whole run, known before any case is generated: schemathesis
# applies it as the bearer scheme, and leaves it off when a negative case is
# about missing auth. Each test stores an endpoint with this token's hash.
TOKEN = tokens.generate_token()


@schema.auth()
class EndpointToken:
    def get(self, case, context):
        return TOKEN

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture
def token_endpoint(db):
    owner, _ = get_user_model().objects.get_or_create(username="fuzzer")
    return Endpoint.objects.create(
        name="fuzzer", owner=owner, queues=["*"], token_hash=tokens.hash_token(TOKEN)
    )


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_the_api_conforms_to_its_openapi_document(case, asgi_server, token_endpoint):
    if case.query and case.query.get("cursor"):
        # A cursor is opaque: only one this API issued is valid, and a random
        # string is rightly a 400 (tests/api/test_api.py pages with real ones).
        del case.query["cursor"]
    if case.query and "wait_seconds" in case.query:
        # A result wait on a todo that never settles: its seconds, for nothing.
        case.query["wait_seconds"] = 0
    wait = case.body.get("wait_seconds") if isinstance(case.body, dict) else None
    # Only a valid wait (an integer, 30.0 included) is lowered; a bad one
    # stays and is a 400 at once.
    waits = isinstance(wait, int | float) and not isinstance(wait, bool)
    waits = waits and float(wait).is_integer()
    if waits and 0 < wait <= settings_module.SWITCHBOARD_MAX_WAIT_SECONDS:
        # Each generated long poll would wait out its seconds on an empty queue;
        # tests/api/test_longpoll.py covers waiting, this run covers the shapes.
        case.body["wait_seconds"] = 0
    if isinstance(case.body, dict) and isinstance(case.body.get("answer_schema"), dict):
        # An answer_schema must itself be a valid JSON Schema, which OpenAPI
        # cannot say (tests/api/test_questions.py covers invalid ones).
        case.body["answer_schema"] = {"type": "string"}
    cron = case.body.get("cron") if isinstance(case.body, dict) else None
    documented_cron = isinstance(cron, str) and cron.strip() and "\x00" not in cron
    if documented_cron and len(cron) <= MAX_CRON_CHARS:
        # A cron expression the document allows must also parse and name a
        # slot, which OpenAPI cannot say (tests/api/test_schedules.py covers
        # invalid ones); one the document refuses stays and is a 400.
        case.body["cron"] = "*/5 * * * *"
    case.call_and_validate(base_url=asgi_server.url)
