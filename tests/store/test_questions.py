"""Questions (CONTRACT §14): ask, answer, answer links, deadlines, the inbox.

Real PostgreSQL; time moves by editing timestamps (``time_travel``).
"""

import time

import pytest
from django.core import signing
from django.db import connection

from tests.support import counting_server
from todos import store
from todos.access import endpoints

NEVER_MINTED = "00000000-0000-4000-8000-000000000000"
LINK_SALT = "switchboard.answer-link"


def new(scope, queue="q", **fields):
    todo, created = store.create_todo(scope, queue=queue, **fields)
    assert created
    return todo


def claimed(scope, worker="w1", **fields):
    todo = new(scope, **fields)
    return store.claim_todo(scope, todo.id, worker)


def history(todo_id):
    return [(e.from_state, e.to_state) for e in store.todo_events_any_endpoint(todo_id)]


def asked(scope, worker="w1", **question):
    todo = claimed(scope, worker)
    question.setdefault("question", "Deploy to production?")
    return store.ask(scope, todo.id, worker, **question)


def past_deadline(todo_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todos SET answer_deadline = now() - interval '1 second',"
            " available_at = now() - interval '1 second' WHERE id = %s",
            [todo_id],
        )


# --- Ask ------------------------------------------------------------------------


def test_ask_ends_the_lease_and_holds_the_todo(scope):
    """CONTRACT §14: the claim ends as a release does; the todo is held."""
    todo = claimed(scope)
    held = store.ask(
        scope,
        todo.id,
        "w1",
        question="Which region?",
        choices=["eu", "us"],
        checkpoint={"step": 3},
    )
    assert held.state == "pending" and held.owner is None
    assert held.lease_expires_at is None
    assert held.outcome == "held" and held.is_held
    assert held.checkpoint == {"step": 3}
    out = held.to_dict()
    assert out["question"]["text"] == "Which region?"
    assert out["question"]["choices"] == ["eu", "us"]
    assert out["question"]["asked_by"] == "w1"
    assert out["question"]["expired"] is False
    assert out["question"]["deadline"] is None
    assert out["answer"] is None and out["outcome"] == "held"
    assert "answer_nonce" not in out
    assert history(todo.id) == [
        (None, "pending"),
        ("pending", "claimed"),
        ("claimed", "pending"),
    ]


def test_no_claim_takes_a_held_todo(scope):
    """CONTRACT §14: held = pending, but no claim takes it until answered."""
    todo = asked(scope, return_to="pool")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo(scope, todo.id, "w2")
    with pytest.raises(store.Conflict):
        store.claim_todo_any_endpoint(todo.id, "operator")
    assert store.pending_doorbell_todos(scope) == []


def test_asking_never_moves_a_todo_toward_its_dead_letter(scope):
    """CONTRACT §14: the claim that asked is not counted as an attempt."""
    todo = claimed(scope, max_attempts=1)
    held = store.ask(scope, todo.id, "w1", question="ok?")
    assert held.attempt == 0 and held.state == "pending"
    answered = store.answer_todo(scope, todo.id, "yes", worker="lead")
    again = store.claim_todo(scope, answered.id, "w1")
    assert again.attempt == 1 and again.state == "claimed"


def test_ask_with_return_to_me_assigns_the_todo_to_the_asker(scope):
    todo = asked(scope, "w1")
    store.answer_todo(scope, todo.id, "go", worker="lead")
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "w2")
    again = store.claim_next(scope, "w1")
    assert again.id == todo.id and again.assignee == "w1"


def test_ask_with_return_to_pool_lets_any_worker_claim_the_answer(scope):
    todo = asked(scope, "w1", return_to="pool")
    store.answer_todo(scope, todo.id, "go", worker="lead")
    again = store.claim_next(scope, "w2")
    assert again.id == todo.id and again.assignee is None


def test_ask_requires_the_current_lease_token(scope):
    todo = claimed(scope)
    with pytest.raises(store.LeaseSuperseded):
        store.ask(scope, todo.id, None, question="?", lease_token="stale")
    held = store.ask(scope, todo.id, None, question="?", lease_token=todo.lease_token)
    assert held.is_held


