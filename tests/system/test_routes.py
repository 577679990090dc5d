"""The waiting views' routes (board.serving.middleware.Routes): Django's
``resolve`` without walking the URLconf each time, and never a different answer."""

import uuid

import pytest
from django.urls import Resolver404, resolve

from board.serving.middleware import Routes

TODO_ID = str(uuid.uuid4())

# What agents call most, and the paths that look like them but are not.
PATHS = [
    "/api/v1/todos/claim",
    "/api/v1/todos/batch",
    "/api/v1/todos",
    "/api/v1/events",
    "/mcp",
    "/",
    f"/api/v1/todos/{TODO_ID}",
    f"/api/v1/todos/{TODO_ID.upper()}",
    *(
        f"/api/v1/todos/{TODO_ID}/{op}"
        for op in ("complete", "fail", "heartbeat", "release", "claim", "cancel")
    ),
    # Not a todo id: resolved as Django resolves them, never from a shape.
    "/api/v1/todos/not-an-id/complete",
    "/api/v1/todos/claim/complete",
    "/123456789012/a-queue",
]


def same(kept, fresh):
    assert (kept.func, kept.args, kept.kwargs, kept.captured_kwargs) == (
        fresh.func,
        fresh.args,
        fresh.kwargs,
        fresh.captured_kwargs,
    )
    assert (kept.route, kept.url_name, kept.view_name, kept.namespaces) == (
        fresh.route,
        fresh.url_name,
        fresh.view_name,
        fresh.namespaces,
    )


@pytest.mark.parametrize("path", PATHS)
def test_a_kept_route_resolves_as_django_does(path):
    routes = Routes()
    for _ in range(3):  # the first resolve, then what was kept
        same(routes.resolve(path), resolve(path))


def test_each_todo_path_of_a_shape_gets_its_own_id():
    routes = Routes()
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    one = routes.resolve(f"/api/v1/todos/{first}/complete")
    two = routes.resolve(f"/api/v1/todos/{second}/complete")
    assert (one.kwargs, two.kwargs) == ({"todo_id": first}, {"todo_id": second})
    assert two.captured_kwargs == {"todo_id": second}
    # The detail path of the same id is another shape: another view.
    assert routes.resolve(f"/api/v1/todos/{second}").func is not two.func
    same(routes.resolve(f"/api/v1/todos/{first}"), resolve(f"/api/v1/todos/{first}"))


def test_an_unknown_path_is_not_found_every_time_and_not_kept():
    routes = Routes()
    for _ in range(2):
        with pytest.raises(Resolver404):
            routes.resolve("/api/v1/nothing-here")
    assert routes._kept == {}


def test_only_paths_without_captures_or_with_the_todo_id_are_kept():
    routes = Routes()
    routes.resolve("/123456789012/a-queue")  # captures an account and a queue
    routes.resolve("/api/v1/todos/not-an-id/complete")
    assert routes._kept == {}
    routes.resolve("/api/v1/todos/claim")
    routes.resolve(f"/api/v1/todos/{TODO_ID}/fail")
    assert set(routes._kept) == {
        "/api/v1/todos/claim",
        ("/api/v1/todos/", "/fail"),
    }


def test_it_keeps_at_most_its_size():
    routes = Routes()
    routes.SIZE = 2
    for path in ("/api/v1/todos/claim", "/api/v1/todos/batch", "/mcp"):
        routes.resolve(path)
    assert len(routes._kept) == 2
    same(routes.resolve("/mcp"), resolve("/mcp"))
