"""Answer schemas: what an agent may ask for, and a check of answers that is bounded.

An ``answer_schema`` is written by an agent and applied, in the server's own
process, to an answer a person or another agent sends (CONTRACT §16). So it
may make the server do nothing beyond checking that one answer:

- **Nothing is fetched.** Every ``$ref`` (and ``$dynamicRef``,
  ``$recursiveRef``) must be local, ``#…``, wherever it appears in the
  document; anything else is refused when the question is asked. The
  validator's registry also refuses to retrieve, so a schema stored before
  this rule still fetches nothing (its answer is refused instead).
- **Time is bounded.** ``pattern`` and ``patternProperties`` run on RE2, a
  linear-time engine: a pattern it cannot compile (backreferences,
  lookaround) is refused at ask time. ``uniqueItems`` hashes each item's
  canonical form instead of comparing every pair. The schema nests at most
  ``MAX_SCHEMA_DEPTH`` levels, a pattern is at most ``MAX_PATTERN_CHARS``, and
  a check that still runs past ``CHECK_SECONDS`` (a ``$ref`` graph that
  multiplies work, a long ``allOf`` under ``items``) stops with an
  ``InvalidAnswer``.

``check_answer_schema`` runs at ask time and again before each check (a schema
stored before these rules meets them too); ``answer_errors`` is the check.
"""

import functools
import json
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import jsonschema
import re2
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from .rows import MAX_ANSWER_SCHEMA_BYTES, InvalidAnswer, JSONValue, TooLarge

MAX_SCHEMA_DEPTH = 32
MAX_PATTERN_CHARS = 1000
CHECK_SECONDS = 0.5

# The keywords that name another schema by URI.
REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose value is a schema, a list of schemas, or a map of them: where
# a ``pattern`` is one (elsewhere, e.g. in an ``enum``, it is data).
SCHEMA_KEYWORDS = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "prefixItems",
    }
)
SCHEMA_MAP_KEYWORDS = frozenset(
    {
        "$defs",
        "definitions",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "properties",
    }
)

type Path = tuple[str | int, ...]


def path_text(root: str, path: Path) -> str:
    """``answer_schema.properties.url.$ref``, ``answer[2].name``."""
    return root + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in path
    )


# --- At ask time ----------------------------------------------------------------


def check_answer_schema(schema: object) -> None:
    """Refuse a schema the server would not apply safely; ValueError names where."""
    if not isinstance(schema, dict):
        raise ValueError("answer_schema must be a JSON Schema object")
    uses: set[str] = set()
    # The walk first: it bounds the depth that json.dumps and the meta-schema
    # check below would recurse into.
    for path, node, is_schema in _walk(schema):
        uses.update(node)
        _check_node(path, node, is_schema)
    if len(json.dumps(schema).encode()) > MAX_ANSWER_SCHEMA_BYTES:
        raise TooLarge("answer_schema", MAX_ANSWER_SCHEMA_BYTES)
    if {"unevaluatedProperties", "patternProperties"} <= uses:
        # jsonschema's unevaluatedProperties matches patternProperties with
        # Python's backtracking engine, which RE2 cannot replace there.
        raise ValueError(
            "answer_schema: unevaluatedProperties cannot be combined with "
            "patternProperties; use additionalProperties"
        )
    validator = jsonschema.validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(
            f"answer_schema is not a valid JSON Schema: {exc.message}"
        ) from exc


def _walk(schema: dict[str, Any]) -> Iterator[tuple[Path, dict[str, Any], bool]]:
    """Yield every object of the document with its path and whether it sits
    where a schema does; refuse nesting beyond MAX_SCHEMA_DEPTH. Iterative,
    so a deep document cannot exhaust the stack."""
    stack: list[tuple[Path, object, bool]] = [((), schema, True)]
    while stack:
        path, node, is_schema = stack.pop()
        if len(path) > MAX_SCHEMA_DEPTH:
            raise ValueError(
                f"{path_text('answer_schema', path[:MAX_SCHEMA_DEPTH])}: the "
                f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
            )
        if isinstance(node, list):
            stack.extend(
                ((*path, index), item, is_schema) for index, item in enumerate(node)
            )
        elif isinstance(node, dict):
            yield path, node, is_schema
            for key, value in node.items():
                stack.extend(_children(path, key, value, is_schema))


def _children(
    path: Path, key: str, value: object, is_schema: bool
) -> Iterator[tuple[Path, object, bool]]:
    if is_schema and key in SCHEMA_MAP_KEYWORDS and isinstance(value, dict):
        for name, subschema in value.items():
            yield (*path, key, name), subschema, True
    else:
        yield (*path, key), value, is_schema and key in SCHEMA_KEYWORDS