def test_ask_conflicts_for_a_worker_that_is_not_the_owner(scope):
    todo = claimed(scope, "w1")
    with pytest.raises(store.Conflict) as caught:
        store.ask(scope, todo.id, "w2", question="?")
    assert not isinstance(caught.value, store.LeaseSuperseded)
    assert store.get_todo(scope, todo.id).state == "claimed"


def test_ask_conflicts_on_a_pending_todo(scope):
    todo = new(scope)
    with pytest.raises(store.Conflict):
        store.ask(scope, todo.id, "w1", question="?")


def test_ask_of_another_endpoints_todo_is_not_found(scope, other_scope):
    todo = claimed(other_scope)
    with pytest.raises(store.NotFound):
        store.ask(scope, todo.id, "w1", question="?")
    with pytest.raises(store.NotFound):
        store.ask(scope, "not-a-uuid", "w1", question="?")


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"question": ""}, "question"),
        ({"question": "x" * 4001}, "question"),
        ({"question": "?", "choices": []}, "choices"),
        ({"question": "?", "choices": [str(n) for n in range(11)]}, "choices"),
        ({"question": "?", "choices": ["a", "a"]}, "choices"),
        ({"question": "?", "choices": ["x" * 201]}, "choices"),
        ({"question": "?", "answer_schema": []}, "answer_schema"),
        ({"question": "?", "answer_schema": {"type": "wat"}}, "answer_schema"),
        (
            {"question": "?", "answer_schema": {"enum": ["x" * 100] * 200}},
            "answer_schema",
        ),
        ({"question": "?", "deadline_seconds": 59}, "deadline_seconds"),
        ({"question": "?", "deadline_seconds": 30 * 86400 + 1}, "deadline_seconds"),
        ({"question": "?", "return_to": "them"}, "return_to"),
        ({"question": "?", "checkpoint": "x" * 70000}, "checkpoint"),
    ],
)
def test_ask_refuses_bad_fields_naming_them(scope, fields, field):
    todo = claimed(scope)
    with pytest.raises(ValueError) as caught:
        store.ask(scope, todo.id, "w1", **fields)
    assert field in str(caught.value)
    assert store.get_todo(scope, todo.id).state == "claimed"


def test_question_and_schema_over_their_limits_are_too_large(scope):
    todo = claimed(scope)
    with pytest.raises(store.TooLarge):
        store.ask(scope, todo.id, "w1", question="x" * 4001)
    with pytest.raises(store.TooLarge):
        store.ask(scope, todo.id, "w1", question="?", checkpoint="x" * 70000)


def test_ask_under_a_cancel_request_conflicts(scope):
    todo = claimed(scope)
    store.cancel_todo(scope, todo.id, reason="stop", worker="lead")
    with pytest.raises(store.Conflict) as caught:
        store.ask(scope, todo.id, "w1", question="?")
    assert "cancel" in caught.value.detail


# --- Answer ---------------------------------------------------------------------


def test_answer_ends_the_hold_and_the_next_claim_reads_question_and_answer(scope):
    """CONTRACT §14: the next claim returns the question, the answer and the
    checkpoint."""
    todo = claimed(scope)
    store.ask(scope, todo.id, "w1", question="Approve?", checkpoint={"at": 7})
    answered = store.answer_todo(scope, todo.id, {"approved": True}, worker="lead")
    assert answered.state == "pending" and answered.outcome == "pending"
    assert answered.answer["value"] == {"approved": True}
    assert answered.answer["by"] == "agent:agent-a"
    assert answered.answer["worker"] == "lead"
    assert answered.answer["at"].endswith("Z")
    again = store.claim_next(scope, "w1")
    out = again.to_dict()
    assert out["question"]["text"] == "Approve?"
    assert out["answer"]["value"] == {"approved": True}
    assert out["checkpoint"] == {"at": 7}
    assert out["question"]["expired"] is False


