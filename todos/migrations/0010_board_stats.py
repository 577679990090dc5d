"""The Board's statistics: error fingerprints of dead letters, per-minute rollups.

- ``switchboard_error_fingerprint(text)``: an error message with what varies
  between occurrences of one cause (quoted values, UUIDs, hex, numbers, words
  with digits such as ids) replaced by placeholders. ``todos.error_fingerprint``
  is a stored generated column over ``last_error``: PostgreSQL computes it in
  the very statement that fails or dead-letters a todo, whichever path that is
  (agent fail, release at the cap, the reaper), with no change to those
  statements.
- ``todos_dead_letter_group_idx``: dead letters by endpoint, queue and
  fingerprint, so the groups page is an index-only scan of dead letters alone.
- ``todo_events_at_brin``: the history by time, for the sweep loop's rollup of
  the open minutes; a BRIN index costs an append-only table next to nothing.
- ``todo_minutes``, ``todo_transition_totals``, ``todo_rollup_state``: the
  rollup the charts and ``/metrics`` read (see ``todos.store.roll_up_minutes``).
"""

from django.db import migrations, models

FINGERPRINT_FUNCTION = r"""
CREATE FUNCTION switchboard_error_fingerprint(error text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fp$
SELECT NULLIF(left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(left(error, 2000),
        $$'[^']*'|"[^"]*"|`[^`]*`$$, '<str>', 'g'),
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
        '\m0x[0-9a-f]+\M', '<hex>', 'gi'),
        '\m[0-9]+([.,][0-9]+)*[a-z]*\M', '<n>', 'gi'),
        '\m\w*[0-9]\w*\M', '<id>', 'g'),
        '\s+', ' ', 'g')), 300), '')
$fp$
"""

FORWARD = [
    FINGERPRINT_FUNCTION,
    """
    ALTER TABLE todos ADD COLUMN error_fingerprint text GENERATED ALWAYS AS (
        CASE WHEN last_error <> '' THEN switchboard_error_fingerprint(last_error) END
    ) STORED
    """,
    """
    CREATE INDEX todos_dead_letter_group_idx
        ON todos (endpoint_id, queue, error_fingerprint, updated_at)
        WHERE state = 'failed' AND next_retry_at IS NULL
    """,
    "CREATE INDEX todo_events_at_brin ON todo_events USING brin (at)",
    "INSERT INTO todo_rollup_state (id, folded_through) VALUES (1, NULL)",
]

BACKWARD = [
    "DELETE FROM todo_rollup_state",
    "DROP INDEX todo_events_at_brin",
    "DROP INDEX todos_dead_letter_group_idx",
    "ALTER TABLE todos DROP COLUMN error_fingerprint",
    "DROP FUNCTION switchboard_error_fingerprint(text)",
]


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0009_sqs_credentials_encrypted_secrets'),
    ]

    operations = [
        migrations.CreateModel(
            name='RollupState',
            fields=[
                ('id', models.SmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('folded_through', models.DateTimeField(null=True)),
            ],
            options={
                'db_table': 'todo_rollup_state',
            },
        ),
        migrations.CreateModel(
            name='TransitionTotal',
            fields=[
                ('pk', models.CompositePrimaryKey('endpoint_id', 'queue', blank=True, editable=False, primary_key=True, serialize=False)),
                ('endpoint_id', models.UUIDField()),
                ('queue', models.TextField()),
                ('created', models.BigIntegerField(db_default=0)),
                ('claimed', models.BigIntegerField(db_default=0)),
                ('completed', models.BigIntegerField(db_default=0)),
                ('failed', models.BigIntegerField(db_default=0)),
                ('dead_lettered', models.BigIntegerField(db_default=0)),
                ('retried', models.BigIntegerField(db_default=0)),
            ],
            options={
                'db_table': 'todo_transition_totals',
            },
        ),
        migrations.CreateModel(
            name='TodoMinute',
            fields=[
                ('pk', models.CompositePrimaryKey('endpoint_id', 'queue', 'minute', blank=True, editable=False, primary_key=True, serialize=False)),
                ('endpoint_id', models.UUIDField()),
                ('queue', models.TextField()),
                ('minute', models.DateTimeField()),
                ('created', models.IntegerField(db_default=0)),
                ('claimed', models.IntegerField(db_default=0)),
                ('completed', models.IntegerField(db_default=0)),
                ('failed', models.IntegerField(db_default=0)),
                ('dead_lettered', models.IntegerField(db_default=0)),
                ('retried', models.IntegerField(db_default=0)),
                ('pending', models.IntegerField(null=True)),
            ],
            options={
                'db_table': 'todo_minutes',
                'indexes': [models.Index(fields=['minute'], name='todo_minutes_minute_idx')],
            },
        ),
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
