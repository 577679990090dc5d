"""JSON as PostgreSQL's jsonb can store it, shared by the API, MCP and webhooks.

Python's json module accepts NaN and Infinity (and reads 1e999 as infinity);
jsonb has no form for them, nor for NUL characters or lone surrogates in
strings. Caller input is checked here so it gets a 400 naming the problem
instead of a database error.
"""

import json
import math


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def loads(text):
    """Decode strict JSON: NaN and Infinity are errors. Raises ValueError or
    RecursionError (nesting too deep)."""
    return json.loads(text, parse_constant=_reject_constant)


def text_problem(value):
    """Say why PostgreSQL cannot store a string, or None when it can."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (no lone surrogates)"
    return None


def unstorable(value):
    """Say why jsonb would refuse a decoded value, or None when it can store it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"strings {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return "numbers must be finite"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
