"""What admission holds back now, per queue, for ``/metrics`` (CONTRACT §17).

A gauge, not a counter: the groups whose due pending todos their limit (the
group's override, else the queue's ``group_concurrency``) or their pause holds
back at this instant, and how many todos wait in them. The claim does not
count the candidates it passes over (``switchboard_admit`` returns only those
it admits), so claims passed over and rate-limited waits have no counter yet.
"""

from dataclasses import dataclass

from .sql import _run

# Each group with due pending todos (todos_group_pending_idx), kept when
# switchboard_group_full (the claim's own test) says it has no room.
HELD_BY_LIMIT_SQL = """
SELECT p.endpoint_id::text, p.queue, count(*), sum(p.waiting)
  FROM (SELECT t.endpoint_id, t.queue, t.group_key, count(*) AS waiting
          FROM todos t
         WHERE t.state = 'pending' AND t.group_key IS NOT NULL
           AND t.available_at <= statement_timestamp()
         GROUP BY t.endpoint_id, t.queue, t.group_key) p
  JOIN queues q ON q.endpoint_id = p.endpoint_id AND q.name = p.queue
 WHERE switchboard_group_full(p.endpoint_id, p.queue, p.group_key,
                              q.group_concurrency)
 GROUP BY p.endpoint_id, p.queue
 ORDER BY 1, 2
"""


@dataclass(frozen=True)
class HeldByLimit:
    """One queue's groups at their limit (or paused) with todos waiting."""

    endpoint_id: str
    queue: str
    groups: int
    todos: int


def held_by_limit() -> list[HeldByLimit]:
    """Per queue, the groups whose due todos a limit or a pause holds back
    now, and those todos (system-wide: /metrics is staff's)."""
    return [
        HeldByLimit(endpoint_id, queue, int(groups), int(todos))
        for endpoint_id, queue, groups, todos in _run(
            "held_by_limit", HELD_BY_LIMIT_SQL, {}
        )
    ]
