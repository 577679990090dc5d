"""Admission control: priority, groups, group limits, fair turns, rate limits.

On ``todos``: ``priority`` (1 highest – 5, default 3), ``group_key`` (the
todo's ``group``, ≤ 200 characters; ``group`` is an SQL keyword), ``cost``
(> 0, default 1, what a rate limit counts) and ``fair_tag`` (a fair queue's
virtual start time, stamped at create). On ``queues``: ``group_concurrency``,
``fair``, ``rate_limit``, ``group_rate_limit``, ``priority_aging_seconds``.
``queue_groups`` holds a group's override (concurrency, weight, paused) and
its fair-turn finish time; ``rate_buckets`` the token buckets of the rate
limits (``group_key`` '' = the queue's own). Neither references
``endpoints``: a foreign key would stop Django's test flush from truncating
``endpoints``, and both are read only by (endpoint, queue) keys.

Exactness of a group's limit does not rest on a counter: the claim takes the
group's advisory lock (exclusive) and counts its claimed todos with a fresh
snapshot (``switchboard_admit``, a VOLATILE function: each of its statements
sees what committed before it), so two claims of one group take turns and the
second sees the first's todo. Every end of a claim (any statement that moves a
grouped todo out of ``claimed``, or deletes it) takes the same lock shared in a
BEFORE trigger and rings the queue's doorbell: a waiting claim wakes for the
freed slot, and the history rows of one group are numbered (``todo_events.id``)
in the order their transactions commit (the checker relies on it). A todo
with no group pays the trigger's WHEN clause and nothing else.

The claim index gains ``priority`` ahead of ``available_at``: a todo with the
default priority is claimed in the same order as before.
"""

from django.db import migrations, models

