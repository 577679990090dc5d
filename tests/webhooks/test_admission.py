"""A webhook route's priority and group (CONTRACT §17): the todos a route makes
carry its priority, and a group derived from each delivery by a template over
the payload, e.g. GitHub's ``{repository.full_name}``: one agent per
repository, pushes fair across repositories."""

import pytest

from tests.webhooks.test_webhooks import SECRET, deliver, todos_of
from todos import store
from todos.models import WebhookRoute, WebhookSource
from todos.store import admission
from todos.webhooks import deliveries, sources


def push(repository, after="0" * 40):
    """A GitHub push delivery's payload (the fields a route may read)."""
    return {
        "ref": "refs/heads/main",
        "after": after,
        "repository": {"full_name": repository, "id": 1296269},
        "pusher": {"name": "octocat"},
        "commits": [{"id": after, "message": "Fix the build"}],
    }


@pytest.fixture
def pushes(endpoint):
    source = WebhookSource.objects.create(slug="pushes", secret=SECRET)
    WebhookRoute.objects.create(
        source=source,
        endpoint=endpoint,
        queue="repos",
        priority=2,
        group_template="{repository.full_name}",
    )
    return source


def test_a_route_sets_priority_and_derives_the_group_from_a_github_push(
    client, pushes, endpoint
):
    response = deliver(client, "pushes", push("acme/app"), delivery="p-1", event="push")

    assert response.status_code == 202
    [todo] = todos_of(endpoint)
    assert (todo.priority, todo.group) == (2, "acme/app")


def test_one_agent_per_repository_and_fair_turns_across_repositories(
    client, pushes, endpoint
):
    """The worked example: group_concurrency 1 and fair turns on the queue; a
    busy repository's pushes never hold back a quiet one's."""
    scope = store.Scope.for_endpoint(endpoint)
    admission.set_admission(scope, "repos", group_concurrency=1, fair=True)
    for n in range(3):
        deliver(client, "pushes", push("acme/busy"), delivery=f"b-{n}", event="push")
    deliver(client, "pushes", push("acme/quiet"), delivery="q-1", event="push")

    first = store.claim_next(scope, "agent-1", queue="repos")
    second = store.claim_next(scope, "agent-2", queue="repos")

    assert {first.group, second.group} == {"acme/busy", "acme/quiet"}
    with pytest.raises(store.NotFound):
        store.claim_next(scope, "agent-3", queue="repos")


def test_a_missing_path_leaves_the_group_empty_never_a_500(client, pushes, endpoint):
    response = deliver(client, "pushes", {"zen": "Keep it simple."}, event="ping2")

    assert response.status_code == 202
    [todo] = todos_of(endpoint)
    assert todo.group is None


@pytest.mark.parametrize(
    ("template", "payload", "group"),
    [
        ("{repository.full_name}", push("acme/app"), "acme/app"),
        ("{repository.owner.login}", push("acme/app"), None),
        ("gh:{repository.full_name}@{ref}", push("a/b"), "gh:a/b@refs/heads/main"),
        ("{commits.0.id}", push("a/b", after="abc"), "abc"),
        ("{commits.5.id}", push("a/b"), None),
        ("{repository.id}", push("a/b"), "1296269"),
        ("{repository}", push("a/b"), None),
        ("{repository.full_name}", ["not", "an", "object"], None),
        ("{name}", {"name": "  spaced \n out  "}, "spaced out"),
        ("{name}", {"name": True}, None),
        ("", push("a/b"), None),
    ],
)
def test_derive_group_reads_a_payload_path(template, payload, group):
    assert deliveries.derive_group(template, payload) == group


def test_a_derived_group_is_bounded_to_200_characters():
    group = deliveries.derive_group("{name}", {"name": "x" * 500})
    assert group == "x" * store.MAX_GROUP_CHARS


@pytest.mark.parametrize(
    "template", ["repository.full_name", "{repository.full_name", "{}", "{a b}", "}{x}"]
)
def test_a_bad_group_template_is_refused_when_the_route_is_made(endpoint, template):
    route = sources.RouteSpec(str(endpoint.id), "repos", group_template=template)
    with pytest.raises(sources.InvalidSource) as refused:
        sources.create_source("bad-group", SECRET, [route])
    assert refused.value.field == "group_template"
    assert not WebhookSource.objects.filter(slug="bad-group").exists()


@pytest.mark.parametrize("priority", [0, 6])
def test_a_route_priority_outside_1_to_5_is_refused(endpoint, priority):
    route = sources.RouteSpec(str(endpoint.id), "repos", priority=priority)
    with pytest.raises(sources.InvalidSource) as refused:
        sources.create_source("bad-priority", SECRET, [route])
    assert refused.value.field == "priority"
