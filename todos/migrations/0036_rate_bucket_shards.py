"""Rate buckets in shards: a rate limit no longer makes every claim of its
queue wait for the last one's commit.

A claim under a rate limit updated the queue's one bucket row, and a row lock
is held until commit, through the WAL flush: every claim of the queue waited
for the previous one's flush instead of sharing a group commit (measured as
the largest lock wait of an every-control claim+complete at two workers).

A queue's bucket is now up to four rows (``shard``, of ``shards``), each with
its share of the rate and of the burst; a claim takes a cost from the fullest
shard that holds it and no other claim holds (SKIP LOCKED), so up to four
claims of the queue commit together. When no single shard holds the cost (a
cost above a shard's share, or the shards nearly empty, or all held), the
claim locks every shard in order, waiting, judges the summed level as the one
bucket was judged, and takes the cost from all of them evenly; a claim waits
only while it holds no other shard, so claims never wait for each other in a
cycle. A group's bucket stays one row: the group's lock already admits one
claim of the group at a time.

The bound is the one bucket's: the cost admitted in any window is at most the
burst plus the rate over the window (plus a cost's excess above the burst), as
the shards' levels never sum to more than the one bucket's would be, and a
claim reads its clock with its shards locked (the checker in
todos.store.admission_check is unchanged). Buckets made before keep one shard.
A queue with a burst below four has as many shards as its burst.

``switchboard_admit`` also reads a candidate's queue settings, group override
and claimed count in one statement (after the group's lock, as before), and
tries each group's lock as it meets the candidate, without a query for the
distinct groups first: a lock tried without waiting has no order to keep.
"""

import importlib

from django.db import migrations

BUCKETS = """
ALTER TABLE rate_buckets
    ADD COLUMN shard int NOT NULL DEFAULT 0,
    ADD COLUMN shards int NOT NULL DEFAULT 1;
ALTER TABLE rate_buckets DROP CONSTRAINT rate_buckets_pkey;
ALTER TABLE rate_buckets ADD PRIMARY KEY (endpoint_id, queue, group_key, shard);
DROP FUNCTION switchboard_bucket_level(uuid, text, text, jsonb, timestamptz);
"""

BUCKETS_BACK = """
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
DELETE FROM rate_buckets WHERE shard > 0;
ALTER TABLE rate_buckets DROP CONSTRAINT rate_buckets_pkey;
ALTER TABLE rate_buckets ADD PRIMARY KEY (endpoint_id, queue, group_key);
ALTER TABLE rate_buckets DROP COLUMN shards, DROP COLUMN shard;
"""

