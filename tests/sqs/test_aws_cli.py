"""The AWS CLI (`aws sqs … --endpoint-url`): send, receive and delete."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

AWS = Path(sys.executable).with_name("aws")


@pytest.fixture
def aws(make_sqs, sqs_url, tmp_path):
    if not AWS.exists():
        pytest.skip("the awscli package (dev extra) is not installed")
    _, issued, _ = make_sqs()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": issued.access_key_id,
        "AWS_SECRET_ACCESS_KEY": issued.secret_access_key,
        "AWS_DEFAULT_REGION": "us-west-2",
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
    }

    def run(*args, check=True):
        completed = subprocess.run(
            [str(AWS), "sqs", *args, "--endpoint-url", sqs_url, "--output", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed

    run.account_id = issued.account_id
    return run


def test_aws_cli_sends_receives_and_deletes(aws, sqs_url):
    url = json.loads(aws("create-queue", "--queue-name", "cli-jobs").stdout)["QueueUrl"]
    assert url == f"{sqs_url}/{aws.account_id}/cli-jobs"
    sent = json.loads(
        aws(
            "send-message",
            "--queue-url",
            url,
            "--message-body",
            "from the CLI",
            "--message-attributes",
            '{"who": {"DataType": "String", "StringValue": "aws-cli"}}',
        ).stdout
    )
    received = json.loads(
        aws(
            "receive-message",
            "--queue-url",
            url,
            "--message-attribute-names",
            "All",
            "--wait-time-seconds",
            "1",
        ).stdout
    )["Messages"]
    assert [m["MessageId"] for m in received] == [sent["MessageId"]]
    assert received[0]["Body"] == "from the CLI"
    assert received[0]["MessageAttributes"]["who"]["StringValue"] == "aws-cli"
    assert received[0]["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    aws(
        "delete-message",
        "--queue-url",
        url,
        "--receipt-handle",
        received[0]["ReceiptHandle"],
    )
    empty = aws("receive-message", "--queue-url", url).stdout
    assert "Messages" not in (json.loads(empty) if empty.strip() else {})


def test_aws_cli_reports_a_missing_queue(aws):
    failed = aws("get-queue-url", "--queue-name", "never-made", check=False)
    assert failed.returncode != 0
    assert "NonExistentQueue" in failed.stderr or "QueueDoesNotExist" in failed.stderr
