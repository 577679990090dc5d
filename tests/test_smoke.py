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


def test_migrations_match_the_models(db):
    """The schema the migrations build is the one the models describe."""
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