def test_answering_twice_conflicts(scope):
    todo = asked(scope)
    store.answer_todo(scope, todo.id, "yes", worker="lead")
    with pytest.raises(store.Conflict) as caught:
        store.answer_todo(scope, todo.id, "no", worker="other")
    assert "answered" in caught.value.detail
    assert store.get_todo(scope, todo.id).answer["value"] == "yes"


def test_answer_of_a_todo_not_waiting_conflicts(scope):
    todo = new(scope)
    with pytest.raises(store.Conflict):
        store.answer_todo(scope, todo.id, "yes", worker="lead")


def test_answer_of_another_endpoints_todo_is_not_found(scope, other_scope):
    todo = asked(other_scope)
    with pytest.raises(store.NotFound):
        store.answer_todo(scope, todo.id, "yes", worker="lead")
    with pytest.raises(store.NotFound):
        store.answer_todo(scope, NEVER_MINTED, "yes", worker="lead")


def test_answer_must_be_one_of_the_choices(scope):
    todo = asked(scope, choices=["deploy", "abort"])
    with pytest.raises(store.InvalidAnswer) as caught:
        store.answer_todo(scope, todo.id, "maybe", worker="lead")
    assert caught.value.path == "answer"
    answered = store.answer_todo(scope, todo.id, "abort", worker="lead")
    assert answered.answer["value"] == "abort"


def test_answer_failing_its_schema_names_the_path(scope):
    schema = {
        "type": "object",
        "properties": {"amount": {"type": "integer", "maximum": 100}},
        "required": ["amount"],
    }
    todo = asked(scope, answer_schema=schema)
    with pytest.raises(store.InvalidAnswer) as caught:
        store.answer_todo(scope, todo.id, {"amount": 500}, worker="lead")
    assert caught.value.path == "answer.amount"
    assert "answer.amount" in str(caught.value)
    with pytest.raises(store.InvalidAnswer):
        store.answer_todo(scope, todo.id, {}, worker="lead")
    assert store.get_todo(scope, todo.id).is_held
    good = store.answer_todo(scope, todo.id, {"amount": 50}, worker="lead")
    assert good.answer["value"] == {"amount": 50}


def test_answer_with_a_local_ref_to_nowhere_is_invalid_not_an_error(scope):
    todo = asked(scope, answer_schema={"$ref": "#/$defs/missing"})
    with pytest.raises(store.InvalidAnswer):
        store.answer_todo(scope, todo.id, 1, worker="lead")


def test_an_answered_todo_is_claimed_at_the_place_it_had_when_it_asked(scope):
    first = asked(scope, return_to="pool")
    later = new(scope)
    store.answer_todo(scope, first.id, "go", worker="lead")
    assert store.claim_next(scope, "w2").id == first.id
    assert store.claim_next(scope, "w2").id == later.id


# --- Deadlines ------------------------------------------------------------------


def test_deadline_expiry_ends_the_hold_with_no_answer(scope):
    """CONTRACT §14: at the deadline the hold ends (answer null, expired true)."""
    todo = asked(scope, deadline_seconds=60)
    assert todo.to_dict()["question"]["deadline"] is not None
    assert store.expire_questions() == []
    past_deadline(todo.id)
    moved = store.expire_questions()
    assert [m.id for m in moved] == [todo.id]
    after = store.get_todo(scope, todo.id)
    assert after.outcome == "pending" and after.answer is None
    assert after.to_dict()["question"]["expired"] is True
    assert store.claim_next(scope, "w1").id == todo.id


def test_a_claim_takes_a_question_past_its_deadline_without_the_sweep(scope):
    """CONTRACT §4: no todo waits for a sweep to become claimable."""
    todo = asked(scope, deadline_seconds=60)
    past_deadline(todo.id)
    again = store.claim_next(scope, "w1")
    assert again.id == todo.id
    assert again.to_dict()["question"]["expired"] is True


