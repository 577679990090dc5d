"""Questions: an owner asks, someone answers, the hold ends (CONTRACT §14).

Asking is the SPEC's claimed → pending (the lease ends as a release's does),
with the todo *held*: its ``available_at`` moves to the question's deadline,
or far ahead without one, so no claim takes it — exactly as a delayed todo is
not taken before it is due. The claim that asked is not counted (attempt goes
back by one): asking never moves a todo toward its dead letter.

Answering and a deadline passing change no state (the todo stays pending);
they end the hold: an answer makes the todo due again at once and rings the
doorbell; at the deadline the claim may take it (its available_at has come)
and the sweep marks the question expired. An answer is an action someone
took, so it writes a history row (pending → pending, "answered"), as a
heartbeat writes claimed → claimed; the deadline passing is no one's action.

Who answered is recorded as who acted (CONTRACT §16): ``agent:<endpoint>``
for an agent (the worker name it gives is kept beside it as ``worker``, never
in its place), ``operator:<user>`` for a Board session, ``link`` for an
answer link.

An answer link is a signed token (``django.core.signing``) naming the todo,
the question's nonce and an expiry; the answer through it clears the nonce in
the same statement, so each question's links answer at most once.
"""

import json
import time
from collections.abc import Iterable
from datetime import timedelta

import jsonschema
from django.core import signing

from todos.telemetry import tracing

from .lifecycle import T_COLUMNS, _checkpoint, _lookup
from .rows import (
    ANSWER_LINK_SECONDS,
    HELD_UNTIL_ANSWERED,
    MAX_ANSWER_BYTES,
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_DEADLINE_SECONDS,
    MAX_QUESTION_CHARS,
    MIN_DEADLINE_SECONDS,
    PROPERTY_ORDER,
    TODO_COLUMNS,
    Conflict,
    InvalidAnswer,
    JSONObject,
    JSONValue,
    LeaseSuperseded,
    NotFound,
    Scope,
    Todo,
    TooLarge,
)
from .schemas import answer_errors, check_answer_schema, path_text
from .sql import (
    AGENT_ACTOR,
    ISO_NOW,
    _run,
    _scope,
    _scope_params,
    _todo_id,
    _uuid,
    actor_text,
)
from .traces import record_trace_event

RETURN_TO = ("me", "pool")

# --- Ask ------------------------------------------------------------------------

# claimed → pending, held: the owner (by lease token, else by name) gives the
# lease back with a question. return_to 'me' assigns the todo to the asking
# worker, so only it claims the answered todo; 'pool' leaves the assignment as
# it was. A todo under a cancel request cannot ask: it is to stop.
ASK_SQL = f"""
WITH moved AS (
    UPDATE todos t
       SET state = 'pending', owner = NULL, lease_expires_at = NULL,
           attempt = t.attempt - 1,
           assignee = CASE WHEN %(return_to)s = 'me' THEN t.owner
                           ELSE t.assignee END,
           question = %(question)s::jsonb || jsonb_build_object('asked_by', t.owner),
           question_status = 'open', asked_at = now(),
           answer_deadline = now() + make_interval(secs => %(deadline)s::int),
           available_at = coalesce(
               now() + make_interval(secs => %(deadline)s::int),
               %(held_until)s::timestamptz),
           answer = NULL,
           answer_nonce = replace(gen_random_uuid()::text, '-', ''),
           checkpoint = coalesce(%(checkpoint)s::jsonb, t.checkpoint),
           updated_at = now()
     WHERE t.id = %(id)s
       AND (%(operator)s OR (t.endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))))
       AND t.state = 'claimed' AND t.cancel_request IS NULL
       AND (t.lease_token = %(lease_token)s
            OR (%(lease_token)s::text IS NULL AND t.owner = %(worker)s))
 RETURNING {T_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, 'claimed', state, attempt, question->>'asked_by',
           'asked a question', now()
      FROM moved
)
SELECT {TODO_COLUMNS},
       pg_notify('switchboard_todo_event', json_build_object(
           'event', 'todo.asked', 'id', id, 'endpoint_id', endpoint_id,
           'queue', queue)::text)
  FROM moved
"""


