"""Structured logs: each of the runtime's records carries its fields as
``extra`` (``todo_id``, ``queue``, ``attempt``, ``error``…); ``JsonFormatter``
writes a record and those fields as one JSON object a line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# The attributes every LogRecord has; anything else came in ``extra``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **fields(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value…``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        pairs = " ".join(f"{k}={v}" for k, v in fields(record).items())
        text = f"{stamp} {record.levelname.lower():7} {record.name}: "
        text += f"{record.getMessage()} {pairs}".rstrip()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str = "info", fmt: str = "text") -> None:
    """Send the runtime's logs to stderr in ``fmt`` (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("switchboard_client")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