FUNCTIONS = r"""
-- A bucket's burst (its count when unset).
CREATE FUNCTION switchboard_rate_burst(p_setting jsonb)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((p_setting->>'burst')::float8, (p_setting->>'count')::float8)
$$;

-- A shard's level at ``p_clock``: its tokens plus its share of the rate since
-- it was refilled, at most its share of the burst (one shard of one: the
-- bucket's).
CREATE FUNCTION switchboard_shard_level(
    p_tokens float8, p_refilled_at timestamptz, p_shards int, p_setting jsonb,
    p_clock timestamptz)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT least(switchboard_rate_burst(p_setting) / p_shards,
                 p_tokens
                 + greatest(extract(epoch FROM p_clock - p_refilled_at)::float8, 0)
                 * (p_setting->>'count')::float8
                 / (p_setting->>'per_seconds')::float8 / p_shards)
$$;

-- What a claim locked of a bucket: one shard (``shard`` >= 0) or every shard
-- (-1).
CREATE TYPE switchboard_bucket_shard AS (
    endpoint_id uuid, queue text, group_key text, shard int);

-- Lock the fullest shard of a bucket that holds ``p_cost`` and that no other
-- claim holds, without waiting; else, when ``p_may_wait``, every shard in
-- order, waiting (the bucket made full on first use); else NULL: the caller
-- passes its candidate over this time.
CREATE FUNCTION switchboard_bucket_lock(
    p_endpoint uuid, p_queue text, p_group text, p_setting jsonb, p_cost float8,
    p_may_wait boolean)
RETURNS switchboard_bucket_shard
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    burst float8 := switchboard_rate_burst(p_setting);
    found_shard int;
    shards int;
BEGIN
    SELECT r.shard INTO found_shard FROM rate_buckets r
     WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue AND r.group_key = p_group
       AND switchboard_shard_level(r.tokens, r.refilled_at, r.shards, p_setting,
                                   clock_timestamp()) >= p_cost - 1e-9
     ORDER BY switchboard_shard_level(r.tokens, r.refilled_at, r.shards, p_setting,
                                      clock_timestamp()) DESC
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN ROW(p_endpoint, p_queue, p_group, found_shard);
    END IF;
    IF NOT p_may_wait THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM rate_buckets r
      WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue AND r.group_key = p_group
      ORDER BY r.shard
        FOR UPDATE;
    IF NOT FOUND THEN
        shards := CASE WHEN p_group = '' THEN greatest(1, least(4, floor(burst)))::int
                       ELSE 1 END;
        INSERT INTO rate_buckets (endpoint_id, queue, group_key, shard, shards, tokens,
                                  refilled_at)
        SELECT p_endpoint, p_queue, p_group, s, shards, burst / shards,
               clock_timestamp()
          FROM generate_series(0, shards - 1) AS s
        ON CONFLICT (endpoint_id, queue, group_key, shard) DO NOTHING;
        PERFORM 1 FROM rate_buckets r
          WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue
            AND r.group_key = p_group
          ORDER BY r.shard
            FOR UPDATE;
    END IF;
    RETURN ROW(p_endpoint, p_queue, p_group, -1);
END
$$;

-- The level of what a claim locked at ``p_clock``: its shard's, or the sum of
-- every shard's.
CREATE FUNCTION switchboard_bucket_level(
    p_bucket switchboard_bucket_shard, p_setting jsonb, p_clock timestamptz)
RETURNS float8 LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT sum(switchboard_shard_level(r.tokens, r.refilled_at, r.shards,
                                               p_setting, p_clock))
      FROM rate_buckets r
     WHERE r.endpoint_id = p_bucket.endpoint_id AND r.queue = p_bucket.queue
       AND r.group_key = p_bucket.group_key
       AND (p_bucket.shard < 0 OR r.shard = p_bucket.shard));
END
$$;

-- Take ``p_cost`` at ``p_clock`` from what a claim locked: from its shard, or
-- evenly from every shard.
CREATE FUNCTION switchboard_bucket_take(
    p_bucket switchboard_bucket_shard, p_setting jsonb, p_clock timestamptz,
    p_cost float8)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE rate_buckets r
       SET tokens = switchboard_shard_level(r.tokens, r.refilled_at, r.shards,
                                            p_setting, p_clock)
                    - CASE WHEN p_bucket.shard < 0 THEN p_cost / r.shards
                           ELSE p_cost END,
           refilled_at = p_clock
     WHERE r.endpoint_id = p_bucket.endpoint_id AND r.queue = p_bucket.queue
       AND r.group_key = p_bucket.group_key
       AND (p_bucket.shard < 0 OR r.shard = p_bucket.shard);
END
$$;
"""

