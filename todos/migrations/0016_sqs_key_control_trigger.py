"""A control ring when an endpoint's SQS key is rotated or removed.

As migration 0012's triggers do for the endpoint itself: a ReceiveMessage
waiting with the old key re-validates it (todos/waiting/doorbell.py) and ends.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION switchboard_sqs_key_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('switchboard_control',
        json_build_object('kind', 'endpoint', 'endpoint_id', OLD.endpoint_id)::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER sqs_credentials_control
    AFTER UPDATE OF access_key_id, secret_encrypted OR DELETE ON sqs_credentials
    FOR EACH ROW EXECUTE FUNCTION switchboard_sqs_key_changed();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS sqs_credentials_control ON sqs_credentials;
DROP FUNCTION IF EXISTS switchboard_sqs_key_changed();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("todos", "0015_answered_questions_index"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
