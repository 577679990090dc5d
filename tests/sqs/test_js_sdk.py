"""The AWS SDK for JavaScript v3 (@aws-sdk/client-sqs from npm) drives the surface.

tests/js holds its package.json and lock; the first test run installs it with
``npm ci`` (node 18+ must be on the machine; the test skips without node).
"""

import json
import os
import shutil
import subprocess

import pytest

from tests.support import ROOT

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

JS = ROOT / "tests" / "js"


@pytest.fixture(scope="session")
def node_sdk():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the JavaScript SDK test")
    if not (JS / "node_modules" / "@aws-sdk" / "client-sqs").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=JS,
            check=True,
            timeout=300,
        )
    return node


def test_javascript_sdk_sends_with_attributes_receives_and_deletes(
    node_sdk, make_sqs, sqs_url
):
    _, issued, _ = make_sqs()
    completed = subprocess.run(
        [node_sdk, "sqs_roundtrip.mjs"],
        cwd=JS,
        env={
            **os.environ,
            "SQS_ENDPOINT": sqs_url,
            "AWS_ACCESS_KEY_ID": issued.access_key_id,
            "AWS_SECRET_ACCESS_KEY": issued.secret_access_key,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    seen = json.loads(completed.stdout.strip().splitlines()[-1])
    assert seen["queueUrl"] == f"{sqs_url}/{issued.account_id}/js-jobs"
    assert seen["batchSuccessful"] == ["a", "b"]
    assert seen["receivedCount"] == 3
    assert json.loads(seen["body"]) == {"hello": "wörld"}
    assert seen["receivedAttributesMd5"] == seen["sentAttributesMd5"]
    assert seen["attributes"] == {
        "kind": {"DataType": "String", "StringValue": "résumé"},
        "size": {"DataType": "Number", "StringValue": "12.5"},
        "raw": {"DataType": "Binary", "BinaryValue": [0, 1, 2, 254, 255]},
    }
    assert seen["receiveCount"] == "1"
    assert (seen["visibleAfter"], seen["inFlightAfter"]) == ("0", "0")
    assert seen["missing"]["name"] == "QueueDoesNotExist"
    assert seen["missing"]["status"] == 400
