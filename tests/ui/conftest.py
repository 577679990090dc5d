"""The Board's fixtures: a staff operator, and a test client logged in as it."""

import pytest
from django.contrib.auth import get_user_model


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_user(
        "ops", password="a-long-password", is_staff=True
    )


@pytest.fixture
def board(client, operator):
    client.force_login(operator)
    return client
