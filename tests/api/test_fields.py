"""The field tables (todos/api/fields.py): the one declaration the validator,
the OpenAPI document and the MCP tools' input schemas are all built from."""

import json

import jsonschema
import pytest

from tests.api.test_api import Agent, assert_error
from todos import store
from todos.api import fields, openapi
from todos.mcp import tools

# Each MCP tool's arguments: its JSON twin's table, after the todo's id where
# the JSON API has it in the path; wait_for_todo waits as get_todo does, longer.
ID = (fields.TODO_ID,)
TWINS = {
    "list_todos": fields.LIST_TODOS,
    "get_todo": ID,
    "create_todo": fields.CREATE_TODO,
    "claim_next": fields.CLAIM_NEXT,
    "claim_todo": (*ID, *fields.CLAIM_TODO),
    "heartbeat": (*ID, *fields.HEARTBEAT),
    "complete_todo": (*ID, *fields.COMPLETE_TODO),
    "fail_todo": (*ID, *fields.FAIL_TODO),
    "release_todo": (*ID, *fields.RELEASE_TODO),
    "ask": (*ID, *fields.ASK),
    "answer": (*ID, *fields.ANSWER),
    "cancel_todo": (*ID, *fields.CANCEL_TODO),
    "wait_for_todo": (*ID, tools.WAIT_FOR_TODO),
    "batch": fields.BATCH,
    "list_queues": (),
    "retry_todo": ID,
    "create_schedule": fields.CREATE_SCHEDULE,
    "list_schedules": fields.LIST_SCHEDULES,
    "pause_schedule": (fields.SCHEDULE_ID,),
    "resume_schedule": (fields.SCHEDULE_ID,),
    "list_budgets": (),
    "get_queue": (fields.QUEUE_NAME,),
    "update_queue": (fields.QUEUE_NAME, *fields.QUEUE_SETTINGS),
    "list_groups": (fields.QUEUE_NAME, *fields.GROUPS_PAGE),
    "set_group": (fields.QUEUE_NAME, fields.GROUP_NAME, *fields.GROUP_SETTINGS),
    "set_priority": (*ID, *fields.SET_PRIORITY),
}
TYPES = {
    "text": "string",
    "worker": "string",
    "handoff": "string",
    "enum": "string",
    "integer": "integer",
    "number": "number",
    "usd": "number",
    "boolean": "boolean",
    "object": "object",
    "progress": "object",
    "usage": "object",
    "items": "array",
    "choices": "array",
}


@pytest.fixture
def agent(endpoint):
    return Agent(endpoint)


def caller(endpoint):
    return tools.Caller(endpoint, store.Scope.for_endpoint(endpoint), "session-1")


def body_schema(document, path):
    post = document["paths"][path]["post"]
    return post["requestBody"]["content"]["application/json"]["schema"]


def field_of(operation, name):
    return next(field for field in operation if field.name == name)


def test_a_bound_moved_in_the_table_moves_the_validator_openapi_and_mcp(
    agent, endpoint, monkeypatch
):
    monkeypatch.setattr(field_of(fields.CLAIM_NEXT, "max_todos"), "maximum", 3)

    refused = agent.post("/api/v1/todos/claim", {"worker": "w", "max_todos": 4})
    tool = tools.call(tools.TOOLS["claim_next"], {"max_todos": 4}, caller(endpoint))
    document = openapi.build_document()

    detail = assert_error(refused, 400, "bad_request")
    assert detail == "max_todos: must be between 1 and 3"
    assert tool["isError"] and tool["structuredContent"]["detail"] == detail
    claim = body_schema(document, "/api/v1/todos/claim")
    assert claim["properties"]["max_todos"]["maximum"] == 3
    schema = tools.TOOLS["claim_next"].schema()
    assert schema["properties"]["max_todos"]["maximum"] == 3


def test_a_bound_that_is_a_setting_is_read_when_used(agent, endpoint, settings):
    settings.SWITCHBOARD_MAX_WAIT_SECONDS = 7

    refused = agent.post("/api/v1/todos/claim", {"worker": "w", "wait_seconds": 8})
    document = openapi.build_document()
    wait_for = tools.TOOLS["wait_for_todo"].schema()["properties"]["wait_seconds"]

    detail = assert_error(refused, 400, "bad_request")
    assert detail == "wait_seconds: must be between 0 and 7"
    claim = body_schema(document, "/api/v1/todos/claim")
    assert claim["properties"]["wait_seconds"]["maximum"] == 7
    assert (wait_for["maximum"], wait_for["default"]) == (7, 7)


