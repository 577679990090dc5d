"""What the store keeps for tracing (todos.telemetry.tracing): a delivery's span events.

A delivery's ``process`` span is written when the delivery ends; what happens
to the todo meanwhile in other requests (progress, a cancel request, the
answer that ends a hold) is kept on the row until then, tagged with its
delivery. Only while tracing is on: off, nothing here runs.
"""

import json

from todos.telemetry import tracing

from .rows import JSONObject, Todo
from .sql import Statement, Steps, on_django

# Append one event; past MAX_TRACE_EVENTS the oldest goes (a delivery's span
# shows its latest events, and a row never grows without bound).
RECORD_EVENT_SQL = """
UPDATE todos
   SET trace_events = CASE
           WHEN jsonb_array_length(coalesce(trace_events, '[]'::jsonb)) >= %(keep)s
           THEN (trace_events - 0) || jsonb_build_array(%(event)s::jsonb)
           ELSE coalesce(trace_events, '[]'::jsonb)
                || jsonb_build_array(%(event)s::jsonb) END
 WHERE id = %(id)s
"""


def record_trace_event_steps(todo: Todo, event: JSONObject | None) -> Steps[None]:
    """Keep a span event on the todo for its delivery's process span."""
    if event is None:
        return
    params = {
        "id": todo.id,
        "event": json.dumps(event),
        "keep": tracing.MAX_TRACE_EVENTS,
    }
    yield Statement("record_trace_event", RECORD_EVENT_SQL, params, None)


record_trace_event = on_django(record_trace_event_steps)
