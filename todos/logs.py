"""Log formatters: key=value text for people, one JSON object a line for machines.

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


def _fields(record):
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def _text_value(value):
    """Render a value for key=value text, quoting it when it would split."""
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
        pairs = " ".join(
            f"{key}={_text_value(value)}" for key, value in _fields(record).items()
        )
        line = f"{ts} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if pairs:
            line = f"{line} {pairs}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line
