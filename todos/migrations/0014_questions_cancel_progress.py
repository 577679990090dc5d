"""Questions, cancel, progress and checkpoints (CONTRACT §14).

No new state: the ``state`` CHECK stays pending|claimed|done|failed. What a
todo gains is data beside its state:

- a question (``question``, ``asked_at``, ``answer_deadline``,
  ``question_status`` open|answered|expired), its ``answer``, and the nonce
  that makes an answer link single-use (``answer_nonce``);
- a cancel request on a claimed todo (``cancel_request``) and the time a todo
  ended canceled (``canceled_at``: a done todo that was canceled);
- the worker's last ``progress`` and ``checkpoint``, and a release's ``note``;
- ``dismissed_at``: a dead letter an operator dismissed from its group.

A held todo (an open question) is pending with ``available_at`` at its
deadline, or far in the future without one: the claim index's range for a
lane ends at the statement's clock, so the claim never reads a held row.

- ``todos_open_question_idx``: the open questions by endpoint, oldest first
  (the inbox, its count, the oldest question's age).
- ``todos_question_deadline_idx``: open questions with a deadline, for the
  sweep that expires them.
- ``todos_canceled_idx``: canceled todos, for the cancel figures.
- ``todos_dead_letter_group_idx`` again, holding only undismissed dead letters:
  the groups page stays an index-only scan of what it shows.
"""

from django.db import migrations, models

DEAD_LETTER_GROUPS = """
    CREATE INDEX todos_dead_letter_group_idx
        ON todos (endpoint_id, queue, error_fingerprint, updated_at)
        WHERE state = 'failed' AND next_retry_at IS NULL{}
"""

FORWARD = [
    """
    CREATE INDEX todos_open_question_idx ON todos (endpoint_id, asked_at)
        WHERE state = 'pending' AND question_status = 'open'
    """,
    """
    CREATE INDEX todos_question_deadline_idx ON todos (answer_deadline)
        WHERE state = 'pending' AND question_status = 'open'
          AND answer_deadline IS NOT NULL
    """,
    """
    CREATE INDEX todos_canceled_idx ON todos (endpoint_id, canceled_at)
        WHERE canceled_at IS NOT NULL
    """,
    "DROP INDEX todos_dead_letter_group_idx",
    DEAD_LETTER_GROUPS.format(" AND dismissed_at IS NULL"),
]

BACKWARD = [
    "DROP INDEX todos_dead_letter_group_idx",
    DEAD_LETTER_GROUPS.format(""),
    "DROP INDEX todos_canceled_idx",
    "DROP INDEX todos_question_deadline_idx",
    "DROP INDEX todos_open_question_idx",
]

QUESTION_STATUSES = ("open", "answered", "expired")


def _nullable(field):
    return field(null=True, blank=True)


class Migration(migrations.Migration):
    dependencies = [("todos", "0013_webhook_replay_guard")]

    operations = [
        migrations.AddField("todo", "question", _nullable(models.JSONField)),
        migrations.AddField("todo", "question_status", _nullable(models.TextField)),
        migrations.AddField("todo", "asked_at", _nullable(models.DateTimeField)),
        migrations.AddField("todo", "answer_deadline", _nullable(models.DateTimeField)),
        migrations.AddField("todo", "answer", _nullable(models.JSONField)),
        migrations.AddField("todo", "answer_nonce", _nullable(models.TextField)),
        migrations.AddField("todo", "cancel_request", _nullable(models.JSONField)),
        migrations.AddField("todo", "canceled_at", _nullable(models.DateTimeField)),
        migrations.AddField("todo", "progress", _nullable(models.JSONField)),
        migrations.AddField("todo", "checkpoint", _nullable(models.JSONField)),
        migrations.AddField("todo", "note", _nullable(models.TextField)),
        migrations.AddField("todo", "dismissed_at", _nullable(models.DateTimeField)),
        migrations.AddConstraint(
            model_name="todo",
            constraint=models.CheckConstraint(
                condition=models.Q(question_status__in=QUESTION_STATUSES),
                name="todos_question_status_check",
            ),
        ),
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
