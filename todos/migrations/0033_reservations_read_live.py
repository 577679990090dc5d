"""max_cost reservations (0032) are counted while their attempt runs, read
from the todo itself: a reservation of (todo, attempt) holds while that todo
is claimed in that attempt. The attempt's end (whatever ends it) releases it
in the same commit, with no trigger on ``todos``: a claim or an
acknowledgement of a todo without max_cost pays nothing for reservations.
``switchboard_reserve`` deletes the released rows of the budgets it locks.
"""

from django.db import migrations

FUNCTIONS = r"""
DROP TRIGGER todos_reservation_release_deleted ON todos;
DROP TRIGGER todos_reservation_release ON todos;
DROP FUNCTION switchboard_reservation_release();
DROP FUNCTION switchboard_reserve(uuid, uuid[], text[], text[], float8[]);
DROP FUNCTION switchboard_reservation_fits(uuid, text, text, uuid, float8);

-- Whether a todo's max_cost fits every USD budget of its scope: what the
-- budget spent this window, plus what the other running attempts hold
-- reserved, plus ``p_held`` (budget id -> dollars this claim reserved
-- already), plus this one stays within its limit and this window's raise. A
-- budget the owner resumed this window holds nothing back. The claim's lanes
-- pass over a todo that does not fit (as this statement's snapshot sees it);
-- switchboard_reserve decides under the budgets' locks.
CREATE FUNCTION switchboard_reservation_fits(
    p_endpoint uuid, p_queue text, p_group text, p_todo uuid, p_cost float8,
    p_held jsonb DEFAULT NULL)
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
               + (SELECT coalesce(sum(r.usd), 0)
                    FROM budget_reservations r
                    JOIN todos t ON t.id = r.todo_id AND t.state = 'claimed'
                                AND t.attempt = r.attempt
                   WHERE r.budget_id = s.id AND r.todo_id <> p_todo)
               + coalesce((p_held ->> s.id::text)::numeric, 0)
               + p_cost::numeric
               > s.limit_usd + CASE WHEN w.cur THEN s.raised_usd ELSE 0 END);
END
$$;

-- Reserve each candidate's max_cost (in the order given) against the USD
-- budgets of its scope, under their row locks (all of them taken first, in
-- id order, as the spend takes them), for the attempt the claim starts; the
-- reservations of attempts that ended are deleted first. Returns the
-- candidates reserved; the others are passed over.
CREATE FUNCTION switchboard_reserve(
    p_endpoint uuid, p_ids uuid[], p_queues text[], p_groups text[],
    p_costs float8[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i integer;
    locked uuid[];
    held jsonb := '{}';
    b uuid;
BEGIN
    SELECT array_agg(id) INTO locked
      FROM (SELECT id FROM budgets
             WHERE endpoint_id = p_endpoint AND limit_usd IS NOT NULL
               AND (queue IS NULL OR queue = ANY(p_queues))
             ORDER BY id
               FOR UPDATE) l;
    IF locked IS NULL THEN
        RETURN QUERY SELECT unnest(p_ids);
        RETURN;
    END IF;
    DELETE FROM budget_reservations r
     WHERE r.budget_id = ANY(locked)
       AND NOT EXISTS (SELECT 1 FROM todos t
                        WHERE t.id = r.todo_id AND t.state = 'claimed'
                          AND t.attempt = r.attempt);
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        IF switchboard_reservation_fits(p_endpoint, p_queues[i], p_groups[i],
                                        p_ids[i], p_costs[i], held) THEN
            FOR b IN
                INSERT INTO budget_reservations (todo_id, attempt, budget_id, usd)
                SELECT p_ids[i],
                       (SELECT t.attempt + 1 FROM todos t WHERE t.id = p_ids[i]),
                       s.id, p_costs[i]::numeric
                  FROM budgets s
                 WHERE s.endpoint_id = p_endpoint AND s.limit_usd IS NOT NULL
                   AND (s.queue IS NULL OR s.queue = p_queues[i])
                   AND (s.group_key IS NULL OR s.group_key = p_groups[i])
                ON CONFLICT (todo_id, attempt, budget_id) DO NOTHING
                RETURNING budget_id
            LOOP
                held := held || jsonb_build_object(
                    b::text,
                    coalesce((held ->> b::text)::numeric, 0) + p_costs[i]::numeric);
            END LOOP;
            RETURN NEXT p_ids[i];
        END IF;
    END LOOP;
END
$$;
"""

# Back to 0032's functions and trigger.
PREVIOUS = r"""
DROP FUNCTION switchboard_reserve(uuid, uuid[], text[], text[], float8[]);
DROP FUNCTION switchboard_reservation_fits(uuid, text, text, uuid, float8, jsonb);

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


class Migration(migrations.Migration):
    dependencies = [("todos", "0032_max_cost")]

    operations = [migrations.RunSQL(sql=FUNCTIONS, reverse_sql=PREVIOUS)]