def ask(
    scope: Scope,
    given_id: str,
    worker: str | None,
    *,
    question: object,
    choices: object = None,
    answer_schema: object = None,
    checkpoint: object = None,
    deadline_seconds: object = None,
    return_to: str = "me",
    lease_token: str | None = None,
) -> Todo:
    """Ask a question as the lease holder: the lease ends and the todo is held.

    The todo stays pending but no claim takes it until it is answered or its
    deadline (``deadline_seconds``, 60 s to 30 days) passes. ``choices`` (1–10
    short strings) and ``answer_schema`` (a JSON Schema) bound the answer;
    ``checkpoint`` is kept for whoever claims the todo next.
    """
    todo_id = _todo_id(given_id)
    if lease_token is None and not worker:
        raise ValueError("worker or lease_token is required")
    params = {
        **_scope(scope),
        "id": todo_id,
        "worker": worker,
        "lease_token": lease_token,
        "question": json.dumps(_question(question, choices, answer_schema, return_to)),
        "return_to": return_to,
        "deadline": _deadline(deadline_seconds),
        "held_until": HELD_UNTIL_ANSWERED,
        "checkpoint": _checkpoint(checkpoint),
    }
    row = _run("ask", ASK_SQL, params, fetch="one")
    if row is None:
        raise _owner_miss(_lookup(scope, todo_id), lease_token)
    asked = Todo.from_row(row)
    if tracing.enabled():
        asker = (asked.question or {}).get("asked_by")
        event = tracing.event(
            tracing.QUESTION_ASKED,
            asked.deliveries,
            **{"question.return_to": return_to, "question.asked_by": asker},
        )
        tracing.ended(
            asked,
            "ask",
            events=[event] if event else (),
            given_back=True,
            worker=asker,
        )
    return asked


def _question(
    text: object, choices: object, answer_schema: object, return_to: str
) -> JSONObject:
    """Validate a question; return its stored parts (ValueError names the field)."""
    if not isinstance(text, str) or not text:
        raise ValueError("question must be a non-empty string")
    if len(text) > MAX_QUESTION_CHARS:
        raise TooLarge("question", MAX_QUESTION_CHARS)
    if choices is not None:
        if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
            raise ValueError(f"choices must be a list of 1 to {MAX_CHOICES} strings")
        for choice in choices:
            if not isinstance(choice, str) or not 1 <= len(choice) <= MAX_CHOICE_CHARS:
                raise ValueError(
                    f"choices must be strings of 1 to {MAX_CHOICE_CHARS} characters"
                )
        if len(set(choices)) != len(choices):
            raise ValueError("choices must be distinct")
    if answer_schema is not None:
        check_answer_schema(answer_schema)
    if return_to not in RETURN_TO:
        raise ValueError("return_to must be 'me' or 'pool'")
    stored: JSONObject = {
        "text": text,
        "choices": choices,
        "answer_schema": answer_schema,
        "return_to": return_to,
    }
    properties = (
        answer_schema.get("properties") if isinstance(answer_schema, dict) else None
    )
    if isinstance(properties, dict):
        # jsonb keeps no key order: the order the agent gave its fields in,
        # for the Board's answer form (the API does not show it).
        stored[PROPERTY_ORDER] = list(properties)
    return stored


def _deadline(deadline_seconds: object) -> int | None:
    if deadline_seconds is None:
        return None
    if isinstance(deadline_seconds, bool) or not isinstance(deadline_seconds, int):
        raise ValueError("deadline_seconds must be an integer")
    if not MIN_DEADLINE_SECONDS <= deadline_seconds <= MAX_DEADLINE_SECONDS:
        raise ValueError(
            f"deadline_seconds must be between {MIN_DEADLINE_SECONDS}"
            f" and {MAX_DEADLINE_SECONDS}"
        )
    return deadline_seconds


