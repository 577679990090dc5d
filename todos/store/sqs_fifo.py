"""SQS FIFO queues (CONTRACT §11, §17): a ``.fifo`` queue's own attributes.

A FIFO queue is a queue with groups whose ``group_concurrency`` is 1
(store.admission): the claim keeps each group's order and hands out one of its
todos at a time. What SQS adds on top is kept in ``queues.sqs_fifo``:
``ContentBasedDeduplication``, ``DeduplicationScope`` and
``FifoThroughputLimit``, as SQS spells them; NULL for every other queue.
"""

import json

from .rows import JSONObject, QueueNotGranted, Scope
from .sql import Statement, Steps, _run, _scope_params, on_django, on_pool

# What a FIFO queue has when CreateQueue does not say (SQS's defaults).
FIFO_DEFAULTS: JSONObject = {
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
}
FIFO_CHOICES = {
    "ContentBasedDeduplication": ("true", "false"),
    "DeduplicationScope": ("queue", "messageGroup"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
FIFO_SUFFIX = ".fifo"


def is_fifo_name(name: str) -> bool:
    """A queue is an SQS FIFO queue when its name ends in ``.fifo``."""
    return name.endswith(FIFO_SUFFIX)


def _params(scope: Scope, name: str) -> dict[str, object]:
    if not scope.covers(name):
        raise QueueNotGranted(name)
    return {**_scope_params(scope), "name": name}


# The queue's FIFO attributes merged over what it had (the defaults first);
# NULL when the queue does not exist.
SET_FIFO_SQL = """
UPDATE queues
   SET sqs_fifo = %(defaults)s::jsonb || coalesce(sqs_fifo, '{}'::jsonb)
                  || %(given)s::jsonb,
       updated_at = CASE WHEN sqs_fifo IS NULL
                              OR NOT sqs_fifo @> %(given)s::jsonb
                         THEN now() ELSE updated_at END
 WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
   AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
RETURNING sqs_fifo
"""


def set_fifo_attributes(scope: Scope, name: str, given: JSONObject) -> JSONObject:
    """Keep a FIFO queue's attributes (those given over those it had, over
    SQS's defaults); return them all. The queue must exist."""
    for key, value in given.items():
        if value not in FIFO_CHOICES.get(key, ()):
            raise ValueError(f"{key}: one of {', '.join(FIFO_CHOICES.get(key, ()))}")
    params = {
        **_params(scope, name),
        "defaults": json.dumps(FIFO_DEFAULTS),
        "given": json.dumps(given),
    }
    row = _run("set_fifo_attributes", SET_FIFO_SQL, params, fetch="one")
    return dict(FIFO_DEFAULTS) if row is None else _kept(row[0])


FIFO_ATTRIBUTES_SQL = """
SELECT sqs_fifo FROM queues
 WHERE endpoint_id = %(endpoint_id)s AND name = %(name)s
   AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
"""


def fifo_attributes_steps(scope: Scope, name: str) -> Steps[JSONObject | None]:
    """A queue's kept FIFO attributes ({} when it was never made a FIFO
    queue); None when the queue does not exist (one index probe)."""
    row = yield Statement(
        "fifo_attributes", FIFO_ATTRIBUTES_SQL, _params(scope, name), "one"
    )
    if row is None:
        return None
    return _kept(row[0])


def _kept(value: object) -> JSONObject:
    """The column's value: Django's connection reads jsonb as text, the async
    pool as a dict."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    assert isinstance(value, dict)
    return value


fifo_attributes = on_django(fifo_attributes_steps)
afifo_attributes = on_pool(fifo_attributes_steps)