ADMIT_FUNCTION = r"""
CREATE FUNCTION switchboard_group_lock(p_endpoint uuid, p_queue text, p_group text)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(
        'admission/' || p_endpoint::text || '/' || p_queue || '/' || p_group, 0)
$$;

-- Whether a group has no room as the caller's snapshot sees it (paused, or as
-- many claimed as its limit): a claim's pre-filter. switchboard_admit decides.
CREATE FUNCTION switchboard_group_full(p_endpoint uuid, p_queue text, p_group text,
                                       p_queue_limit int)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN g.paused THEN TRUE
        WHEN coalesce(g.concurrency, p_queue_limit) IS NULL THEN FALSE
        ELSE (SELECT count(*) FROM (
                  SELECT 1 FROM todos t
                   WHERE t.endpoint_id = p_endpoint AND t.queue = p_queue
                     AND t.group_key = p_group AND t.state = 'claimed'
                   LIMIT coalesce(g.concurrency, p_queue_limit)) c)
             >= coalesce(g.concurrency, p_queue_limit)
    END
      FROM (SELECT 1) one
      LEFT JOIN queue_groups g
        ON g.endpoint_id = p_endpoint AND g.queue = p_queue AND g.group_key = p_group
$$;

-- Admit a claim's candidates, in the order given (the claim's order). For
-- each: its group's limit (the override, else the queue's group_concurrency;
-- paused = 0 for new claims) against the group's claimed todos counted now,
-- under the group's lock, plus those admitted earlier in this call; a lapsed
-- lease taken over (p_transfer) keeps its slot. Then the group's and the
-- queue's token buckets, each refilled to the clock read once after every
-- lock is held, must hold the todo's cost (or be full, for a cost above the
-- burst). Returns the admitted ids with what decided them (the history's
-- ``admission``).
CREATE FUNCTION switchboard_admit(p_endpoint uuid, p_ids uuid[], p_queues text[],
                                  p_groups text[], p_costs float8[],
                                  p_transfer boolean[])
RETURNS TABLE (id uuid, admission jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n int := coalesce(array_length(p_ids, 1), 0);
    i int;
    k record;
    q record;
    g record;
    lim int;
    used int;
    clock timestamptz;
    taken jsonb := '{}';
    slot text;
    qb record;
    gb record;
    rate jsonb;
    grate jsonb;
BEGIN
    -- 1. The groups' locks, exclusive, in one order: two claims never wait
    --    for each other in a cycle.
    FOR k IN SELECT DISTINCT u.queue, u.grp
               FROM unnest(p_queues, p_groups) AS u (queue, grp)
              WHERE u.grp IS NOT NULL ORDER BY 1, 2 LOOP
        PERFORM pg_advisory_xact_lock(
            switchboard_group_lock(p_endpoint, k.queue, k.grp));
    END LOOP;
    -- 2. The buckets, made on first use (full), then locked in one order.
    INSERT INTO rate_buckets (endpoint_id, queue, group_key, tokens, refilled_at)
    SELECT p_endpoint, b.queue, b.grp,
           (coalesce(b.setting->>'burst', b.setting->>'count'))::float8,
           clock_timestamp()
      FROM (SELECT DISTINCT u.queue, '' AS grp, qs.rate_limit AS setting
              FROM unnest(p_queues) AS u (queue)
              JOIN queues qs ON qs.endpoint_id = p_endpoint AND qs.name = u.queue
             WHERE qs.rate_limit IS NOT NULL
            UNION
            SELECT DISTINCT u.queue, u.grp, qs.group_rate_limit
              FROM unnest(p_queues, p_groups) AS u (queue, grp)
              JOIN queues qs ON qs.endpoint_id = p_endpoint AND qs.name = u.queue
             WHERE qs.group_rate_limit IS NOT NULL AND u.grp IS NOT NULL) b
    ON CONFLICT (endpoint_id, queue, group_key) DO NOTHING;
    PERFORM 1 FROM rate_buckets b
      WHERE b.endpoint_id = p_endpoint
        AND (b.queue, b.group_key) IN (
            SELECT u.queue, coalesce(u.grp, '') FROM unnest(p_queues, p_groups)
                AS u (queue, grp)
            UNION SELECT u.queue, '' FROM unnest(p_queues) AS u (queue))
      ORDER BY b.queue, b.group_key
        FOR UPDATE;
    -- 3. One clock for the call, read with every lock held.
    clock := clock_timestamp();
    FOR i IN 1..n LOOP
        SELECT qs.group_concurrency, qs.rate_limit, qs.group_rate_limit INTO q
          FROM queues qs WHERE qs.endpoint_id = p_endpoint AND qs.name = p_queues[i];
        lim := NULL;
        IF p_groups[i] IS NOT NULL THEN
            SELECT qg.concurrency, qg.paused INTO g FROM queue_groups qg
             WHERE qg.endpoint_id = p_endpoint AND qg.queue = p_queues[i]
               AND qg.group_key = p_groups[i];
            IF coalesce(g.paused, FALSE) THEN
                CONTINUE;
            END IF;
            lim := coalesce(g.concurrency, q.group_concurrency);
            slot := p_queues[i] || '/' || p_groups[i];
            IF lim IS NOT NULL AND NOT p_transfer[i] THEN
                SELECT count(*) INTO used FROM (
                    SELECT 1 FROM todos t
                     WHERE t.endpoint_id = p_endpoint AND t.queue = p_queues[i]
                       AND t.group_key = p_groups[i] AND t.state = 'claimed'
                     LIMIT lim + 1) c;
                used := used + coalesce((taken->>slot)::int, 0);
                IF used >= lim THEN
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        rate := NULL;
        grate := NULL;
        qb := NULL;
        gb := NULL;
        IF q.rate_limit IS NOT NULL THEN
            SELECT * INTO qb FROM switchboard_bucket_level(
                p_endpoint, p_queues[i], '', q.rate_limit, clock);
            IF NOT switchboard_bucket_holds(qb.level, qb.burst, p_costs[i]) THEN
                CONTINUE;
            END IF;
            rate := q.rate_limit;
        END IF;
        IF q.group_rate_limit IS NOT NULL AND p_groups[i] IS NOT NULL THEN
            SELECT * INTO gb FROM switchboard_bucket_level(
                p_endpoint, p_queues[i], p_groups[i], q.group_rate_limit, clock);
            IF NOT switchboard_bucket_holds(gb.level, gb.burst, p_costs[i]) THEN
                CONTINUE;
            END IF;
            grate := q.group_rate_limit;
        END IF;
        IF rate IS NOT NULL THEN
            UPDATE rate_buckets b
               SET tokens = qb.level - p_costs[i], refilled_at = clock
             WHERE b.endpoint_id = p_endpoint AND b.queue = p_queues[i]
               AND b.group_key = '';
        END IF;
        IF grate IS NOT NULL THEN
            UPDATE rate_buckets b
               SET tokens = gb.level - p_costs[i], refilled_at = clock
             WHERE b.endpoint_id = p_endpoint AND b.queue = p_queues[i]
               AND b.group_key = p_groups[i];
        END IF;
        IF p_groups[i] IS NOT NULL AND NOT p_transfer[i] THEN
            taken := jsonb_set(taken, ARRAY[slot],
                               to_jsonb(coalesce((taken->>slot)::int, 0) + 1));
        END IF;
        id := p_ids[i];
        admission := jsonb_strip_nulls(jsonb_build_object(
            'group', p_groups[i], 'limit', lim, 'cost', p_costs[i],
            'transfer', p_transfer[i], 'at', clock,
            'rate', rate, 'group_rate', grate));
        RETURN NEXT;
    END LOOP;
END
$$;

-- A bucket's level at ``p_clock``: refilled at count / per_seconds a second,
-- up to its burst (the count when no burst is set).
CREATE FUNCTION switchboard_bucket_level(p_endpoint uuid, p_queue text, p_group text,
                                         p_setting jsonb, p_clock timestamptz,
                                         OUT level float8, OUT burst float8)
LANGUAGE sql VOLATILE AS $$
    SELECT least(s.burst, b.tokens + greatest(
               extract(epoch FROM p_clock - b.refilled_at)::float8, 0)
               * s.count / s.per_seconds),
           s.burst
      FROM rate_buckets b,
           LATERAL (SELECT (p_setting->>'count')::float8 AS count,
                           (p_setting->>'per_seconds')::float8 AS per_seconds,
                           coalesce((p_setting->>'burst')::float8,
                                    (p_setting->>'count')::float8) AS burst) s
     WHERE b.endpoint_id = p_endpoint AND b.queue = p_queue AND b.group_key = p_group
$$;

-- A bucket holds a cost when its level covers it; a cost above the burst
-- waits for a full bucket (then the bucket goes into debt).
CREATE FUNCTION switchboard_bucket_holds(p_level float8, p_burst float8,
                                         p_cost float8)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_level >= least(p_cost, p_burst) - 1e-9
$$;

-- A grouped todo's claim ends (or a claimed one is deleted): take the
-- group's lock shared (a claim of the group holds it exclusive), and ring
-- the queue's doorbell so a claim waiting for the slot wakes.
CREATE FUNCTION switchboard_slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(
        switchboard_group_lock(OLD.endpoint_id, OLD.queue, OLD.group_key));
    PERFORM pg_notify('switchboard_todo_ready', json_build_object(
        'id', OLD.id, 'endpoint_id', OLD.endpoint_id, 'queue', OLD.queue)::text);
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER todos_slot_freed BEFORE UPDATE ON todos FOR EACH ROW
    WHEN (OLD.group_key IS NOT NULL AND OLD.state = 'claimed'
          AND NEW.state <> 'claimed')
    EXECUTE FUNCTION switchboard_slot_freed();

CREATE TRIGGER todos_slot_deleted BEFORE DELETE ON todos FOR EACH ROW
    WHEN (OLD.group_key IS NOT NULL AND OLD.state = 'claimed')
    EXECUTE FUNCTION switchboard_slot_freed();

-- A fair queue's virtual start time for a new todo of a group (Start-time
-- Fair Queueing): the later of the group's last finish and the queue's clock
-- (the least start time still pending), and the group's finish moves on by
-- cost / weight. Claims take the least start time first.
CREATE FUNCTION switchboard_fair_tag(p_endpoint uuid, p_queue text, p_group text,
                                     p_cost float8)
RETURNS float8 LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    queue_clock float8;
    start float8;
BEGIN
    SELECT min(head.tag) INTO queue_clock
      FROM generate_series(1, 5) AS level (p)
     CROSS JOIN LATERAL (
         SELECT t.fair_tag AS tag FROM todos t
          WHERE t.endpoint_id = p_endpoint AND t.queue = p_queue
            AND t.state = 'pending' AND t.fair_tag IS NOT NULL
            AND coalesce(t.assignee, '') = '' AND t.priority = level.p
          ORDER BY t.fair_tag LIMIT 1) head;
    INSERT INTO queue_groups AS g (endpoint_id, queue, group_key, finish)
    VALUES (p_endpoint, p_queue, coalesce(p_group, ''), coalesce(queue_clock, 0)
            + p_cost)
    ON CONFLICT (endpoint_id, queue, group_key) DO UPDATE
       SET finish = greatest(g.finish, coalesce(queue_clock, 0))
                    + p_cost / greatest(g.weight, 1)
    RETURNING g.finish - p_cost / greatest(g.weight, 1) INTO start;
    RETURN start;
END
$$;
"""

