"""Rate shards: a claim never waits for one while it holds another; and a
claim under a queue's rate limit locks a shard and takes its cost in one
statement.

**No deadlock.** ``switchboard_bucket_lock`` chose the fullest shard that
held a candidate's cost with ``FOR UPDATE SKIP LOCKED`` and the level among
the query's conditions, and a claim that got none (holding no shard, as it
believed) waited for every shard in order. But PostgreSQL locks a row that a
concurrent claim changed in its newer version and checks the conditions
again; a row that fails them is not returned and stays locked. Such a claim
held a shard it did not know of while it waited for every shard; another
claim holding one of those could wait for it: a deadlock (two in a
100,000-operation run of bench/admission_run.py once the one-step take below
made the race more frequent). Now a shard is chosen by its key alone (the row
locked is the row returned) and its level judged after the lock. A claim
holding a shard that lacks the cost locks the other shards only without
waiting: all of them, judged by their summed level as before, or not all
(the candidate is passed over this time, and the function says that it holds
shards: the bucket named, no shard). ``switchboard_admit`` counts that as
holding, so a later candidate of the call waits for no shard either (a batch
claim did: eight deadlocks in the next run). A cost above one shard's share
still goes to every shard, waiting, when the claim holds none.

**Cheaper.** ``switchboard_admit`` locked a shard (``switchboard_bucket_lock``:
a query in a function of its own), then took the cost from it
(``switchboard_bucket_take``: another), then, for a group bucket it had not
locked, still read that bucket's level (``NULL < 0`` does not skip the second
operand of an AND as FALSE does). Measured per call with
``pg_stat_statements.track = all`` (2,000 calls, one candidate under a queue
rate limit and a group limit): 121 µs in all, of which the lock 12, the take
21 and the needless level read 10; now about 100–108 µs. When the candidate
has no group bucket to judge after the queue's and its cost fits one shard's
share, one statement locks the fullest free shard and, when it holds the
cost, takes it, reading the level and the clock after the lock as before (the
clock twice, microseconds apart: what is taken is the level at the earlier
read, the refill restarts at the later one, so the bucket never holds more
than it did). A group bucket's level is read only when it was locked. A call
of one candidate no longer keeps the per-group count of what it admitted.

What is admitted is judged by the checker (todos.store.admission_check) in
bench/admission_run.py: 0 violations, and 0 deadlocks, over 100,000
operations.
"""

import importlib

from django.db import migrations

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
    -- When a queue bucket's shard was locked and its cost taken in one step.
    taken_at timestamptz;
    locked_shard int;
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
        taken_at := NULL;
        locked_shard := NULL;
        IF q.rate_limit IS NOT NULL AND p_queues[i] = ANY(every_shard) THEN
            qb := ROW(p_endpoint, p_queues[i], '', -1);
        ELSIF q.rate_limit IS NOT NULL THEN
            IF (q.group_rate_limit IS NULL OR p_groups[i] IS NULL)
               AND p_costs[i] <= switchboard_rate_burst(q.rate_limit) / 4 THEN
                -- 4a. No group bucket to judge after it, and a cost one
                --     shard's share holds: lock the fullest shard no other
                --     claim holds and, if it holds the cost, take it, in one
                --     statement (as switchboard_bucket_lock then
                --     switchboard_bucket_take do: the level read after the
                --     lock, the clock read after it). The shard is chosen by
                --     its key alone, so the row locked is the row returned
                --     (switchboard_bucket_lock says why).
                WITH locked AS (
                    SELECT s.shard,
                           switchboard_shard_level(s.tokens, s.refilled_at, s.shards,
                                                   q.rate_limit, clock_timestamp())
                               AS level
                      FROM rate_buckets s
                     WHERE s.endpoint_id = p_endpoint AND s.queue = p_queues[i]
                       AND s.group_key = ''
                     ORDER BY switchboard_shard_level(s.tokens, s.refilled_at, s.shards,
                                                      q.rate_limit, clock_timestamp())
                              DESC
                     LIMIT 1
                       FOR UPDATE SKIP LOCKED
                ), took AS (
                    UPDATE rate_buckets r
                       SET tokens = switchboard_shard_level(
                                        r.tokens, r.refilled_at, r.shards, q.rate_limit,
                                        clock_timestamp()) - p_costs[i],
                           refilled_at = clock_timestamp()
                      FROM locked l
                     WHERE r.endpoint_id = p_endpoint AND r.queue = p_queues[i]
                       AND r.group_key = '' AND r.shard = l.shard
                       AND l.level >= p_costs[i] - 1e-9
                 RETURNING r.refilled_at
                )
                SELECT l.shard, (SELECT t.refilled_at FROM took t)
                  INTO locked_shard, taken_at
                  FROM locked l;
            END IF;
            IF taken_at IS NULL THEN
                -- 4b. Else, or when that took nothing: as
                --     switchboard_bucket_lock decides. Holding the shard it
                --     locked (if any), it may not wait; a bucket named is a
                --     bucket some of whose shards it holds.
                qb := switchboard_bucket_lock(
                    p_endpoint, p_queues[i], '', q.rate_limit, p_costs[i],
                    NOT holding AND locked_shard IS NULL);
                IF locked_shard IS NOT NULL OR qb.endpoint_id IS NOT NULL THEN
                    holding := TRUE;
                END IF;
                IF qb.shard IS NULL THEN
                    CONTINUE;
                END IF;
                IF qb.shard < 0 THEN
                    every_shard := every_shard || p_queues[i];
                END IF;
            END IF;
            holding := TRUE;
        END IF;
        IF q.group_rate_limit IS NOT NULL AND p_groups[i] IS NOT NULL THEN
            gb := switchboard_bucket_lock(p_endpoint, p_queues[i], p_groups[i],
                                          q.group_rate_limit, p_costs[i], TRUE);
            IF gb.shard IS NULL THEN
                CONTINUE;
            END IF;
        END IF;
        IF taken_at IS NOT NULL THEN
            clock := taken_at;
            rate := q.rate_limit;
        ELSIF qb.shard IS NOT NULL OR gb.shard IS NOT NULL THEN
            clock := clock_timestamp();
        END IF;
        -- (Nested, so a bucket not locked is not read: NULL < 0 would not
        -- skip the read as FALSE does.)
        IF qb.shard < 0 THEN
            IF NOT switchboard_bucket_holds(
                    switchboard_bucket_level(qb, q.rate_limit, clock),
                    switchboard_rate_burst(q.rate_limit), p_costs[i]) THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'rate_limit', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        IF gb.shard < 0 THEN
            IF NOT switchboard_bucket_holds(
                    switchboard_bucket_level(gb, q.group_rate_limit, clock),
                    switchboard_rate_burst(q.group_rate_limit), p_costs[i]) THEN
                id := NULL;
                admission := jsonb_build_object(
                    'passed', 'group_rate_limit', 'queue', p_queues[i],
                    'endpoint', p_endpoint);
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        IF qb.shard IS NOT NULL THEN
            rate := q.rate_limit;
            PERFORM switchboard_bucket_take(qb, q.rate_limit, clock, p_costs[i]);
        END IF;
        IF gb.shard IS NOT NULL THEN
            grate := q.group_rate_limit;
            PERFORM switchboard_bucket_take(gb, q.group_rate_limit, clock, p_costs[i]);
        END IF;
        IF n > 1 AND p_groups[i] IS NOT NULL AND NOT p_transfer[i] THEN
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

