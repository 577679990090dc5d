"""A connection used a moment ago is trusted without a round trip.

Django's per-request health check and psycopg_pool's check on a borrow each
cost a ``SELECT 1``: one round trip more per agent call. A connection that
finished work less than ``CHECK_AFTER_IDLE_SECONDS`` ago is as good as proven;
one idle longer (perhaps across a PostgreSQL restart) is checked, and replaced
when the check fails.
"""

import time

CHECK_AFTER_IDLE_SECONDS = 1.0


def due_for_check(conn: object) -> bool:
    """Whether a connection borrowed now needs the check; stamps the borrow."""
    now = time.monotonic()
    borrowed: float | None = getattr(conn, "_switchboard_borrowed_at", None)
    conn._switchboard_borrowed_at = now  # type: ignore[attr-defined]  # ours, on the connection
    return borrowed is None or now - borrowed >= CHECK_AFTER_IDLE_SECONDS
