"""Budget counting reads the window a budget keeps while it is the current
one: the zone arithmetic of ``switchboard_budget_window`` runs only when a
window rolls over (``switchboard_budget_count``, ``switchboard_budget_spend``;
bodies otherwise as 0029 made them).
"""

from django.db import migrations

FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION switchboard_budget_count(p_id uuid, p_usd numeric, p_tokens bigint)
RETURNS TABLE (budget_id uuid, endpoint_id uuid, event text, actor text,
               detail jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    b budgets;
    w_start timestamptz;
    w_end timestamptz;
    v_usd numeric;
    v_tokens bigint;
    v_raised_usd numeric := 0;
    v_raised_tokens bigint := 0;
    resumed timestamptz;
    soft_at timestamptz;
    spent_at timestamptz;
    until timestamptz;
    events text[] := '{}';
    e text;
BEGIN
    SELECT * INTO b FROM budgets WHERE budgets.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF now() >= b.window_start AND now() < b.window_end THEN
        -- The kept window is the current one: no zone arithmetic.
        w_start := b.window_start;
        w_end := b.window_end;
    ELSE
        SELECT start_at, end_at INTO w_start, w_end
          FROM switchboard_budget_window(b.window_unit, b.time_zone, now());
    END IF;
    IF b.window_start IS DISTINCT FROM w_start THEN
        v_usd := p_usd;
        v_tokens := p_tokens;
    ELSE
        v_usd := b.spent_usd + p_usd;
        v_tokens := b.spent_tokens + p_tokens;
        v_raised_usd := b.raised_usd;
        v_raised_tokens := b.raised_tokens;
        resumed := b.resumed_at;
        soft_at := b.soft_reached_at;
        spent_at := b.exhausted_at;
    END IF;
    IF soft_at IS NULL
       AND ((b.limit_usd IS NOT NULL AND v_usd >= b.limit_usd * b.soft_percent / 100)
         OR (b.limit_tokens IS NOT NULL
             AND v_tokens >= b.limit_tokens * b.soft_percent / 100.0)) THEN
        soft_at := now();
        events := events || 'budget.soft_limit'::text;
    END IF;
    IF (b.limit_usd IS NOT NULL AND v_usd >= b.limit_usd + v_raised_usd)
       OR (b.limit_tokens IS NOT NULL AND v_tokens >= b.limit_tokens + v_raised_tokens) THEN
        IF spent_at IS NULL THEN
            spent_at := now();
            events := events || 'budget.exhausted'::text;
        END IF;
    ELSE
        spent_at := NULL;
    END IF;
    IF spent_at IS NOT NULL AND resumed IS NULL THEN
        until := w_end;
    END IF;
    IF until IS NULL AND b.in_force_until > now() THEN
        events := events || 'budget.resumed'::text;
    END IF;
    UPDATE budgets
       SET window_start = w_start, window_end = w_end, spent_usd = v_usd,
           spent_tokens = v_tokens, raised_usd = v_raised_usd,
           raised_tokens = v_raised_tokens, resumed_at = resumed,
           soft_reached_at = soft_at, exhausted_at = spent_at,
           in_force_until = until
     WHERE budgets.id = p_id;
    FOREACH e IN ARRAY events LOOP
        budget_id := b.id;
        endpoint_id := b.endpoint_id;
        event := e;
        actor := '';
        detail := jsonb_build_object(
            'scope', b.scope, 'queue', b.queue, 'group', b.group_key,
            'action', b.action, 'window_start', w_start,
            'window_end', w_end, 'spent_usd', v_usd, 'spent_tokens', v_tokens,
            'limit_usd', b.limit_usd + v_raised_usd,
            'limit_tokens', b.limit_tokens + v_raised_tokens);
        PERFORM pg_notify('switchboard_todo_event', json_build_object(
            'event', e, 'id', b.id, 'endpoint_id', b.endpoint_id,
            'queue', coalesce(b.queue, ''))::text);
        RETURN NEXT;
    END LOOP;
END
$$;

-- Count ledger rows just written (one array element each: the row's scope,
-- its figures, and its figures and time before this write, NULL for a new
-- row) against every budget they fall under. A replaced row counts its
-- difference; its earlier figure counts only if it was made in the budget's
-- current window (else that window rolled and forgot it).
CREATE OR REPLACE FUNCTION switchboard_budget_spend(
    p_endpoints uuid[], p_queues text[], p_groups text[], p_usd numeric[],
    p_tokens bigint[], p_prev_usd numeric[], p_prev_tokens bigint[],
    p_prev_at timestamptz[])
RETURNS TABLE (budget_id uuid, endpoint_id uuid, event text, actor text,
               detail jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    m record;
BEGIN
    FOR m IN
        SELECT b.id,
               sum(r.usd - CASE WHEN r.prev_at >= w.start_at
                                THEN r.prev_usd ELSE 0 END) AS usd,
               sum(r.tokens - CASE WHEN r.prev_at >= w.start_at
                                   THEN r.prev_tokens ELSE 0 END)::bigint AS tokens
          FROM unnest(p_endpoints, p_queues, p_groups, p_usd, p_tokens, p_prev_usd,
                      p_prev_tokens, p_prev_at)
               AS r (endpoint_id, queue, group_key, usd, tokens, prev_usd,
                     prev_tokens, prev_at)
          JOIN budgets b ON b.endpoint_id = r.endpoint_id
           AND (b.queue IS NULL OR b.queue = r.queue)
           AND (b.group_key IS NULL OR b.group_key = r.group_key)
         CROSS JOIN LATERAL (
               SELECT b.window_start AS start_at
                WHERE now() >= b.window_start AND now() < b.window_end
               UNION ALL
               SELECT c.start_at
                 FROM switchboard_budget_window(b.window_unit, b.time_zone, now()) c
                WHERE NOT coalesce(now() >= b.window_start
                                   AND now() < b.window_end, FALSE)) w
         GROUP BY b.id
         ORDER BY b.id
    LOOP
        RETURN QUERY SELECT * FROM switchboard_budget_count(m.id, m.usd, m.tokens);
    END LOOP;
END
$$;
"""

# Back to 0029's bodies.
PREVIOUS = r"""
CREATE OR REPLACE FUNCTION switchboard_budget_count(p_id uuid, p_usd numeric, p_tokens bigint)
RETURNS TABLE (budget_id uuid, endpoint_id uuid, event text, actor text,
               detail jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    b budgets;
    w record;
    v_usd numeric;
    v_tokens bigint;
    v_raised_usd numeric := 0;
    v_raised_tokens bigint := 0;
    resumed timestamptz;
    soft_at timestamptz;
    spent_at timestamptz;
    until timestamptz;
    events text[] := '{}';
    e text;
BEGIN
    SELECT * INTO b FROM budgets WHERE budgets.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO w FROM switchboard_budget_window(b.window_unit, b.time_zone, now());
    IF b.window_start IS DISTINCT FROM w.start_at THEN
        v_usd := p_usd;
        v_tokens := p_tokens;
    ELSE
        v_usd := b.spent_usd + p_usd;
        v_tokens := b.spent_tokens + p_tokens;
        v_raised_usd := b.raised_usd;
        v_raised_tokens := b.raised_tokens;
        resumed := b.resumed_at;
        soft_at := b.soft_reached_at;
        spent_at := b.exhausted_at;
    END IF;
    IF soft_at IS NULL
       AND ((b.limit_usd IS NOT NULL AND v_usd >= b.limit_usd * b.soft_percent / 100)
         OR (b.limit_tokens IS NOT NULL
             AND v_tokens >= b.limit_tokens * b.soft_percent / 100.0)) THEN
        soft_at := now();
        events := events || 'budget.soft_limit'::text;
    END IF;
    IF (b.limit_usd IS NOT NULL AND v_usd >= b.limit_usd + v_raised_usd)
       OR (b.limit_tokens IS NOT NULL AND v_tokens >= b.limit_tokens + v_raised_tokens) THEN
        IF spent_at IS NULL THEN
            spent_at := now();
            events := events || 'budget.exhausted'::text;
        END IF;
    ELSE
        spent_at := NULL;
    END IF;
    IF spent_at IS NOT NULL AND resumed IS NULL THEN
        until := w.end_at;
    END IF;
    IF until IS NULL AND b.in_force_until > now() THEN
        events := events || 'budget.resumed'::text;
    END IF;
    UPDATE budgets
       SET window_start = w.start_at, window_end = w.end_at, spent_usd = v_usd,
           spent_tokens = v_tokens, raised_usd = v_raised_usd,
           raised_tokens = v_raised_tokens, resumed_at = resumed,
           soft_reached_at = soft_at, exhausted_at = spent_at,
           in_force_until = until
     WHERE budgets.id = p_id;
    FOREACH e IN ARRAY events LOOP
        budget_id := b.id;
        endpoint_id := b.endpoint_id;
        event := e;
        actor := '';
        detail := jsonb_build_object(
            'scope', b.scope, 'queue', b.queue, 'group', b.group_key,
            'action', b.action, 'window_start', w.start_at,
            'window_end', w.end_at, 'spent_usd', v_usd, 'spent_tokens', v_tokens,
            'limit_usd', b.limit_usd + v_raised_usd,
            'limit_tokens', b.limit_tokens + v_raised_tokens);
        PERFORM pg_notify('switchboard_todo_event', json_build_object(
            'event', e, 'id', b.id, 'endpoint_id', b.endpoint_id,
            'queue', coalesce(b.queue, ''))::text);
        RETURN NEXT;
    END LOOP;
END
$$;

-- Count ledger rows just written (one array element each: the row's scope,
-- its figures, and its figures and time before this write, NULL for a new
-- row) against every budget they fall under. A replaced row counts its
-- difference; its earlier figure counts only if it was made in the budget's
-- current window (else that window rolled and forgot it).
CREATE OR REPLACE FUNCTION switchboard_budget_spend(
    p_endpoints uuid[], p_queues text[], p_groups text[], p_usd numeric[],
    p_tokens bigint[], p_prev_usd numeric[], p_prev_tokens bigint[],
    p_prev_at timestamptz[])
RETURNS TABLE (budget_id uuid, endpoint_id uuid, event text, actor text,
               detail jsonb)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    m record;
BEGIN
    FOR m IN
        SELECT b.id,
               sum(r.usd - CASE WHEN r.prev_at >= w.start_at
                                THEN r.prev_usd ELSE 0 END) AS usd,
               sum(r.tokens - CASE WHEN r.prev_at >= w.start_at
                                   THEN r.prev_tokens ELSE 0 END)::bigint AS tokens
          FROM unnest(p_endpoints, p_queues, p_groups, p_usd, p_tokens, p_prev_usd,
                      p_prev_tokens, p_prev_at)
               AS r (endpoint_id, queue, group_key, usd, tokens, prev_usd,
                     prev_tokens, prev_at)
          JOIN budgets b ON b.endpoint_id = r.endpoint_id
           AND (b.queue IS NULL OR b.queue = r.queue)
           AND (b.group_key IS NULL OR b.group_key = r.group_key)
         CROSS JOIN LATERAL switchboard_budget_window(
               b.window_unit, b.time_zone, now()) w
         GROUP BY b.id
         ORDER BY b.id
    LOOP
        RETURN QUERY SELECT * FROM switchboard_budget_count(m.id, m.usd, m.tokens);
    END LOOP;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0029_budget_enforcement")]

    operations = [migrations.RunSQL(sql=FUNCTIONS, reverse_sql=PREVIOUS)]