FUNCTIONS_BACK = """
DROP FUNCTION switchboard_bucket_take(switchboard_bucket_shard, jsonb, timestamptz,
                                      float8);
DROP FUNCTION switchboard_bucket_level(switchboard_bucket_shard, jsonb, timestamptz);
DROP FUNCTION switchboard_bucket_lock(uuid, text, text, jsonb, float8, boolean);
DROP TYPE switchboard_bucket_shard;
DROP FUNCTION switchboard_shard_level(float8, timestamptz, int, jsonb, timestamptz);
DROP FUNCTION switchboard_rate_burst(jsonb);
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
    q record;
    lim int;
    used int;
    clock timestamptz;
    taken jsonb := '{}';
    slot text;
    qb switchboard_bucket_shard;
    gb switchboard_bucket_shard;
    -- Whether this call holds a shard of a queue's bucket: then it never
    -- waits for another (a claim that waits holds none); and the queues whose
    -- every shard it holds.
    holding boolean := FALSE;
    every_shard text[] := '{}';
    rate jsonb;
    grate jsonb;
BEGIN
    -- 1. One clock for the call; a candidate under a rate limit reads its own
    --    once its buckets are locked.
    clock := clock_timestamp();
    FOR i IN 1..n LOOP
        lim := NULL;
        -- 2. The group's lock, exclusive, without waiting: a group whose lock
        --    another claim or an ending claim holds is passed over this time
        --    (as SKIP LOCKED passes over a row). A claim then never waits for
        --    an end, so a claim and a batch of ends (the reaper's) never wait
        --    for each other in a cycle; the end rings when it commits.
        IF p_groups[i] IS NOT NULL AND NOT pg_try_advisory_xact_lock(
                switchboard_group_lock(p_endpoint, p_queues[i], p_groups[i])) THEN
            CONTINUE;
        END IF;
        -- 3. The queue's settings, the group's override, and (under the
        --    group's lock, in a snapshot taken after it) its claimed todos.
        SELECT qs.group_concurrency, qs.rate_limit, qs.group_rate_limit,
               qg.concurrency AS override, coalesce(qg.paused, FALSE) AS paused,
               CASE WHEN p_groups[i] IS NOT NULL AND NOT p_transfer[i]
                         AND coalesce(qg.concurrency, qs.group_concurrency) IS NOT NULL
                    THEN (SELECT count(*) FROM (
                              SELECT 1 FROM todos t
                               WHERE t.endpoint_id = p_endpoint
                                 AND t.queue = p_queues[i]
                                 AND t.group_key = p_groups[i]
                                 AND t.state = 'claimed'
                               LIMIT coalesce(qg.concurrency, qs.group_concurrency)
                                     + 1) c)
               END AS used
          INTO q
          FROM (SELECT 1) one
          LEFT JOIN queues qs
            ON qs.endpoint_id = p_endpoint AND qs.name = p_queues[i]
          LEFT JOIN queue_groups qg
            ON qg.endpoint_id = p_endpoint AND qg.queue = p_queues[i]
           AND qg.group_key = p_groups[i];
        IF p_groups[i] IS NOT NULL THEN
            IF q.paused THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'paused', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
                CONTINUE;
            END IF;
            lim := coalesce(q.override, q.group_concurrency);
            slot := p_queues[i] || '/' || p_groups[i];
            IF lim IS NOT NULL AND NOT p_transfer[i] THEN
                used := q.used + coalesce((taken->>slot)::int, 0);
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
        qb := NULL;
        gb := NULL;
        IF q.rate_limit IS NOT NULL AND p_queues[i] = ANY(every_shard) THEN
            qb := ROW(p_endpoint, p_queues[i], '', -1);
        ELSIF q.rate_limit IS NOT NULL THEN
            qb := switchboard_bucket_lock(p_endpoint, p_queues[i], '', q.rate_limit,
                                          p_costs[i], NOT holding);
            IF qb.shard IS NULL THEN
                CONTINUE;
            END IF;
            holding := TRUE;
            IF qb.shard < 0 THEN
                every_shard := every_shard || p_queues[i];
            END IF;
        END IF;
        IF q.group_rate_limit IS NOT NULL AND p_groups[i] IS NOT NULL THEN
            gb := switchboard_bucket_lock(p_endpoint, p_queues[i], p_groups[i],
                                          q.group_rate_limit, p_costs[i], TRUE);
            IF gb.shard IS NULL THEN
                CONTINUE;
            END IF;
        END IF;
        IF qb.shard IS NOT NULL OR gb.shard IS NOT NULL THEN
            clock := clock_timestamp();
        END IF;
        IF qb.shard < 0 AND NOT switchboard_bucket_holds(
                switchboard_bucket_level(qb, q.rate_limit, clock),
                switchboard_rate_burst(q.rate_limit), p_costs[i]) THEN
            id := NULL;
            admission := jsonb_build_object(
                'passed', 'rate_limit', 'queue', p_queues[i], 'endpoint', p_endpoint);
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF gb.shard < 0 AND NOT switchboard_bucket_holds(
                switchboard_bucket_level(gb, q.group_rate_limit, clock),
                switchboard_rate_burst(q.group_rate_limit), p_costs[i]) THEN
            id := NULL;
            admission := jsonb_build_object(
                'passed', 'group_rate_limit', 'queue', p_queues[i],
                'endpoint', p_endpoint);
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF qb.shard IS NOT NULL THEN
            rate := q.rate_limit;
            PERFORM switchboard_bucket_take(qb, q.rate_limit, clock, p_costs[i]);
        END IF;
        IF gb.shard IS NOT NULL THEN
            grate := q.group_rate_limit;
            PERFORM switchboard_bucket_take(gb, q.group_rate_limit, clock, p_costs[i]);
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

_0020 = importlib.import_module("todos.migrations.0020_admission")
_0034 = importlib.import_module("todos.migrations.0034_admission_cheaper")


class Migration(migrations.Migration):
    dependencies = [("todos", "0035_budget_spend_one_update")]

    operations = [
        migrations.RunSQL(sql=BUCKETS, reverse_sql=BUCKETS_BACK),
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=FUNCTIONS_BACK),
        migrations.RunSQL(sql=ADMIT, reverse_sql=_0034.ADMIT),
    ]