def test_answer_after_the_deadline_conflicts(scope):
    todo = asked(scope, deadline_seconds=60)
    past_deadline(todo.id)
    with pytest.raises(store.Conflict) as caught:
        store.answer_todo(scope, todo.id, "late", worker="lead")
    assert "deadline" in caught.value.detail


def test_asking_again_replaces_the_old_question_and_answer(scope):
    todo = asked(scope, question="first?")
    store.answer_todo(scope, todo.id, "one", worker="lead")
    store.claim_next(scope, "w1")
    again = store.ask(scope, todo.id, "w1", question="second?")
    assert again.question["text"] == "second?" and again.answer is None
    assert again.is_held


# --- Answer links ---------------------------------------------------------------


def test_an_answer_link_answers_once(scope):
    todo = asked(scope)
    token = store.answer_link_token(todo)
    assert store.todo_for_answer_link(token).id == todo.id
    answered = store.answer_by_link(token, "yes")
    assert answered.answer["value"] == "yes"
    assert answered.answer["by"] == "link"
    with pytest.raises(store.StaleLink):
        store.answer_by_link(token, "again")
    with pytest.raises(store.StaleLink):
        store.todo_for_answer_link(token)


def test_an_answer_link_of_a_replaced_question_is_stale(scope):
    todo = asked(scope)
    token = store.answer_link_token(todo)
    store.answer_todo(scope, todo.id, "yes", worker="lead")
    store.claim_next(scope, "w1")
    store.ask(scope, todo.id, "w1", question="another?")
    with pytest.raises(store.StaleLink):
        store.answer_by_link(token, "no")


def test_an_expired_answer_link_is_refused(scope):
    todo = asked(scope)
    claims = {"t": todo.id, "n": todo.answer_nonce, "e": 1}
    token = signing.dumps(claims, salt=LINK_SALT, compress=True)
    with pytest.raises(store.StaleLink) as caught:
        store.answer_by_link(token, "yes")
    assert "expired" in caught.value.detail
    assert store.get_todo(scope, todo.id).is_held


def test_a_forged_answer_link_is_not_found(scope):
    todo = asked(scope)
    token = store.answer_link_token(todo)
    with pytest.raises(store.NotFound):
        store.answer_by_link(token[:-2] + "xx", "yes")
    with pytest.raises(store.NotFound):
        store.todo_for_answer_link("garbage")


def test_an_answer_link_expires_with_the_question(scope):
    todo = asked(scope, deadline_seconds=120)
    claims = signing.loads(store.answer_link_token(todo), salt=LINK_SALT)
    assert claims["e"] == int(todo.answer_deadline.timestamp())
    plain = asked(scope, "w2")
    claims = signing.loads(store.answer_link_token(plain), salt=LINK_SALT)
    assert claims["e"] - plain.asked_at.timestamp() == pytest.approx(7 * 86400, abs=1)


def test_an_answer_link_is_refused_for_a_todo_not_waiting(scope):
    todo = new(scope)
    with pytest.raises(store.Conflict):
        store.answer_link_token(todo)


# --- The inbox ------------------------------------------------------------------


def test_open_questions_list_oldest_first_within_an_owner_scope(
    scope, other_scope, endpoint, other_endpoint, time_travel
):
    first = asked(scope, "w1")
    second = asked(scope, "w2", deadline_seconds=600)
    foreign = asked(other_scope, "w3")
    time_travel(first.id, asked_at=-60)
    mine = store.open_questions_any_endpoint(endpoint_ids=[endpoint.id])
    assert [t.id for t in mine] == [first.id, second.id]
    nearest = store.open_questions_any_endpoint(
        endpoint_ids=[endpoint.id], order="deadline"
    )
    assert [t.id for t in nearest] == [second.id, first.id]
    everyone = store.open_questions_any_endpoint()
    assert {t.id for t in everyone} == {first.id, second.id, foreign.id}
    assert [t.id for t in store.open_questions(scope)] == [first.id, second.id]
    assert store.open_questions_any_endpoint(endpoint_ids=[]) == []