def _owner_miss(todo: Todo, lease_token: str | None) -> Conflict:
    """Classify an owner call that moved nothing: superseded, or not the owner's."""
    if lease_token is not None and todo.lease_token != lease_token:
        return LeaseSuperseded(todo_id=todo.id, state=todo.state)
    if todo.state == "claimed" and todo.cancel_requested:
        return Conflict(
            "a cancel was requested: end the todo (complete, fail or release)",
            todo_id=todo.id,
            state=todo.state,
        )
    return Conflict(
        f"todo is {todo.state}; only the current lease owner may ask",
        todo_id=todo.id,
        state=todo.state,
    )


# --- Answer ---------------------------------------------------------------------

# The hold ends: the answer is stored, the todo is due again at the place it
# had when it asked (available_at = asked_at, not behind the queue's newer
# work), and the doorbell rings. Only an open question before its deadline;
# ``asked_at`` pins the question the answer was validated against; a link's
# nonce, when given, must be the question's, and is spent.
# ``by`` is given for the Board and the link; an agent's (None) is its
# endpoint's name, read here so that no caller can write another.
ANSWER_SQL = f"""
WITH moved AS (
    UPDATE todos t
       SET question_status = 'answered',
           answer = jsonb_build_object(
               'value', %(value)s::jsonb,
               'by', coalesce(%(by)s::text, {AGENT_ACTOR}),
               'worker', %(worker)s::text,
               'at', {ISO_NOW}),
           answer_nonce = NULL, available_at = t.asked_at, updated_at = now()
     WHERE t.id = %(id)s
       AND (%(operator)s OR (t.endpoint_id = %(endpoint_id)s
            AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))))
       AND t.state = 'pending' AND t.question_status = 'open'
       AND (t.answer_deadline IS NULL OR t.answer_deadline > now())
       AND t.asked_at = %(asked_at)s
       AND (%(nonce)s::text IS NULL OR t.answer_nonce = %(nonce)s)
 RETURNING {T_COLUMNS}
), history AS (
    INSERT INTO todo_events (todo_id, endpoint_id, from_state, to_state, attempt,
                             actor, error, at)
    SELECT id, endpoint_id, 'pending', state, attempt,
           {actor_text("answer->>'by'", "answer->>'worker'")}, 'answered', now()
      FROM moved
)
SELECT {TODO_COLUMNS},
       pg_notify('switchboard_todo_ready', json_build_object(
           'id', id, 'endpoint_id', endpoint_id, 'queue', queue)::text)
  FROM moved
"""

NOT_ASKING = "todo is not waiting for an answer"


def answer_todo(
    scope: Scope, todo_id: str, answer: JSONValue, *, worker: str | None = None
) -> Todo:
    """Answer this scope's held todo (any agent of the endpoint); the hold ends.

    The answer is by ``agent:<endpoint>``; ``worker``, the name the agent
    gives, is kept beside it.
    """
    return _answer(scope, todo_id, answer, by=None, worker=worker or None)


def answer_todo_any_endpoint(todo_id: str, answer: JSONValue, *, by: str) -> Todo:
    """Answer any endpoint's held todo (the Board: its owner, never a viewer).

    ``by`` is the Board session's ``operator:<user>``.
    """
    return _answer(None, todo_id, answer, by=by)


def _answer(
    scope: Scope | None,
    given_id: str,
    answer: JSONValue,
    *,
    by: str | None,
    worker: str | None = None,
    nonce: str | None = None,
) -> Todo:
    todo_id = _todo_id(given_id)
    todo = _lookup(scope, todo_id)
    if not todo.is_held:
        raise _not_asking(todo)
    validate_answer(todo, answer)
    params = {
        **_scope(scope),
        "id": todo_id,
        "value": json.dumps(answer),
        "by": by,
        "worker": worker,
        "asked_at": todo.asked_at,
        "nonce": nonce,
    }
    row = _run("answer", ANSWER_SQL, params, fetch="one")
    if row is None:
        raise _not_asking(_lookup(scope, todo_id))
    answered = Todo.from_row(row)
    if tracing.enabled():
        # The answer ends the hold: an event of the delivery that follows.
        by = (answered.answer or {}).get("by")
        event = tracing.event(
            tracing.ANSWERED, answered.deliveries + 1, **{"answer.by": by}
        )
        record_trace_event(answered, event)
    return answered


