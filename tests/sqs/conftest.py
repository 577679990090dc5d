"""Fixtures of the SQS surface's tests: a real gunicorn and real SQS clients."""

import boto3
import pytest
from botocore.config import Config

from tests.support import serve_gunicorn
from todos.sqs import credentials


@pytest.fixture(scope="module")
def sqs_url(django_db_setup, django_db_blocker):
    """The URL of a gunicorn serving Switchboard on the test database."""
    yield from serve_gunicorn(django_db_blocker)


def client_for(url, access_key_id, secret, region="us-east-1", **config):
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, **config),
    )


@pytest.fixture
def make_sqs(make_endpoint, sqs_url):
    """Return a factory: make_sqs(name, queues) -> (endpoint, issued, boto3 client)."""

    def factory(name="sqs-agent", queues=("*",), owner="alice", region="us-east-1"):
        endpoint = make_endpoint(name, queues=queues, owner=owner)
        issued = credentials.issue(endpoint)
        client = client_for(
            sqs_url, issued.access_key_id, issued.secret_access_key, region
        )
        return endpoint, issued, client

    return factory
