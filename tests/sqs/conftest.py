"""Fixtures of the SQS surface's tests: a real gunicorn and real SQS clients."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from django.db import connection

from todos.sqs import credentials

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url():
    settings = connection.settings_dict
    return "postgres://{}@{}:{}/{}".format(
        settings["USER"],
        settings["HOST"] or "127.0.0.1",
        settings["PORT"] or 5432,
        settings["NAME"],
    )


def start_gunicorn(database, threads=16):
    """Start gunicorn (the project's config) on a free port; return (process, url)."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "DJANGO_SETTINGS_MODULE": "board.settings",
        "SWITCHBOARD_DB_CONNECT_TIMEOUT": "1",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "board.wsgi",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            str(threads),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("gunicorn did not start") from None
            time.sleep(0.1)


def stop(process):
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def sqs_url(django_db_setup, django_db_blocker):
    """The URL of a gunicorn serving Switchboard on the test database."""
    with django_db_blocker.unblock():
        process, url = start_gunicorn(database_url())
    yield url
    stop(process)


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
