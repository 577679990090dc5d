"""Admission's claim, cheaper where it was measured to cost.

- ``blocked`` and ``opened`` (lifecycle.CLAIM_SQL) read a queue's groups that
  are paused, held at 0 or opened by an override: two partial indexes of
  ``queue_groups`` hold only those rows, so a claim of a fair queue no longer
  reads every group row of its endpoint.
- ``switchboard_admit`` reads a bucket's level itself, with a plan it keeps,
  instead of through the SQL function ``switchboard_bucket_level``, which
  PostgreSQL parses and plans on every call. It locks the buckets there are
  in one order, as before, and makes a bucket (full) only when a candidate
  first needs it, instead of trying to insert every bucket on every claim. A
  bucket it finds locked by another claim (one made or limited a moment
  ago, not locked in order) passes its candidate over this time, as a busy
  group's lock does: it never waits out of order.
"""

import importlib

from django.db import migrations

INDEXES = """
CREATE INDEX queue_groups_held_idx ON queue_groups (endpoint_id, queue)
    WHERE paused OR concurrency = 0;
CREATE INDEX queue_groups_opened_idx ON queue_groups (endpoint_id, queue)
    WHERE concurrency > 0;
"""

ADMIT = r"""
CREATE OR REPLACE FUNCTION switchboard_admit(
    p_endpoint uuid, p_ids uuid[], p_queues text[], p_groups text[],
    p_costs float8[], p_transfer boolean[])
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
    bucket record;
    qlevel float8;
    qburst float8;
    glevel float8;
    gburst float8;
    rate jsonb;
    grate jsonb;
    busy text[] := '{}';
BEGIN
    -- 1. The groups' locks, exclusive, without waiting: a group whose lock
    --    another claim or an ending claim holds is passed over this time (as
    --    SKIP LOCKED passes over a row). A claim then never waits for an end,
    --    so a claim and a batch of ends (the reaper's) never wait for each
    --    other in a cycle; the end rings when it commits.
    FOR k IN SELECT DISTINCT u.queue, u.grp
               FROM unnest(p_queues, p_groups) AS u (queue, grp)
              WHERE u.grp IS NOT NULL ORDER BY 1, 2 LOOP
        IF NOT pg_try_advisory_xact_lock(
                switchboard_group_lock(p_endpoint, k.queue, k.grp)) THEN
            busy := busy || (k.queue || '/' || k.grp);
        END IF;
    END LOOP;
    -- 2. The buckets there are, locked in one order (a bucket is made when
    --    first needed, below).
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
        IF p_groups[i] IS NOT NULL
           AND (p_queues[i] || '/' || p_groups[i]) = ANY(busy) THEN
            CONTINUE;
        END IF;
        IF p_groups[i] IS NOT NULL THEN
            SELECT qg.concurrency, qg.paused INTO g FROM queue_groups qg
             WHERE qg.endpoint_id = p_endpoint AND qg.queue = p_queues[i]
               AND qg.group_key = p_groups[i];
            IF coalesce(g.paused, FALSE) THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'paused', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
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
                    id := NULL;
                    admission := jsonb_build_object(
                        'passed', 'limit', 'queue', p_queues[i],
                        'endpoint', p_endpoint);
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        rate := NULL;
        grate := NULL;
        IF q.rate_limit IS NOT NULL THEN
            SELECT b.tokens, b.refilled_at INTO bucket FROM rate_buckets b
             WHERE b.endpoint_id = p_endpoint AND b.queue = p_queues[i]
               AND b.group_key = ''
               FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Made full on first use; if another claim makes it first,
                -- this candidate waits for the next claim.
                INSERT INTO rate_buckets AS b (endpoint_id, queue, group_key, tokens,
                                               refilled_at)
                VALUES (p_endpoint, p_queues[i], '',
                        coalesce((q.rate_limit->>'burst')::float8,
                                 (q.rate_limit->>'count')::float8), clock)
                ON CONFLICT (endpoint_id, queue, group_key) DO NOTHING
                RETURNING b.tokens, b.refilled_at INTO bucket;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
            END IF;
            qburst := coalesce((q.rate_limit->>'burst')::float8,
                               (q.rate_limit->>'count')::float8);
            qlevel := least(qburst, bucket.tokens + greatest(
                extract(epoch FROM clock - bucket.refilled_at)::float8, 0)
                * (q.rate_limit->>'count')::float8
                / (q.rate_limit->>'per_seconds')::float8);
            IF NOT switchboard_bucket_holds(qlevel, qburst, p_costs[i]) THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'rate_limit', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
                CONTINUE;
            END IF;
            rate := q.rate_limit;
        END IF;
        IF q.group_rate_limit IS NOT NULL AND p_groups[i] IS NOT NULL THEN
            SELECT b.tokens, b.refilled_at INTO bucket FROM rate_buckets b
             WHERE b.endpoint_id = p_endpoint AND b.queue = p_queues[i]
               AND b.group_key = p_groups[i]
               FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Made full on first use; if another claim makes it first,
                -- this candidate waits for the next claim.
                INSERT INTO rate_buckets AS b (endpoint_id, queue, group_key, tokens,
                                               refilled_at)
                VALUES (p_endpoint, p_queues[i], p_groups[i],
                        coalesce((q.group_rate_limit->>'burst')::float8,
                                 (q.group_rate_limit->>'count')::float8), clock)
                ON CONFLICT (endpoint_id, queue, group_key) DO NOTHING
                RETURNING b.tokens, b.refilled_at INTO bucket;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
            END IF;
            gburst := coalesce((q.group_rate_limit->>'burst')::float8,
                               (q.group_rate_limit->>'count')::float8);
            glevel := least(gburst, bucket.tokens + greatest(
                extract(epoch FROM clock - bucket.refilled_at)::float8, 0)
                * (q.group_rate_limit->>'count')::float8
                / (q.group_rate_limit->>'per_seconds')::float8);
            IF NOT switchboard_bucket_holds(glevel, gburst, p_costs[i]) THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'group_rate_limit', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
                CONTINUE;
            END IF;
            grate := q.group_rate_limit;
        END IF;
        IF rate IS NOT NULL THEN
            UPDATE rate_buckets b
               SET tokens = qlevel - p_costs[i], refilled_at = clock
             WHERE b.endpoint_id = p_endpoint AND b.queue = p_queues[i]
               AND b.group_key = '';
        END IF;
        IF grate IS NOT NULL THEN
            UPDATE rate_buckets b
               SET tokens = glevel - p_costs[i], refilled_at = clock
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
"""

# The definition this one replaces (0028's), restored on the way back.
BEFORE = importlib.import_module("todos.migrations.0028_admission_passes").ADMIT


class Migration(migrations.Migration):
    dependencies = [("todos", "0033_reservations_read_live")]

    operations = [
        migrations.RunSQL(
            sql=INDEXES,
            reverse_sql="DROP INDEX queue_groups_opened_idx;"
            " DROP INDEX queue_groups_held_idx;",
        ),
        migrations.RunSQL(sql=ADMIT, reverse_sql=BEFORE),
    ]