DROP_FUNCTIONS = """
DROP TRIGGER IF EXISTS todos_slot_deleted ON todos;
DROP TRIGGER IF EXISTS todos_slot_freed ON todos;
DROP FUNCTION IF EXISTS switchboard_fair_tag(uuid, text, text, float8);
DROP FUNCTION IF EXISTS switchboard_slot_freed();
DROP FUNCTION IF EXISTS switchboard_admit(uuid, uuid[], text[], text[], float8[],
                                          boolean[]);
DROP FUNCTION IF EXISTS switchboard_bucket_holds(float8, float8, float8);
DROP FUNCTION IF EXISTS switchboard_bucket_level(uuid, text, text, jsonb,
                                                 timestamptz);
DROP FUNCTION IF EXISTS switchboard_group_full(uuid, text, text, int);
DROP FUNCTION IF EXISTS switchboard_group_lock(uuid, text, text);
"""

FORWARD = [
    "ALTER TABLE todos ADD CONSTRAINT todos_priority_check"
    " CHECK (priority BETWEEN 1 AND 5)",
    "ALTER TABLE todos ADD CONSTRAINT todos_group_key_check"
    " CHECK (char_length(group_key) BETWEEN 1 AND 200)",
    "ALTER TABLE todos ADD CONSTRAINT todos_cost_check CHECK (cost > 0)",
    "ALTER TABLE queues ADD CONSTRAINT queues_group_concurrency_check"
    " CHECK (group_concurrency >= 0)",
    "ALTER TABLE queues ADD CONSTRAINT queues_priority_aging_check"
    " CHECK (priority_aging_seconds >= 1)",
    """
    CREATE TABLE queue_groups (
        endpoint_id uuid NOT NULL,
        queue text NOT NULL,
        group_key text NOT NULL,
        concurrency int CHECK (concurrency >= 0),
        weight int NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
        paused boolean NOT NULL DEFAULT FALSE,
        finish float8 NOT NULL DEFAULT 0,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (endpoint_id, queue, group_key)
    )
    """,
    """
    CREATE TABLE rate_buckets (
        endpoint_id uuid NOT NULL,
        queue text NOT NULL,
        group_key text NOT NULL,
        tokens float8 NOT NULL,
        refilled_at timestamptz NOT NULL,
        PRIMARY KEY (endpoint_id, queue, group_key)
    )
    """,
    "DROP INDEX todos_pending_claim_idx",
    """
    CREATE INDEX todos_pending_claim_idx ON todos
        (endpoint_id, queue, (coalesce(assignee, '')), priority, available_at)
        WHERE state = 'pending'
    """,
    """
    CREATE INDEX todos_fair_claim_idx ON todos
        (endpoint_id, queue, (coalesce(assignee, '')), priority, fair_tag)
        WHERE state = 'pending' AND fair_tag IS NOT NULL
    """,
    """
    CREATE INDEX todos_group_claimed_idx ON todos (endpoint_id, queue, group_key)
        WHERE state = 'claimed' AND group_key IS NOT NULL
    """,
    """
    CREATE INDEX todos_group_pending_idx ON todos
        (endpoint_id, queue, group_key, available_at)
        WHERE state = 'pending' AND group_key IS NOT NULL
    """,
    ADMIT_FUNCTION,
]