@pytest.mark.parametrize("name", sorted(tools.TOOLS))
def test_every_mcp_tool_schema_is_its_table(name):
    """Each property's type, bounds and required are the table's, so the MCP
    tools cannot drift from the JSON API."""
    tool = tools.TOOLS[name]
    assert tool.fields == TWINS[name]
    schema = tool.schema()
    assert list(schema["properties"]) == [field.name for field in tool.fields]
    # The MCP session names the worker a call leaves out.
    required = [f.name for f in tool.fields if f.required and f.kind != "worker"]
    assert schema["required"] == required
    for field in tool.fields:
        assert_described(schema["properties"][field.name], field)


def assert_described(prop, field):
    kind = field.kind
    if kind == "json":
        # Any JSON, as the validator takes it.
        assert "type" not in prop
    else:
        nullable = TYPES[kind] if kind != "handoff" else [TYPES[kind], "null"]
        assert prop["type"] == nullable
    if kind in {"text", "worker", "handoff"}:
        assert prop["maxLength"] == field.maximum
        assert prop.get("minLength") == (None if field.empty else 1)
    if kind == "integer":
        bounds = (prop["minimum"], prop["maximum"])
        assert bounds == (fields._now(field.minimum), fields._now(field.maximum))
    if kind == "number":
        bounds = (prop["exclusiveMinimum"], prop["maximum"])
        assert bounds == (0, fields._now(field.maximum))
    if kind == "usd":
        bounds = (prop["minimum"], prop["maximum"])
        assert bounds == (0, fields._now(field.maximum))
    if kind in {"items", "choices"}:
        assert (prop["minItems"], prop["maxItems"]) == (1, field.maximum)
    if kind == "enum":
        assert prop["enum"] == list(field.choices)
    if field.default is not None:
        assert prop["default"] == field.default_value()
    if kind == "items":
        for item in field.items:
            assert_described(prop["items"]["properties"][item.name], item)


def test_the_mcp_and_openapi_schemas_agree_with_the_validator():
    """Differences the surfaces had: MCP let idempotency_key and lease_token be
    empty and said payload and result were objects; OpenAPI had no cursor
    limit and gave max_attempts a default of 5 (it is the queue's setting)."""
    create = tools.TOOLS["create_todo"].schema()["properties"]
    complete = tools.TOOLS["complete_todo"].schema()["properties"]
    assert create["idempotency_key"]["minLength"] == 1
    assert complete["lease_token"]["minLength"] == 1
    assert "type" not in create["payload"] and "type" not in complete["result"]
    document = openapi.build_document()
    listing = document["paths"]["/api/v1/todos"]["get"]["parameters"]
    cursor = next(p for p in listing if p["name"] == "cursor")
    assert cursor["schema"]["maxLength"] == store.MAX_CURSOR_CHARS
    one = body_schema(document, "/api/v1/todos")["oneOf"][0]
    assert "default" not in one["properties"]["max_attempts"]


def test_any_json_is_a_payload_and_a_result_on_mcp(endpoint):
    created = tools.call(
        tools.TOOLS["create_todo"], {"queue": "q", "payload": [1, 2]}, caller(endpoint)
    )
    assert not created["isError"]
    assert created["structuredContent"]["todo"]["payload"] == [1, 2]


def test_a_bad_return_to_names_its_field(agent):
    todo = agent.claim(agent.create()["id"], "w1")
    asked = agent.post(
        f"/api/v1/todos/{todo['id']}/ask",
        {"worker": "w1", "question": "Go?", "return_to": "elsewhere"},
    )
    assert assert_error(asked, 400, "bad_request") == (
        "return_to: must be one of me, pool"
    )


def test_a_cursor_over_its_limit_is_400(agent):
    long = "x" * (store.MAX_CURSOR_CHARS + 1)
    detail = assert_error(agent.get("/api/v1/todos", cursor=long), 400, "bad_request")
    assert detail == f"cursor: must be at most {store.MAX_CURSOR_CHARS} characters"


