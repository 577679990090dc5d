"""The Board inbox's recent answers: answered questions, the latest first.

A todo keeps its answer after it moves on, so answered questions accumulate;
this partial index holds only them, ordered by when they were answered
(``answer->>'at'``, ISO-8601 UTC text, which sorts as time does), so the
inbox reads its last handful without scanning the table.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("todos", "0014_questions_cancel_progress")]

    operations = [
        migrations.RunSQL(
            sql="""
            CREATE INDEX todos_answered_idx ON todos (((answer->>'at')) DESC, id)
                WHERE question_status = 'answered' AND answer IS NOT NULL
            """,
            reverse_sql="DROP INDEX todos_answered_idx",
        )
    ]
