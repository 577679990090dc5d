"""The migrations: numbered in the order they run, and at home in a database
migrated before two of them were renumbered.

0009_sqs_credentials_encrypted_secrets was 0011_…, and 0011_history_key was
0008_…; each ``replaces`` its old name, so a database whose django_migrations
holds the old names has them applied and migrates on without applying either
again.
"""

import subprocess
import sys
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from tests.support import ROOT, child_env, database_url

# Old name -> the name it runs under now.
RENUMBERED = {
    "0011_sqs_credentials_encrypted_secrets": "0009_sqs_credentials_encrypted_secrets",
    "0008_history_key": "0011_history_key",
}
# The order they ran in under the old names.
OLD_ORDER = [
    "0008_queues_leases_delays",
    "0011_sqs_credentials_encrypted_secrets",
    "0010_board_stats",
    "0008_history_key",
]


def todos_plan(loader):
    """The todos migrations in the order they run, by name."""
    (leaf,) = loader.graph.leaf_nodes("todos")
    return [name for app, name in loader.graph.forwards_plan(leaf) if app == "todos"]


def test_migrations_match_the_models(db):
    """The schema the migrations build is the one the models describe."""
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_migration_numbers_follow_the_order_they_run_in():
    names = todos_plan(MigrationLoader(None, ignore_no_migrations=True))

    numbers = [int(name.split("_", 1)[0]) for name in names]

    assert numbers == list(range(1, len(names) + 1)), names


def record_old_names(applied_through):
    """Make django_migrations what a database migrated under the old names, as
    far as ``applied_through`` (an old name), holds: the new names gone, the old
    ones up to it present, nothing after it."""
    plan = todos_plan(MigrationLoader(None, ignore_no_migrations=True))
    old_plan = plan[: plan.index(OLD_ORDER[0])] + OLD_ORDER
    old_plan += plan[len(old_plan) :]
    applied = old_plan[: old_plan.index(applied_through) + 1]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'todos'")
        cursor.executemany(
            "INSERT INTO django_migrations (app, name, applied)"
            " VALUES ('todos', %s, now())",
            [[name] for name in applied],
        )
    return old_plan[len(applied) :]


def pending(executor):
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [
        (migration.app_label, migration.name, backwards)
        for migration, backwards in plan
    ]


def test_a_database_migrated_under_the_old_numbers_migrates_applying_nothing(db):
    record_old_names(applied_through=todos_plan(MigrationLoader(None))[-1])
    assert pending(MigrationExecutor(connection)) == []

    output = StringIO()
    call_command("migrate", interactive=False, stdout=output)

    assert "No migrations to apply." in output.getvalue()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, count(*) FROM django_migrations WHERE app = 'todos'"
            " GROUP BY name"
        )
        recorded = dict(cursor.fetchall())
    # The new names are recorded beside the old, each once.
    assert set(recorded) >= set(RENUMBERED) | set(RENUMBERED.values())
    assert set(recorded.values()) == {1}


@pytest.mark.parametrize("applied_through", OLD_ORDER[:-1])
def test_a_database_between_the_old_numbers_applies_only_what_it_lacks(
    db, applied_through
):
    """A clone migrated part of the way under the old names: the rest, in order,
    under the new ones, and nothing it has already."""
    missing = record_old_names(applied_through)

    plan = pending(MigrationExecutor(connection))

    expected = [RENUMBERED.get(name, name) for name in missing]
    assert plan == [("todos", name, False) for name in expected]


@pytest.mark.slow
def test_a_new_session_of_the_database_runs_without_jit(db):
    """0038: PostgreSQL's JIT compiled the admitting claim's 456 functions on
    every claim once the table held some 100,000 todos (150-220 ms a claim);
    every new session of Switchboard's database starts with it off."""
    with psycopg.connect(database_url()) as conn:
        (jit,) = conn.execute("SHOW jit").fetchone()
    assert jit == "off"


@pytest.mark.django_db(transaction=True)
def test_the_migrations_run_for_a_database_owner_who_is_not_a_superuser():
    """A hosted PostgreSQL gives the application a database it owns, not a
    superuser: the trigram extension (0018) is one its owner may create."""
    name = f"{connection.settings_dict['NAME']}_owned"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cursor.execute(f'DROP ROLE IF EXISTS "{name}"')
        cursor.execute(
            f"CREATE ROLE \"{name}\" LOGIN NOSUPERUSER NOCREATEDB PASSWORD 'owner'"
        )
        cursor.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    server = database_url().split("@", 1)[1].rsplit("/", 1)[0]
    owned = f"postgres://{name}:owner@{server}/{name}"
    try:
        migrated = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=child_env(owned),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert migrated.returncode == 0, migrated.stderr
        with psycopg.connect(owned) as conn:
            (index,) = conn.execute(
                "SELECT to_regclass('todos_title_trgm_idx')::text"
            ).fetchone()
            (jit,) = conn.execute("SHOW jit").fetchone()
        assert index == "todos_title_trgm_idx"
        assert jit == "off"  # 0038: its owner may turn JIT off for it
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'DROP ROLE IF EXISTS "{name}"')
