"""Budget enforcement (CONTRACT §18): a budget keeps its current window's
running figures, and the statement that writes a ledger row counts it.

- ``budgets`` gains the window (``window_start``, ``window_end``), what was
  spent in it, when the soft threshold and the limit were reached, the owner's
  decisions for the window (raised by, resumed) and ``in_force_until``: the
  action (pause, reject_new) holds until the window's end. A claim or a
  create reads only that, through a partial index that holds only budgets in
  force: a scope with no budget at its limit costs one probe of a tiny index.
- ``usage_ledger`` keeps a row's figures before its last replacement
  (``prev_*``), so a replacement counts its difference and nothing twice.
- ``budget_events``: what happened to a budget and each owner decision.
- ``switchboard_budget_window``: the window holding an instant, in the
  budget's zone (``budgets.window_bounds`` is its Python twin; a test holds
  them equal). ``switchboard_budget_count`` counts a spend against one budget
  under its row lock; ``switchboard_budget_spend`` finds the budgets a batch
  of ledger rows falls under and counts each, in id order (no deadlock
  between two reports that share budgets).
"""

import django.db.models.functions.datetime
from django.db import migrations, models

FUNCTIONS = r"""
CREATE FUNCTION switchboard_budget_window(
    p_unit text, p_zone text, p_at timestamptz,
    OUT start_at timestamptz, OUT end_at timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT s.at,
           CASE p_unit WHEN 'hour' THEN s.at + interval '1 hour'
                ELSE ((s.at AT TIME ZONE p_zone)
                      + CASE p_unit WHEN 'day' THEN interval '1 day'
                                    ELSE interval '1 month' END) AT TIME ZONE p_zone
           END
      FROM (SELECT date_trunc(p_unit, p_at, p_zone) AS at) s
$$;

-- Count a spend (what a report adds, maybe 0 or less) against one budget,
-- under its row lock, and settle what follows:
-- - a budget whose window is not the current one rolls over: its figures,
--   marks and the owner's decisions start over in the new window;
-- - the report that reaches the soft threshold (soft_percent of the limit)
--   marks soft_reached_at; the one that reaches the limit (plus what the owner
--   raised) marks exhausted_at, and the action holds (in_force_until = the
--   window's end) unless the owner resumed this window;
-- - an action lifted in its window (a raise, a resume, a higher limit) is
--   budget.resumed.
-- Returns the events (the caller inserts them into budget_events, so this
-- runs inside a data-modifying statement) and tells each on the event
-- channel at commit.
CREATE FUNCTION switchboard_budget_count(p_id uuid, p_usd numeric, p_tokens bigint)
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
CREATE FUNCTION switchboard_budget_spend(
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

DROP_FUNCTIONS = """
DROP FUNCTION switchboard_budget_spend(uuid[], text[], text[], numeric[], bigint[],
                                       numeric[], bigint[], timestamptz[]);
DROP FUNCTION switchboard_budget_count(uuid, numeric, bigint);
DROP FUNCTION switchboard_budget_window(text, text, timestamptz);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0028_admission_passes'),
    ]

    operations = [
        migrations.CreateModel(
            name='BudgetEvent',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('budget_id', models.UUIDField()),
                ('endpoint_id', models.UUIDField()),
                ('event', models.TextField()),
                ('actor', models.TextField(blank=True, db_default='')),
                ('detail', models.JSONField(blank=True, null=True)),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'budget_events',
            },
        ),
        migrations.AddField(
            model_name='budget',
            name='exhausted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budget',
            name='in_force_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budget',
            name='raised_tokens',
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='budget',
            name='raised_usd',
            field=models.DecimalField(db_default=0, decimal_places=6, max_digits=20),
        ),
        migrations.AddField(
            model_name='budget',
            name='resumed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budget',
            name='soft_reached_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budget',
            name='spent_tokens',
            field=models.BigIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='budget',
            name='spent_usd',
            field=models.DecimalField(db_default=0, decimal_places=6, max_digits=20),
        ),
        migrations.AddField(
            model_name='budget',
            name='window_end',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budget',
            name='window_start',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='usagereport',
            name='prev_cost_usd',
            field=models.DecimalField(blank=True, decimal_places=6, max_digits=20, null=True),
        ),
        migrations.AddField(
            model_name='usagereport',
            name='prev_reported_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='usagereport',
            name='prev_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='budget',
            index=models.Index(condition=models.Q(('in_force_until__isnull', False)), fields=['endpoint_id'], name='budgets_in_force_idx'),
        ),
        migrations.AddIndex(
            model_name='budgetevent',
            index=models.Index(fields=['budget_id', 'id'], name='budget_events_budget_idx'),
        ),
        migrations.AddIndex(
            model_name='budgetevent',
            index=models.Index(fields=['endpoint_id', 'id'], name='budget_events_endpoint_idx'),
        ),
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