BACKWARD = [
    DROP_FUNCTIONS,
    "DROP INDEX todos_group_pending_idx",
    "DROP INDEX todos_group_claimed_idx",
    "DROP INDEX todos_fair_claim_idx",
    "DROP INDEX todos_pending_claim_idx",
    """
    CREATE INDEX todos_pending_claim_idx ON todos
        (endpoint_id, queue, (coalesce(assignee, '')), available_at)
        WHERE state = 'pending'
    """,
    "DROP TABLE rate_buckets",
    "DROP TABLE queue_groups",
    "ALTER TABLE queues DROP CONSTRAINT queues_priority_aging_check",
    "ALTER TABLE queues DROP CONSTRAINT queues_group_concurrency_check",
    "ALTER TABLE todos DROP CONSTRAINT todos_cost_check",
    "ALTER TABLE todos DROP CONSTRAINT todos_group_key_check",
    "ALTER TABLE todos DROP CONSTRAINT todos_priority_check",
]


class Migration(migrations.Migration):
    dependencies = [("todos", "0019_schedules")]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="priority",
            field=models.SmallIntegerField(db_default=3),
        ),
        migrations.AddField(
            model_name="todo",
            name="group",
            field=models.TextField(db_column="group_key", null=True, blank=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="cost",
            field=models.FloatField(db_default=1.0),
        ),
        migrations.AddField(
            model_name="todo",
            name="fair_tag",
            field=models.FloatField(null=True, blank=True),
        ),
        migrations.AddField(
            model_name="todoevent",
            name="admission",
            field=models.JSONField(null=True, blank=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="group_concurrency",
            field=models.IntegerField(null=True, blank=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="fair",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.JSONField(null=True, blank=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="group_rate_limit",
            field=models.JSONField(null=True, blank=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="priority_aging_seconds",
            field=models.IntegerField(null=True, blank=True),
        ),
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