def _check_node(path: Path, node: dict[str, Any], is_schema: bool) -> None:
    # A reference anywhere, even in data: a JSON pointer may make any part of
    # the document a schema ("$ref": "#/enum/0").
    for keyword in REFERENCES:
        target = node.get(keyword)
        if isinstance(target, str) and not target.startswith("#"):
            raise ValueError(
                f"{path_text('answer_schema', (*path, keyword))}: only a local "
                f"reference (starting with #) is allowed, not {target[:200]!r}; "
                "the server fetches nothing"
            )
    if not is_schema:
        return
    if isinstance(node.get("pattern"), str):
        _check_pattern((*path, "pattern"), node["pattern"])
    properties = node.get("patternProperties")
    if isinstance(properties, dict):
        for pattern in properties:
            _check_pattern((*path, "patternProperties", pattern), pattern)


def _check_pattern(path: Path, pattern: str) -> None:
    where = path_text("answer_schema", path)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"{where}: a pattern is at most {MAX_PATTERN_CHARS} characters"
        )
    try:
        _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise ValueError(
            f"{where}: the pattern {pattern[:200]!r} is not supported ({reason}); "
            "patterns run on RE2: no backreferences or lookaround"
        ) from None


# --- Checking an answer ---------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=128)
def _compiled(pattern: str) -> Any:
    """The pattern compiled by RE2 (re2.error when it cannot be)."""
    return re2.compile(pattern, _RE2_OPTIONS)


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


_deadline: ContextVar[float] = ContextVar("answer_check_deadline")


class TooCostly(Exception):
    """The check of an answer ran past CHECK_SECONDS."""


def _on_time() -> None:
    if time.monotonic() > _deadline.get():
        raise TooCostly


# The keywords below take the validator as jsonschema passes it: its Validator
# protocol does not declare ``descend``, which every validator class has.


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: object
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: object
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            _on_time()
            if _search(pattern, key):
                yield from validator.descend(
                    value, subschema, path=key, schema_path=pattern
                )


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The keys neither ``properties`` nor ``patternProperties`` cover."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        _on_time()
        if key in properties or any(_search(pattern, key) for pattern in patterns):
            continue
        extras.append(key)
    return extras


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        if "patternProperties" in schema:
            yield ValidationError(
                f"{listed} {'does' if len(extras) == 1 else 'do'} not match any "
                "of the regexes: "
                + ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


def _canonical(value: object) -> object:
    """A hashable form of a JSON value, equal exactly when JSON Schema calls two
    values equal (1 and 1.0 are; true and 1 are not; keys in any order)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    return value


def _unique_items(
    validator: Any, unique: object, instance: Any, schema: object
) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


BOUNDED_KEYWORDS: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}


def _timed(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """A keyword that first checks the check is still on time."""

    @functools.wraps(keyword)
    def check(
        validator: Validator, value: object, instance: object, schema: object
    ) -> Any:
        _on_time()
        return keyword(validator, value, instance, schema)

    return check


@functools.cache
def _bounded(base: type[Validator]) -> type[Validator]:
    """``base`` with RE2 patterns, hashed uniqueItems and a clock on every keyword."""
    keywords = {**base.VALIDATORS, **BOUNDED_KEYWORDS}
    bounded: type[Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in its stubs
        base, {name: _timed(keyword) for name, keyword in keywords.items()}
    )
    return bounded


def _refuse(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class


# Only the drafts' own meta-schemas resolve; nothing is ever retrieved.
NOTHING_REMOTE: referencing.jsonschema.SchemaRegistry = referencing.Registry(
    retrieve=_refuse  # type: ignore[call-arg]  # referencing's Registry is an attrs class
)


def answer_errors(schema: dict[str, Any], answer: JSONValue) -> list[ValidationError]:
    """Return the schema's errors of an answer, within CHECK_SECONDS.

    InvalidAnswer when the schema cannot be applied (it breaks the rules of
    ``check_answer_schema``, names what is not in it, or costs too much).
    """
    try:
        check_answer_schema(schema)
    except (ValueError, TooLarge) as exc:
        raise InvalidAnswer(f"answer_schema cannot be applied: {exc}") from exc
    validator = _bounded(jsonschema.validators.validator_for(schema))(
        schema, registry=NOTHING_REMOTE
    )
    token = _deadline.set(time.monotonic() + CHECK_SECONDS)
    try:
        return list(validator.iter_errors(answer))
    except TooCostly:
        raise InvalidAnswer(
            "answer_schema is too costly to apply to this answer"
            f" (over {CHECK_SECONDS} s)"
        ) from None
    except RecursionError:
        raise InvalidAnswer("answer nests too deeply for its answer_schema") from None
    except Exception as exc:  # a $ref to nowhere in the schema, and the like
        raise InvalidAnswer(f"answer_schema cannot be applied: {exc}") from exc
    finally:
        _deadline.reset(token)