def documented(document, path, body, method="post"):
    """Whether the OpenAPI document accepts ``body`` for ``method path``."""
    operation = document["paths"][path][method]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize("usage", [{}, {"model": None, "cost_usd": None}])
def test_a_usage_report_that_gives_no_field_is_refused_and_documented_so(agent, usage):
    body = {"queue": "q", "usage": usage}

    refused = agent.post("/api/v1/usage", body)

    assert_error(refused, 400, "bad_request")
    document = openapi.build_document()
    assert not documented(document, "/api/v1/usage", body)
    given = {"queue": "q", "usage": {"model": None, "cost_usd": 0}}
    assert documented(document, "/api/v1/usage", given)
    assert agent.post("/api/v1/usage", given).status_code == 201


def test_a_batch_cancel_needs_no_worker_and_is_documented_so(agent):
    todo = agent.post("/api/v1/todos", {"queue": "q"}).json()["todo"]
    body = {"actions": [{"op": "cancel", "id": todo["id"]}]}

    applied = agent.post("/api/v1/todos/batch", body)

    assert applied.status_code == 200, applied.content
    assert applied.json()["results"][0]["status"] == 200
    document = openapi.build_document()
    assert documented(document, "/api/v1/todos/batch", body)
    unowned = {"actions": [{"op": "complete", "id": todo["id"]}]}
    assert not documented(document, "/api/v1/todos/batch", unowned)
    assert_error(agent.post("/api/v1/todos/batch", unowned), 400, "bad_request")


def send(agent, method, path, body=None):
    data = {} if body is None else {"data": json.dumps(body)}
    call = getattr(agent.client, method)
    return call(path, content_type="application/json", **data, **agent._auth())


@pytest.mark.parametrize(
    ("method", "path", "documented_path"),
    [
        ("patch", "/api/v1/queues/q", "/api/v1/queues/{name}"),
        ("put", "/api/v1/queues/q/groups/g", "/api/v1/queues/{name}/groups/{group}"),
    ],
)
def test_a_settings_change_without_a_body_changes_nothing_and_is_documented_so(
    agent, method, path, documented_path
):
    unchanged = send(agent, method, path)

    assert unchanged.status_code == 200, unchanged.content
    operation = openapi.build_document()["paths"][documented_path]
    assert operation[method]["requestBody"]["required"] is False


def test_a_whole_float_is_a_whole_number_in_queue_and_group_settings(agent):
    queue = send(
        agent,
        "patch",
        "/api/v1/queues/q",
        {"group_concurrency": 3.0, "max_attempts": 2.0, "rate_limit": {"count": 5.0}},
    )
    group = send(agent, "put", "/api/v1/queues/q/groups/g", {"weight": 4.0})

    assert queue.status_code == 200, queue.content
    settings = queue.json()["queue"]
    assert (settings["group_concurrency"], settings["max_attempts"]) == (3, 2)
    assert settings["rate_limit"] == {"count": 5, "per_seconds": 1, "burst": 5}
    assert group.json()["group"]["weight"] == 4


@pytest.mark.parametrize(
    ("body", "accepted"),
    [
        ({"rate_limit": {"count": 1, "burst": None}}, True),
        ({"max_attempts": 2_147_483_647}, True),
        ({"max_attempts": store.MAX_ATTEMPTS_CAP + 1}, False),
        ({"lease_seconds": store.MAX_LEASE_SECONDS + 1}, False),
        ({"delay_seconds": store.MAX_DELAY_SECONDS + 1}, False),
        ({"group_concurrency": 100_001}, False),
        ({"rate_limit": {"count": 1_000_000_001}}, False),
        ({"rate_limit": {"count": 1, "per_seconds": 7 * 24 * 3600 + 1}}, False),
        ({"priority_aging_seconds": 30 * 24 * 3600 + 1}, False),
    ],
)
def test_the_queue_settings_document_states_the_bounds_the_view_checks(
    agent, body, accepted
):
    response = send(agent, "patch", "/api/v1/queues/q", body)

    assert (response.status_code == 200) is accepted, response.content
    document = openapi.build_document()
    assert documented(document, "/api/v1/queues/{name}", body, "patch") is accepted


