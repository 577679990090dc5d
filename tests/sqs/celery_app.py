"""A Celery app on kombu's SQS transport, pointed at Switchboard.

Used by tests/sqs/test_celery.py.

The worker is started as ``celery -A tests.sqs.celery_app worker`` with
SQS_BROKER_URL (``sqs://KEY:SECRET@127.0.0.1:PORT``) and CELERY_RESULTS_FILE
set; each task run appends one JSON line to that file.
"""

import json
import os

from celery import Celery

QUEUE = "celery-jobs"


def make_app(broker_url):
    app = Celery("switchboard_sqs_test", broker=broker_url)
    app.conf.update(
        broker_transport_options={
            "region": "us-east-1",
            "is_secure": False,
            "wait_time_seconds": 1,
            "polling_interval": 0.2,
            "visibility_timeout": 30,
            # Plain JSON bodies: the Board shows them pretty-printed.
            "sqs_base64_encoding": False,
        },
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        task_acks_late=True,
        # A task that raises is not acknowledged: kombu hands the message
        # back (ChangeMessageVisibility) and SQS delivers it again.
        task_acks_on_failure_or_timeout=False,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        result_backend=None,
    )
    return app


app = make_app(os.environ.get("SQS_BROKER_URL", "sqs://unset:unset@127.0.0.1:9"))


def _record(**fields):
    with open(os.environ["CELERY_RESULTS_FILE"], "a", encoding="utf-8") as out:
        out.write(json.dumps(fields) + "\n")


@app.task(name="switchboard.record")
def record(value):
    _record(task="record", value=value)
    return value


@app.task(name="switchboard.flaky")
def flaky(value):
    marker = os.environ["CELERY_RESULTS_FILE"] + f".{value}.failed"
    if not os.path.exists(marker):
        open(marker, "w").close()
        _record(task="flaky", value=value, outcome="raised")
        raise RuntimeError("the first run of a flaky task fails")
    _record(task="flaky", value=value, outcome="ok")
    return value


@app.task(name="switchboard.traced", bind=True)
def traced(self, value):
    """Record the W3C context the task's headers carried (a tracing
    instrumentation puts it there): it crosses Switchboard in the body."""
    _record(task="traced", value=value, traceparent=self.request.get("traceparent"))
    return value