def test_open_question_count_and_oldest_age(scope, endpoint, time_travel):
    assert store.open_question_figures_any_endpoint(endpoint_ids=[endpoint.id]) == (
        0,
        None,
    )
    first = asked(scope, "w1")
    asked(scope, "w2")
    time_travel(first.id, asked_at=-120)
    count, oldest = store.open_question_figures_any_endpoint(endpoint_ids=[endpoint.id])
    assert count == 2 and oldest >= 119
    assert store.count_open_questions_any_endpoint(endpoint_ids=[endpoint.id]) == 2
    store.answer_todo(scope, first.id, "ok", worker="lead")
    assert store.count_open_questions_any_endpoint(endpoint_ids=[endpoint.id]) == 1


def test_board_answer_answers_any_endpoints_todo(other_scope):
    todo = asked(other_scope)
    answered = store.answer_todo_any_endpoint(todo.id, "yes", by="alice")
    assert answered.answer["by"] == "alice"


def test_held_todos_count_neither_as_visible_nor_as_delayed(scope):
    """SQS never counts a held todo as visible (ApproximateNumberOfMessages)."""
    asked(scope)
    new(scope)
    info = store.get_queue(scope, "q")
    assert info.pending == 1 and info.delayed == 0 and info.held == 1


# --- What an answer schema may make the server do (CONTRACT §16) -----------------


@pytest.mark.parametrize(
    "schema, path",
    [
        ({"$ref": "http://169.254.169.254/latest/"}, "answer_schema.$ref"),
        (
            {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}},
            "answer_schema.properties.a.$ref",
        ),
        ({"items": [{"$dynamicRef": "https://x.test/s#m"}]}, "answer_schema.items[0]"),
        ({"$id": "https://x.test/root/", "$ref": "other.json"}, "answer_schema.$ref"),
        (
            {"$ref": "#/enum/0", "enum": [{"$ref": "http://x.test/s"}]},
            "answer_schema.enum[0].$ref",
        ),
    ],
)
def test_an_answer_schema_may_only_reference_itself(scope, schema, path):
    todo = claimed(scope)
    with pytest.raises(ValueError) as caught:
        store.ask(scope, todo.id, "w1", question="?", answer_schema=schema)
    assert str(caught.value).startswith(path)
    assert store.get_todo(scope, todo.id).state == "claimed"


def test_a_stored_schema_with_a_remote_ref_fetches_nothing_when_answered(scope):
    """A schema stored before refs were checked at ask time: still nothing is
    retrieved, and the answer is refused in the store's own terms."""
    with counting_server() as remote:
        todo = asked(scope, answer_schema={"type": "string"})
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE todos SET question = jsonb_set(question, '{answer_schema}',"
                " jsonb_build_object('$ref', %s::text)) WHERE id = %s",
                [remote.url, todo.id],
            )
        with pytest.raises(store.InvalidAnswer) as caught:
            store.answer_todo(scope, todo.id, "yes", worker="lead")
        assert "only a local reference" in str(caught.value)
        assert remote.hits == 0
        assert store.get_todo(scope, todo.id).is_held


@pytest.mark.parametrize(
    "schema, path",
    [
        ({"type": "string", "pattern": "^(a)\\1$"}, "answer_schema.pattern"),
        (
            {"type": "object", "patternProperties": {"^(?!x)": {}}},
            "answer_schema.patternProperties.^(?!x)",
        ),
    ],
)
def test_a_pattern_without_a_linear_time_match_is_refused_at_ask(scope, schema, path):
    todo = claimed(scope)
    with pytest.raises(ValueError) as caught:
        store.ask(scope, todo.id, "w1", question="?", answer_schema=schema)
    assert str(caught.value).startswith(path)
    assert "RE2" in str(caught.value)


def test_a_schema_nested_too_deep_is_refused_at_ask(scope):
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    todo = claimed(scope)
    with pytest.raises(ValueError) as caught:
        store.ask(scope, todo.id, "w1", question="?", answer_schema=deep)
    assert "deeper than 32 levels" in str(caught.value)


