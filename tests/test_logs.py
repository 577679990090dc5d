"""The credential filter (todos.telemetry.logs.RedactCredentials): an answer
link's token never reaches a log line, whichever logger writes it (CONTRACT §16).
tests/system/test_front_of_house.py greps a served gunicorn's log for it."""

import logging

from todos.telemetry.logs import RedactCredentials, TextFormatter, redact_server_logs

TOKEN = ".eJyrVipRslIyNDBQ0lFKV7JSMjQyNlaqBQBLbAX3:1tX9aQ:abcDEF-ghi_JKL"


def record(msg, args=(), **extra):
    made = logging.LogRecord(
        "django.security.csrf", logging.WARNING, "", 0, msg, args, None
    )
    made.__dict__.update(extra)
    return made


def test_an_answer_links_token_is_redacted_from_the_message_its_arguments_and_fields():
    """Django's CSRF warning passes the path as an argument; uvicorn's access
    line passes it among others; our request log passes fields."""
    csrf = record("Forbidden (%s): %s", ("CSRF cookie not set.", f"/answer/{TOKEN}"))
    access = record(
        '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4:5", "GET", f"/answer/{TOKEN}?x=1", "1.1", 200),
    )
    failed = record(
        "request failed", fields={"path": f"/answer/{TOKEN}", "status": 500}
    )
    inline = record(f"Not Found: /answer/{TOKEN}")
    lines = []
    for each in (csrf, access, failed, inline):
        assert RedactCredentials().filter(each)
        lines.append(TextFormatter().format(each))

    assert all("/answer/[redacted]" in line for line in lines)
    assert not any(TOKEN in line or TOKEN[:12] in line for line in lines)
    assert access.args[3:] == ("1.1", 200)  # the access formatter's shape kept


def test_the_servers_own_handlers_get_the_filter_once():
    handler = logging.StreamHandler()
    access = logging.getLogger("uvicorn.access")
    access.addHandler(handler)
    try:
        redact_server_logs()
        redact_server_logs()
        assert sum(isinstance(f, RedactCredentials) for f in handler.filters) == 1
    finally:
        access.removeHandler(handler)


def test_the_board_paths_that_hold_no_credential_are_left_as_they_are():
    path = "/board/todos/7c1e0000-0000-0000-0000-000000000000/answer/"
    line = record("POST %s", (path,))
    RedactCredentials().filter(line)
    assert line.getMessage() == f"POST {path}"


def test_a_request_line_renders_every_field_as_key_value_text():
    """The text format a request's line has (docs/operations.md): numbers,
    None and flags as they print, text quoted only where it would split."""
    line = record(
        "request",
        fields={
            "method": "POST",
            "route": "",
            "status": 200,
            "outcome": "ok",
            "endpoint_id": None,
            "duration_ms": 1.5,
            "streaming": True,
            "path": "/static/a b.css",
        },
    )
    line.created = 0.0
    assert RedactCredentials().filter(line)

    assert TextFormatter().format(line) == (
        "1970-01-01T00:00:00 warning django.security.csrf: request method=POST "
        'route="" status=200 outcome=ok endpoint_id=None duration_ms=1.5 '
        'streaming=True path="/static/a b.css"'
    )


def test_fields_with_no_answer_link_reach_the_line_as_the_caller_passed_them():
    fields = {"route": "api/v1/todos/claim", "status": 200}
    line = record("request", fields=fields)
    RedactCredentials().filter(line)
    assert line.fields == {"route": "api/v1/todos/claim", "status": 200}
