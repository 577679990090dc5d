"""Smoke: the service answers, a todo goes round, and no agent-facing module
reaches another tenant's data (the tenant guard, over every module of todos/)."""

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import todos
from todos import store


def test_healthz_answers_ok_when_the_database_is_up(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_create_then_claim_round_trip(scope):
    todo, created = store.create_todo(scope, queue="q", title="t")
    assert created
    claimed = store.claim_next(scope, "w1")
    assert claimed.id == todo.id and claimed.state == "claimed"


# Every module (or package) of todos/ that reaches the database is either
# guarded or exempt, with its reason; a module that is neither fails
# test_every_module_that_reaches_the_database_is_guarded_or_exempt.
GUARDED = {
    "todos.api": "the agent JSON API",
    "todos.mcp": "the MCP surface",
    "todos.sqs": "the SQS surface",
    "todos.webhooks": "webhook deliveries, each into its route's endpoint",
    "todos.access.auth": "turns an agent's token or SQS key into its endpoint",
    "todos.web.health": "/healthz, answered to anyone",
    "todos.web.threads": "runs the surfaces' waiting calls in the bounded pool",
    "todos.waiting.doorbell": "the doorbell hub the waiting surfaces share",
    "todos.waiting.longpoll": "the waiting claim of the API, SQS and MCP",
    "todos.waiting.streams": "the event streams of the API and MCP",
    "todos.waiting.results": "waiting for a todo's result, for the API and MCP",
    "todos.db": "the database floor: connection parameters, the replication "
    "watch, the async pool; reads no todo",
}
EXEMPT = {
    "todos.ui": "the Board: an operator's view across endpoints, narrowed by "
    "BoardAccess to an owner's own (tests/ui/test_owners.py)",
    "todos.management": "operator commands, run by hand or by a scheduler",
    "todos.management.sweeper": "the sweeps move every endpoint's todos by design",
    "todos.web.metrics": "/metrics: the operator's figures, behind its own token",
    "todos.checks": "system checks of the settings and the database",
    "todos.access.endpoints": "creates, re-keys and revokes endpoints for an operator",
    "todos.access.stored_secrets": "re-encrypts every stored secret "
    "(reencrypt_secrets)",
    "todos.models": "the schema itself",
    "todos.templatetags": "the Board's template filters",
}
# Guarded modules that open or hand back database connections themselves.
OWN_CONNECTION = {
    "todos.access.auth": "looks an endpoint up by its token's hash, before any scope",
    "todos.waiting.doorbell": "LISTENs on a connection of its own; reads no todo",
    "todos.web.threads": "hands each call's connection back to the pool",
    "todos.db": "derives the connections' parameters, watches replication and "
    "keeps the async pool the agent surfaces' statements run on",
}
# Store functions a guarded module may call without a scope: none reads a row.
UNSCOPED = {
    "ping": "SELECT 1, for /healthz",
    "decode_cursor": "parses a cursor",
    "encode_cursor": "formats a cursor",
    "is_outage": "classifies an exception",
    "is_deadlock": "classifies an exception",
    "is_dedupe_violation": "classifies an exception",
    "validate_answer": "checks an answer against its question",
    "arun_steps": "awaits the statements of steps a scoped store function made",
    "validate_usage": "checks a usage report's fields",
    "is_fifo_name": "reads a queue name's suffix",
    "forget_rate_limited": "clears this claim's note of rate-limited queues",
    "rate_limited": "reads this claim's note of rate-limited queues",
    "note_rate_wait": "counts a rate-limited wait in the process's own counters",
}
# What belongs to the store: the tables of todos, reached through it alone.
TODO_MODELS = {"Todo", "TodoEvent", "Queue", "TodoMinute", "TransitionTotal"}
TODO_MODELS |= {"RollupState"}
OPERATOR_TWIN = re.compile(r"\w+_any_endpoint|\w*ANY_SQL")

TODOS = Path(todos.__file__).parent


def module_names():
    """Every module of todos/ but the store and the migrations."""
    for path in sorted(TODOS.rglob("*.py")):
        parts = path.relative_to(TODOS.parent).with_suffix("").parts
        if parts[1:2] in (("store",), ("migrations",)):
            continue
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(module_name):
    return ast.parse(Path(importlib.util.find_spec(module_name).origin).read_text())


def imports(tree):
    """(module, name) for each name imported anywhere in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.module, alias.name) for alias in node.names)


def reaches_the_database(tree):
    return any(
        module == "todos.models"
        or module.startswith(("todos.store", "django.db", "psycopg"))
        or (module, name) == ("todos", "store")
        for module, name in imports(tree)
    )


def entry(module_name, table):
    """The table's entry for the module or its nearest package, else None."""
    parts = module_name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in table:
            return ".".join(parts[:end])
    return None


def store_names_used(tree):
    """Every name the module takes from the store: (store module, name).

    ``from todos import store`` then ``store.claim_next``;
    ``from todos.store import claim_next``; ``from todos.store import stats``
    then ``stats.x``; ``from todos.store.questions import RETURN_TO``.
    """
    aliases = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        for alias in node.names:
            bound = alias.asname or alias.name
            if (node.module, alias.name) == ("todos", "store"):
                aliases[bound] = "todos.store"
            elif node.module == "todos.store" and is_store_module(alias.name):
                aliases[bound] = f"todos.store.{alias.name}"
            elif node.module.startswith("todos.store"):
                yield node.module, alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            yield aliases[node.value.id], node.attr


def is_store_module(name):
    return importlib.util.find_spec(f"todos.store.{name}") is not None


def identifiers(tree):
    """Every name, attribute, imported name and identifier-like string."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.alias):
            yield node.name.rsplit(".", 1)[-1]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield from re.findall(r"\w+", node.value)


def guard_problems(module_name):
    """What keeps a module from being agent-facing: its reasons, or []."""
    tree = parse(module_name)
    problems = [
        f"names the operator twin {name}"
        for name in sorted(set(identifiers(tree)))
        if OPERATOR_TWIN.fullmatch(name)
    ]
    for store_module, name in sorted(set(store_names_used(tree))):
        value = getattr(importlib.import_module(store_module), name)
        if not inspect.isfunction(value) or name in UNSCOPED:
            continue
        if next(iter(inspect.signature(value).parameters), None) != "scope":
            problems.append(f"calls {store_module}.{name}, which takes no scope")
    for module, name in set(imports(tree)):
        if module == "todos.models" and name in TODO_MODELS:
            problems.append(f"reads the model {name} past the store")
        if not entry(module_name, OWN_CONNECTION) and (
            module.startswith("psycopg")
            or (module == "django.db" and name in ("connection", "connections"))
        ):
            problems.append(f"imports {name or module}: a connection past the store")
    return problems


DATABASE_MODULES = [
    name for name in module_names() if reaches_the_database(parse(name))
]


@pytest.mark.parametrize("module_name", DATABASE_MODULES)
def test_every_module_that_reaches_the_database_is_guarded_or_exempt(module_name):
    """A new module that reaches the database says which it is: agent-facing
    (guarded below) or the operator's (exempt, with its reason)."""
    guarded, exempt = entry(module_name, GUARDED), entry(module_name, EXEMPT)
    assert guarded or exempt, f"{module_name}: add it to GUARDED or to EXEMPT"
    assert not (guarded and exempt), f"{module_name}: both {guarded} and {exempt}"


@pytest.mark.parametrize(
    "module_name", [name for name in DATABASE_MODULES if entry(name, GUARDED)]
)
def test_the_agent_facing_path_never_reaches_another_endpoints_data(module_name):
    """SPEC requirement: Endpoint Ownership (Tenant Isolation)

    The agent-facing path reaches todos through the store alone, and of the
    store only through functions that take the caller's scope: never an
    *_any_endpoint twin, an operator's query or a sweep.
    """
    assert guard_problems(module_name) == []


@pytest.mark.parametrize(
    "table", [GUARDED, EXEMPT, OWN_CONNECTION], ids=["guarded", "exempt", "own"]
)
def test_each_entry_of_the_guards_tables_names_a_module_that_reaches_the_database(
    table,
):
    reaching = set(DATABASE_MODULES)
    stale = [
        name
        for name in table
        if not any(m == name or m.startswith(name + ".") for m in reaching)
    ]
    assert stale == []


@pytest.mark.parametrize(
    ("module_name", "problem"),
    [
        ("todos.ui.access", "names the operator twin get_todo_any_endpoint"),
        (
            "todos.management.sweeper",
            "calls todos.store.reap_expired, which takes no scope",
        ),
        (
            "todos.web.metrics",
            "calls todos.store.stats.metrics_figures, which takes no scope",
        ),
        ("todos.management.sweeper", "imports connection: a connection past the store"),
    ],
)
def test_the_guard_finds_what_an_operators_module_does(module_name, problem):
    """The guard is not blind: run on the operator's modules, it finds what
    would be a leak on the agent-facing path."""
    assert problem in guard_problems(module_name)
