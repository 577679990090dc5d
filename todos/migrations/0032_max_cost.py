"""A todo's ``max_cost`` (CONTRACT §18): what one attempt may cost in USD,
reserved against the budgets of its scope at claim and released at the
attempt's end, so concurrent claims overshoot a limit by at most the
reservations in flight.

- ``todos.max_cost`` (≥ 0, NULL: none; a todo without one claims as ever).
- ``budget_reservations``: one row per (todo, attempt, budget) while the
  attempt runs.
- ``switchboard_reserve``: under the row locks of the endpoint's USD budgets
  that cover the candidates (taken in id order, as the spend counts them),
  reserve each candidate's max_cost against every budget of its scope when
  spent + reserved + max_cost stays within the limit plus what the owner
  raised this window (a budget the owner resumed this window reserves
  without a check); returns the candidates reserved, the others are passed
  over.
- A trigger releases an attempt's reservations when the attempt ends (the
  todo leaves ``claimed``, or a redelivery starts the next attempt) or the
  todo is deleted; it fires only for a todo with a max_cost.
"""

from django.db import migrations, models

FUNCTIONS = r"""
CREATE TABLE budget_reservations (
    todo_id uuid NOT NULL,
    attempt integer NOT NULL,
    budget_id uuid NOT NULL,
    usd numeric(20, 6) NOT NULL,
    PRIMARY KEY (todo_id, attempt, budget_id)
);
CREATE INDEX budget_reservations_budget_idx ON budget_reservations (budget_id);

ALTER TABLE todos ADD CONSTRAINT todos_max_cost_check CHECK (max_cost >= 0);

-- Whether a todo's max_cost fits every USD budget of its scope: what the
-- budget spent this window plus what other attempts hold reserved plus this
-- one stays within its limit and this window's raise. A budget the owner
-- resumed this window holds nothing back. The claim's lanes pass over a todo
-- that does not fit (as this statement's snapshot sees it);
-- switchboard_reserve decides under the budgets' locks.
CREATE FUNCTION switchboard_reservation_fits(
    p_endpoint uuid, p_queue text, p_group text, p_todo uuid, p_cost float8)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT EXISTS (
        SELECT 1
          FROM budgets s
         CROSS JOIN LATERAL (SELECT coalesce(now() >= s.window_start
                                             AND now() < s.window_end, FALSE)
                             AS cur) w
         WHERE s.endpoint_id = p_endpoint AND s.limit_usd IS NOT NULL
           AND (s.queue IS NULL OR s.queue = p_queue)
           AND (s.group_key IS NULL OR s.group_key = p_group)
           AND NOT (w.cur AND s.resumed_at IS NOT NULL)
           AND CASE WHEN w.cur THEN s.spent_usd ELSE 0 END
               + (SELECT coalesce(sum(r.usd), 0) FROM budget_reservations r
                   WHERE r.budget_id = s.id AND r.todo_id <> p_todo)
               + p_cost::numeric
               > s.limit_usd + CASE WHEN w.cur THEN s.raised_usd ELSE 0 END);
END
$$;

-- Reserve each candidate's max_cost (in the order given) against the USD
-- budgets of its scope, under their row locks (all of them taken first, in
-- id order, as the spend takes them), for the attempt the claim starts.
-- Returns the candidates reserved; the others are passed over.
CREATE FUNCTION switchboard_reserve(
    p_endpoint uuid, p_ids uuid[], p_queues text[], p_groups text[],
    p_costs float8[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i integer;
BEGIN
    PERFORM 1 FROM budgets
      WHERE endpoint_id = p_endpoint AND limit_usd IS NOT NULL
        AND (queue IS NULL OR queue = ANY(p_queues))
      ORDER BY id
        FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF switchboard_reservation_fits(p_endpoint, p_queues[i], p_groups[i],
                                        p_ids[i], p_costs[i]) THEN
            INSERT INTO budget_reservations (todo_id, attempt, budget_id, usd)
            SELECT p_ids[i], (SELECT t.attempt + 1 FROM todos t WHERE t.id = p_ids[i]),
                   s.id, p_costs[i]::numeric
              FROM budgets s
             WHERE s.endpoint_id = p_endpoint AND s.limit_usd IS NOT NULL
               AND (s.queue IS NULL OR s.queue = p_queues[i])
               AND (s.group_key IS NULL OR s.group_key = p_groups[i])
            ON CONFLICT (todo_id, attempt, budget_id) DO NOTHING;
            RETURN NEXT p_ids[i];
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION switchboard_reservation_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM budget_reservations
     WHERE todo_id = OLD.id AND attempt = OLD.attempt;
    RETURN NULL;
END
$$;

CREATE TRIGGER todos_reservation_release
    AFTER UPDATE OF state, attempt ON todos FOR EACH ROW
    WHEN (OLD.max_cost IS NOT NULL AND OLD.state = 'claimed'
          AND (NEW.state <> 'claimed' OR NEW.attempt <> OLD.attempt))
    EXECUTE FUNCTION switchboard_reservation_release();

CREATE TRIGGER todos_reservation_release_deleted
    AFTER DELETE ON todos FOR EACH ROW
    WHEN (OLD.max_cost IS NOT NULL AND OLD.state = 'claimed')
    EXECUTE FUNCTION switchboard_reservation_release();
"""

DROP_FUNCTIONS = """
DROP TRIGGER todos_reservation_release_deleted ON todos;
DROP TRIGGER todos_reservation_release ON todos;
DROP FUNCTION switchboard_reservation_release();
DROP FUNCTION switchboard_reserve(uuid, uuid[], text[], text[], float8[]);
DROP FUNCTION switchboard_reservation_fits(uuid, text, text, uuid, float8);
ALTER TABLE todos DROP CONSTRAINT todos_max_cost_check;
DROP TABLE budget_reservations;
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0031_usage_minutes")]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="max_cost",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
