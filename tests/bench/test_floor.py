"""bench/floor_server.py: the HTTP floor peers.py measures the JSON API against."""

import sys
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest

from tests.support import database_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import benchlib  # noqa: E402
import peers  # noqa: E402


@pytest.fixture
def bare_table():
    url = database_url()
    yield url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {peers.BARE_TABLE}")


@pytest.mark.django_db(transaction=True)
def test_the_floor_claims_and_completes_with_the_bare_and_the_stores_statements(
    endpoint, bare_table
):
    """Each floor path moves real rows, through the same client steps as the
    JSON API's paths; a wrong token is refused."""
    url = bare_table
    peers.bare_fill(url, str(endpoint.id), 2)
    benchlib.fill_pending(url, str(endpoint.id), 12)
    setup = SimpleNamespace(
        urls={"switchboard": url},
        endpoint_id=str(endpoint.id),
        token=endpoint.token,
        floor_port=None,
    )
    with peers.serve_floor(SimpleNamespace(server_workers=1, port=0), setup) as server:
        port = server.port
        assert peers.http_step(port, endpoint.token, "w1")() == 1
        assert peers.http_step(port, endpoint.token, "w1", prefix="/store")() == 1
        batch = peers.http_batch_step(port, endpoint.token, "w1", prefix="/store")
        assert batch() == 10
        status, _ = benchlib.Client(port, "sb_wrong").request(
            "POST", "/api/v1/todos/claim", {"worker": "w1"}
        )
        assert status == 401
        assert server.cpu_seconds() > 0
    with psycopg.connect(url, autocommit=True) as conn:
        bare = conn.execute(
            f"SELECT state, count(*) FROM {peers.BARE_TABLE} GROUP BY state"
        ).fetchall()
        todos = conn.execute(
            "SELECT state, count(*) FROM todos GROUP BY state"
        ).fetchall()
    assert sorted(bare) == [("done", 1), ("pending", 1)]
    assert sorted(todos) == [("done", 11), ("pending", 1)]


@pytest.mark.django_db(transaction=True)
def test_a_path_and_its_floor_take_turns_and_give_one_ratio(endpoint, bare_table):
    """side_by_side runs the floor and the paths beside it in the same
    processes, in turns of the wall clock: each drains the one queue, and a
    path's ratio is its todos/s over the floor's, both over the turns each
    held."""
    url = bare_table
    setup = SimpleNamespace(
        urls={"switchboard": url},
        endpoint_id=str(endpoint.id),
        token=endpoint.token,
        floor_port=None,
    )
    args = SimpleNamespace(seconds=0.6, slice=0.1, workers=2, fill=0.1)
    with peers.serve_floor(SimpleNamespace(server_workers=1, port=0), setup):
        figures = peers.side_by_side(
            "httpfloorstore", ["httpfloorstore10"], args, setup
        )
    rates = figures["rates"]
    assert rates["httpfloorstore"] > 0 and rates["httpfloorstore10"] > 0
    assert figures["ratios"] == {
        "httpfloorstore10": pytest.approx(
            rates["httpfloorstore10"] / rates["httpfloorstore"]
        )
    }
    with psycopg.connect(url, autocommit=True) as conn:
        (done,) = conn.execute(
            "SELECT count(*) FROM todos WHERE state = 'done'"
        ).fetchone()
    assert done > 0