BUDGET = {"scope": "queue", "queue": "q", "window": "day", "limit_usd": 5}


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        ({}, True),
        ({"limit_usd": 0.000001}, True),
        ({"limit_usd": 5e-324}, False),
        ({"limit_usd": None, "limit_tokens": 10}, True),
        ({"limit_usd": None}, False),
        ({"scope": "endpoint", "queue": None}, True),
        ({"scope": "endpoint"}, False),
        ({"queue": None}, False),
        ({"group": "g"}, False),
        ({"scope": "group", "group": "g"}, True),
        ({"scope": "group"}, False),
        ({"time_zone": "Europe/Berlin"}, True),
        ({"time_zone": "Mars/Olympus"}, False),
    ],
)
def test_a_budget_is_documented_as_the_view_checks_it(agent, change, accepted):
    """Its scope's names, a limit (dollars to the millionth, as kept: 5e-324
    was kept as a limit of 0), a time zone the server knows."""
    body = {**BUDGET, **change}

    response = agent.post("/api/v1/budgets", body)

    assert (response.status_code == 201) is accepted, response.content
    document = openapi.build_document()
    assert documented(document, "/api/v1/budgets", body) is accepted


SCHEDULE = {"name": "s", "queue": "q", "cron": "*/5 * * * *"}


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        ({}, True),
        ({"cron": None, "every_seconds": 3600}, True),
        ({"every_seconds": 3600}, False),
        ({"cron": None}, False),
        ({"cron": "   "}, False),
        ({"cron": "\x1d"}, False),
        ({"todo": {"title": None}}, True),
        ({"todo": {"priority": 2.0, "max_attempts": 3.0}}, True),
        ({"todo": {"priority": 2.5}}, False),
        ({"time_zone": "Mars/Olympus"}, False),
    ],
)
def test_a_schedule_is_documented_with_cron_or_every_seconds_and_a_known_zone(
    agent, change, accepted
):
    body = {**SCHEDULE, **change}

    response = agent.post("/api/v1/schedules", body)

    assert (response.status_code == 201) is accepted, response.content
    document = openapi.build_document()
    assert documented(document, "/api/v1/schedules", body) is accepted


def test_a_blank_cron_is_undocumented_to_an_ecma_regex_validator_too():
    """The document's cron pattern refuses every string the server finds blank,
    read as JSON Schema reads a pattern (ECMA-262, as jsonschema_rs, which
    schemathesis checks with): ECMA's \\s leaves out U+001C-U+001F and U+0085,
    which Python's strip() removes, so the fuzzer sent "\\x1d" as documented
    and the server's 400 failed it."""
    import jsonschema_rs

    document = openapi.build_document()
    body = document["paths"]["/api/v1/schedules"]["post"]["requestBody"]
    cron = body["content"]["application/json"]["schema"]["properties"]["cron"]
    validator = jsonschema_rs.validator_for(cron)
    blank = [chr(code) for code in range(0x10000) if chr(code).isspace()]
    assert [hex(ord(c)) for c in blank if validator.is_valid(c * 2)] == []
    assert validator.is_valid("*/5 * * * *")


def test_a_schedule_change_naming_cron_and_every_seconds_is_refused_and_documented_so(
    agent,
):
    made = agent.post("/api/v1/schedules", SCHEDULE).json()["schedule"]
    both = {"cron": "0 * * * *", "every_seconds": 3600}

    refused = agent.client.put(
        f"/api/v1/schedules/{made['id']}",
        json.dumps(both),
        content_type="application/json",
        **agent._auth(),
    )

    assert_error(refused, 400, "bad_request")
    document = openapi.build_document()
    path = "/api/v1/schedules/{schedule_id}"
    assert not documented(document, path, both, "put")
    assert documented(document, path, {"every_seconds": 3600, "cron": None}, "put")


@pytest.mark.parametrize(
    "path, method, name",
    [
        ("/api/v1/budgets", "post", "limit_usd"),
        ("/api/v1/budgets/{budget_id}", "put", "limit_usd"),
        ("/api/v1/budgets/{budget_id}/decision", "post", "amount_usd"),
    ],
)
def test_every_budget_body_documents_dollars_to_the_millionth(path, method, name):
    """A limit or a raise under a millionth of a dollar is refused by the store
    on create, update and decision alike; each document says so."""
    operation = openapi.build_document()["paths"][path][method]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"][name]["minimum"] == store.budgets.MIN_USD
    assert "exclusiveMinimum" not in body["properties"][name]