def _not_asking(todo: Todo) -> Conflict:
    if todo.deadline_passed and todo.state == "pending":
        detail = "the question's deadline passed"
    elif todo.question_status == "answered" and todo.state == "pending":
        detail = "the question was answered already"
    else:
        detail = NOT_ASKING
    return Conflict(detail, todo_id=todo.id, state=todo.state)


def validate_answer(todo: Todo, answer: JSONValue) -> None:
    """Check an answer against the todo's question; InvalidAnswer names the path."""
    if len(json.dumps(answer).encode()) > MAX_ANSWER_BYTES:
        raise TooLarge("answer", MAX_ANSWER_BYTES)
    question = todo.question or {}
    choices = question.get("choices")
    if choices is not None and answer not in choices:
        raise InvalidAnswer(f"answer must be one of {', '.join(map(repr, choices))}")
    schema = question.get("answer_schema")
    if schema is None:
        return
    error = jsonschema.exceptions.best_match(answer_errors(schema, answer))
    if error is not None:
        path = path_text("answer", tuple(error.absolute_path))
        raise InvalidAnswer(f"{path}: {error.message}", path=path)


# --- Answer links ---------------------------------------------------------------

LINK_SALT = "switchboard.answer-link"
STALE_LINK = (
    "this answer link is no longer valid: the question was answered or replaced"
)


class StaleLink(Conflict):
    """An answer link that expired, was used, or names a question no longer open."""


def answer_link_token(todo: Todo) -> str:
    """Return a signed answer-link token for the todo's open question.

    It expires with the question (its deadline, else 7 days after it was
    asked) and answers once: the answer through it spends the question's nonce.
    """
    if not todo.is_held or not todo.answer_nonce:
        raise Conflict(NOT_ASKING, todo_id=todo.id, state=todo.state)
    expires = todo.answer_deadline
    if expires is None:
        assert todo.asked_at is not None  # a held todo was asked
        expires = todo.asked_at + timedelta(seconds=ANSWER_LINK_SECONDS)
    claims = {"t": todo.id, "n": todo.answer_nonce, "e": int(expires.timestamp())}
    return signing.dumps(claims, salt=LINK_SALT, compress=True)


def _link_claims(token: object) -> tuple[str, str]:
    """Return (todo_id, nonce) of a link token; NotFound or StaleLink when refused."""
    try:
        claims = signing.loads(str(token), salt=LINK_SALT)
    except signing.BadSignature as exc:
        raise NotFound("no such answer link") from exc
    if not isinstance(claims, dict) or _uuid(claims.get("t")) is None:
        raise NotFound("no such answer link")
    if not isinstance(claims.get("e"), int) or claims["e"] <= time.time():
        raise StaleLink("this answer link has expired", todo_id=claims["t"])
    return _todo_id(claims["t"]), str(claims.get("n"))


# The todo a link names, while its endpoint is active: a revoked endpoint's
# links answer as a link never made does.
LINK_TODO_SQL = f"""
SELECT {T_COLUMNS}
  FROM todos t JOIN endpoints e ON e.id = t.endpoint_id
 WHERE t.id = %(id)s AND e.revoked_at IS NULL
"""


def todo_for_answer_link(token: object) -> Todo:
    """Return the held todo an answer link opens (the page shows its question)."""
    todo_id, nonce = _link_claims(token)
    row = _run("answer_link", LINK_TODO_SQL, {"id": todo_id}, fetch="one")
    if row is None:
        raise NotFound("no such answer link")
    todo = Todo.from_row(row)
    if not todo.is_held or todo.answer_nonce != nonce:
        raise StaleLink(STALE_LINK, todo_id=todo_id, state=todo.state)
    return todo