LOCK = r"""
-- Lock a shard of a bucket for a cost, as switchboard_admit asks:
-- - the fullest shard that no other claim holds (SKIP LOCKED), when it holds
--   the cost;
-- - else, holding that shard, every other one that no other claim holds:
--   all of them (-1: judged by their summed level), or none (shard NULL,
--   the bucket named: the caller passes its candidate over this time, and
--   holds shards);
-- - when it could lock none (others hold them all, or there is no bucket
--   yet), or the cost is above one shard's share: every shard in order,
--   waiting (the bucket made full on first use), when ``p_may_wait``; else
--   NULL (it locked nothing).
-- A locking query here selects its rows by key alone. A row a concurrent
-- claim changed is locked in its newest version and then checked again
-- against the query's conditions; one that fails the check is not returned
-- but stays locked. With a level among the conditions (as until now), a
-- claim could hold a shard it did not know of and then wait for every
-- shard, while another claim held one of those and waited for it (a
-- deadlock; seen in bench/admission_run.py). Only a claim that holds no
-- shard of any queue's bucket waits.
CREATE OR REPLACE FUNCTION switchboard_bucket_lock(
    p_endpoint uuid, p_queue text, p_group text, p_setting jsonb, p_cost float8,
    p_may_wait boolean)
RETURNS switchboard_bucket_shard
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    burst float8 := switchboard_rate_burst(p_setting);
    found_shard int;
    found_level float8;
    shards int;
    locked int;
    one_shard boolean := TRUE;
BEGIN
    IF p_cost > burst / 4 + 1e-9 THEN
        SELECT r.shards INTO shards FROM rate_buckets r
         WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue
           AND r.group_key = p_group
         LIMIT 1;
        one_shard := NOT FOUND OR p_cost <= burst / shards + 1e-9;
    END IF;
    IF one_shard THEN
        SELECT r.shard, r.shards,
               switchboard_shard_level(r.tokens, r.refilled_at, r.shards, p_setting,
                                       clock_timestamp())
          INTO found_shard, shards, found_level
          FROM rate_buckets r
         WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue
           AND r.group_key = p_group
         ORDER BY switchboard_shard_level(r.tokens, r.refilled_at, r.shards,
                                          p_setting, clock_timestamp()) DESC
         LIMIT 1
           FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            IF found_level >= p_cost - 1e-9 THEN
                RETURN ROW(p_endpoint, p_queue, p_group, found_shard);
            END IF;
            SELECT count(*) INTO locked FROM (
                SELECT 1 FROM rate_buckets r
                 WHERE r.endpoint_id = p_endpoint AND r.queue = p_queue
                   AND r.group_key = p_group
                   FOR UPDATE SKIP LOCKED) l;
            IF locked = shards THEN
                RETURN ROW(p_endpoint, p_queue, p_group, -1);
            END IF;
            -- Holding shards it cannot use: no shard, but the bucket named,
            -- so that the caller knows it holds some (and waits no more).
            RETURN ROW(p_endpoint, p_queue, p_group, NULL::int);
        END IF;
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
"""


_0036 = importlib.import_module("todos.migrations.0036_rate_bucket_shards")


def _replacing(sql: str, name: str) -> str:
    """Function ``name``'s CREATE FUNCTION in ``sql``, as CREATE OR REPLACE."""
    start = sql.index(f"CREATE FUNCTION {name}(")
    end = sql.index("$$;", start) + len("$$;")
    return "CREATE OR REPLACE" + sql[start + len("CREATE") : end]


# Back: the function as 0036 made it.
LOCK_BACK = _replacing(_0036.FUNCTIONS, "switchboard_bucket_lock")


class Migration(migrations.Migration):
    dependencies = [("todos", "0041_error_fingerprint_plpgsql")]

    operations = [
        migrations.RunSQL(sql=LOCK, reverse_sql=LOCK_BACK),
        migrations.RunSQL(sql=ADMIT, reverse_sql=_0036.ADMIT),
    ]
