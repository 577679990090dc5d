"""Log formatters: key=value text for people, one JSON object a line for machines;
and the filter that keeps credentials out of every log line.

Callers pass structured fields through ``extra={"fields": {...}}``; both
formatters render them, so a log line is searchable either way.
"""

import functools
import json
import logging
import re
from datetime import UTC, datetime

# What would split a key=value pair: such a value is quoted.
SPLITS = re.compile(r'[ ="\n\t]')


@functools.lru_cache(maxsize=4)
def _second(second):
    """A text line's timestamp: made once a second, not once a line (3 µs)."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@functools.lru_cache(maxsize=16)
def _level(name):
    """A text line's level, lower case and padded to seven characters."""
    return f"{name.lower():7}"


def _fields(record):
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


# Values whose text is never empty and never splits: written as they are.
PLAIN_TYPES = frozenset({int, float, bool, type(None)})


def _text_value(value):
    """Render a value for key=value text, quoting it when it would split."""
    if type(value) in PLAIN_TYPES:
        return str(value)
    text = str(value)
    if not text or SPLITS.search(text):
        return json.dumps(text)
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record):
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record):
        ts = _second(int(record.created))
        line = f"{ts} {_level(record.levelname)} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            # One join of the head and every pair, not a join and a copy.
            pairs = [f"{key}={_text_value(value)}" for key, value in fields.items()]
            line = " ".join([line, *pairs])
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


# --- Credentials never reach a log line (CONTRACT §16) ------------------------

# An answer link is a bearer credential in its path (/answer/<token>): anyone
# who reads it may answer. Django's CSRF and error warnings, the access log
# and a failed request's log line all write the path.
ANSWER_LINK_TOKEN = re.compile(r"(/answer/)[^/\s?#\"'&]+")
REDACTED = r"\1[redacted]"


def redact(text: str) -> str:
    """The text with every answer link's token replaced by ``[redacted]``."""
    return ANSWER_LINK_TOKEN.sub(REDACTED, text) if "/answer/" in text else text


def _redacted(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


class RedactCredentials(logging.Filter):
    """Redact answer-link tokens from a record's message, arguments and fields.

    Attached to every handler the process logs through (ours in the LOGGING
    setting; gunicorn's and uvicorn's by ``redact_server_logs``), so it sees
    each record whichever logger wrote it. The arguments are redacted in
    place, keeping their shape: uvicorn's access formatter reads them.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redacted(arg) for key, arg in record.args.items()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and _holds_answer_link(fields):
            record.fields = {key: _redacted(value) for key, value in fields.items()}
        return True


def _holds_answer_link(fields: dict[object, object]) -> bool:
    """Whether a text value of ``fields`` may hold an answer link: only then
    are the fields copied, redacted (a request's line holds none)."""
    for value in fields.values():
        if isinstance(value, str) and "/answer/" in value:
            return True
    return False


# The loggers gunicorn and uvicorn write through with handlers of their own
# (uvicorn's worker hands its loggers gunicorn's handlers), which the LOGGING
# setting does not configure.
SERVER_LOGGERS = (
    "gunicorn.error",
    "gunicorn.access",
    "uvicorn.error",
    "uvicorn.access",
)


def redact_server_logs() -> None:
    """Add the credential filter to every handler of the server's loggers."""
    for name in ("", *SERVER_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RedactCredentials) for f in handler.filters):
                handler.addFilter(RedactCredentials())