def assert_quick(check, seconds=1.0):
    started = time.monotonic()
    check()
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"took {elapsed:.2f} s"


def test_a_backtracking_pattern_checks_an_answer_in_linear_time(scope):
    todo = asked(scope, answer_schema={"type": "string", "pattern": "^(a+)+$"})

    def check():
        with pytest.raises(store.InvalidAnswer) as caught:
            store.answer_todo(scope, todo.id, "a" * 28 + "!", worker="lead")
        assert "does not match" in str(caught.value)

    assert_quick(check)
    key = {
        "type": "object",
        "additionalProperties": False,
        "patternProperties": {"^(a|a)+$": {"type": "integer"}},
    }
    other = asked(scope, answer_schema=key)
    assert_quick(
        lambda: pytest.raises(
            store.InvalidAnswer,
            store.answer_todo,
            scope,
            other.id,
            {"a" * 28 + "!": 1},
            worker="lead",
        )
    )
    assert store.answer_todo(scope, todo.id, "aaaa", worker="lead").answer["value"] == (
        "aaaa"
    )


def test_unique_items_over_a_large_answer_is_checked_quickly(scope):
    todo = asked(scope, answer_schema={"type": "array", "uniqueItems": True})
    distinct = [{"n": n} for n in range(5000)]
    assert_quick(lambda: store.answer_todo(scope, todo.id, distinct, worker="lead"))

    again = asked(scope, answer_schema={"type": "array", "uniqueItems": True})
    repeated = [*distinct, {"n": 4999.0}]
    with pytest.raises(store.InvalidAnswer) as caught:
        store.answer_todo(scope, again.id, repeated, worker="lead")
    assert "non-unique" in str(caught.value)
    # JSON Schema's equality: true is not 1, key order does not count.
    mixed = asked(scope, answer_schema={"type": "array", "uniqueItems": True})
    store.answer_todo(scope, mixed.id, [1, True, {"a": 1, "b": 2}], worker="lead")


def test_a_schema_whose_refs_multiply_the_work_stops_within_its_bound(scope):
    """Each level refers twice to the next: 2**40 paths for one failing answer."""
    defs = {
        f"d{n}": {
            "anyOf": [{"$ref": f"#/$defs/d{n + 1}"}, {"$ref": f"#/$defs/d{n + 1}"}]
        }
        for n in range(40)
    }
    defs["d40"] = {"type": "string"}
    todo = asked(scope, answer_schema={"$defs": defs, "$ref": "#/$defs/d0"})

    def check():
        with pytest.raises(store.InvalidAnswer) as caught:
            store.answer_todo(scope, todo.id, 1, worker="lead")
        assert "too costly" in str(caught.value)

    assert_quick(check, seconds=1.5)


# --- A passed deadline, a revoked endpoint -----------------------------------------


def test_a_question_past_its_deadline_is_not_held_before_the_sweep_runs(scope):
    todo = asked(scope, deadline_seconds=3600)
    past_deadline(todo.id)
    late = store.get_todo(scope, todo.id)
    assert not late.is_held
    assert late.to_dict()["outcome"] == "pending"
    assert late.to_dict()["question"]["expired"] is True
    with pytest.raises(store.Conflict) as caught:
        store.answer_todo(scope, todo.id, "yes", worker="lead")
    assert "deadline passed" in caught.value.detail


def test_an_answer_link_of_a_question_past_its_deadline_is_stale(scope):
    todo = asked(scope, deadline_seconds=3600)
    token = store.answer_link_token(todo)
    past_deadline(todo.id)
    with pytest.raises(store.StaleLink):
        store.todo_for_answer_link(token)


def test_a_revoked_endpoints_answer_link_answers_as_an_unknown_link(scope, endpoint):
    todo = asked(scope)
    token = store.answer_link_token(todo)
    endpoints.revoke(endpoint)
    with pytest.raises(store.NotFound):
        store.todo_for_answer_link(token)
    with pytest.raises(store.NotFound):
        store.answer_by_link(token, "yes")
    assert store.get_todo_any_endpoint(todo.id).answer is None