# Who answered through an answer link: whoever held it (CONTRACT §16).
LINK_ACTOR = "link"


def answer_by_link(token: object, answer: JSONValue) -> Todo:
    """Answer through a link: once, before it expires, while the question is open."""
    todo = todo_for_answer_link(token)
    try:
        return _answer(None, todo.id, answer, by=LINK_ACTOR, nonce=todo.answer_nonce)
    except Conflict as exc:
        raise StaleLink(exc.detail, todo_id=todo.id, state=exc.state) from exc


# --- Open questions -------------------------------------------------------------

# The open questions of some endpoints (None = every endpoint), oldest first or
# nearest deadline first, through todos_open_question_idx.
OPEN_QUESTION = (
    "state = 'pending' AND question_status = 'open'"
    " AND (answer_deadline IS NULL OR answer_deadline > now())"
)
OPEN_QUESTIONS_SQL = f"""
SELECT {TODO_COLUMNS} FROM todos
 WHERE {OPEN_QUESTION}
   AND (%(endpoint_ids)s::uuid[] IS NULL OR endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
 ORDER BY {{order}}
 LIMIT %(limit)s
"""
ORDERS = {
    "oldest": "asked_at, id",
    "deadline": "answer_deadline NULLS LAST, asked_at, id",
}

OPEN_QUESTION_FIGURES_SQL = f"""
SELECT count(*), EXTRACT(EPOCH FROM now() - min(asked_at))::float8
  FROM todos
 WHERE {OPEN_QUESTION}
   AND (%(endpoint_ids)s::uuid[] IS NULL OR endpoint_id = ANY(%(endpoint_ids)s::uuid[]))
"""


def _endpoint_ids(endpoint_ids: Iterable[object] | None) -> list[str] | None:
    if endpoint_ids is None:
        return None
    return [parsed for parsed in map(_uuid, endpoint_ids) if parsed is not None]


def open_questions(
    scope: Scope, *, order: str = "oldest", limit: int = 50
) -> list[Todo]:
    """Return this scope's held todos (an orchestrator's inbox)."""
    params = _scope_params(scope)
    return _open_questions([params["endpoint_id"]], params["queues"], order, limit)


def open_questions_any_endpoint(
    *,
    endpoint_ids: Iterable[object] | None = None,
    order: str = "oldest",
    limit: int = 50,
) -> list[Todo]:
    """Return the held todos of these endpoints (None = all): the Board's inbox."""
    return _open_questions(_endpoint_ids(endpoint_ids), None, order, limit)


def _open_questions(
    endpoint_ids: list[str] | None, queues: list[str] | None, order: str, limit: int
) -> list[Todo]:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}")
    limit = int(limit)
    if not 1 <= limit <= 200:
        raise ValueError("limit must be between 1 and 200")
    if endpoint_ids == []:
        return []
    sql = OPEN_QUESTIONS_SQL.format(order=ORDERS[order])
    params = {"endpoint_ids": endpoint_ids, "queues": queues, "limit": limit}
    return [Todo.from_row(row) for row in _run("open_questions", sql, params)]


def open_question_figures_any_endpoint(
    *, endpoint_ids: Iterable[object] | None = None
) -> tuple[int, float | None]:
    """Return (open questions, the oldest one's age in seconds or None)."""
    scope_ids = _endpoint_ids(endpoint_ids)
    if scope_ids == []:
        return 0, None
    row = _run(
        "open_question_figures",
        OPEN_QUESTION_FIGURES_SQL,
        {"endpoint_ids": scope_ids},
        fetch="one",
    )
    assert row is not None  # an aggregate returns one row
    oldest: float | None = row[1]
    return int(row[0]), oldest


def count_open_questions_any_endpoint(
    *, endpoint_ids: Iterable[object] | None = None
) -> int:
    """Count the open questions of these endpoints (the Board's navigation)."""
    return open_question_figures_any_endpoint(endpoint_ids=endpoint_ids)[0]
