"""A todo read from its row: every column in its field, jsonb read exactly."""

import dataclasses

import pytest
from django.db import connection

from todos import store
from todos.store import rows


def row_of(todo_id):
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {rows.TODO_COLUMNS} FROM todos WHERE id = %s", [todo_id]
        )
        return cursor.fetchone()


@pytest.mark.django_db
def test_a_todo_read_from_its_row_holds_each_column_in_its_own_field(scope):
    """from_row fills the fields without the dataclass's __init__: each
    column must land in its field, in TODO_COLUMNS' order."""
    todo, _ = store.create_todo(
        scope, queue="q", title="t", payload={"a": [1, 2]}, assignee="w1"
    )
    store.claim_todo(scope, todo.id, "w1")
    store.heartbeat(scope, todo.id, "w1", progress={"message": "half", "fraction": 0.5})
    row = row_of(todo.id)
    read = rows.Todo.from_row(row)
    by_name = dict(zip(rows.TODO_COLUMNS.replace(" ", "").split(","), row, strict=True))
    # The column is group_key (group is an SQL keyword); the field is group.
    by_name["group"] = by_name.pop("group_key")
    for field in dataclasses.fields(rows.Todo):
        expected = by_name[field.name]
        if field.name in {"id", "endpoint_id"}:
            expected = str(expected)
        if field.name in {"payload", "progress"}:
            expected = rows._json(expected)
        assert getattr(read, field.name) == expected, field.name
    assert read == store.get_todo(scope, todo.id)
    assert read.payload == {"a": [1, 2]}
    assert read.progress == {"message": "half", "fraction": 0.5}
    assert read.state == "claimed" and read.owner == "w1" and read.assignee == "w1"


@pytest.mark.django_db
def test_a_payload_with_integers_beyond_64_bits_reads_back_exactly(scope):
    """jsonb holds numbers of any size: an integer beyond 64 bits reads back as
    that integer, not as the nearest float (orjson's reading of it)."""
    big = 123456789012345678901234567890
    payload = {"big": big, "small": -(2**65) - 1, "pi": 3.25, "text": "é\u2028"}
    todo, _ = store.create_todo(scope, queue="q", title="t", payload=payload)
    read = store.get_todo(scope, todo.id).payload
    assert read == payload
    assert type(read["big"]) is int and read["big"] == big
    assert type(read["small"]) is int


@pytest.mark.django_db
def test_a_row_short_of_the_todos_columns_is_refused(scope):
    """A statement that returned fewer columns than TODO_COLUMNS is a bug in
    it: refused at once, not read into a todo missing its last fields."""
    todo, _ = store.create_todo(scope, queue="q", title="t")
    row = row_of(todo.id)

    with pytest.raises(ValueError):
        rows.Todo.from_row(row[:-1])
    assert rows.Todo.from_row((*row, "an extra column")) == rows.Todo.from_row(row)
