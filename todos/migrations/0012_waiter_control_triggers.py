"""Control rings for waiters (todos/waiting/doorbell.py's CONTROL_CHANNEL).

Triggers, so that every path that changes an endpoint or an MCP session (the
CLI, the Board, the lifecycle helpers, plain SQL) tells the servers' doorbell
hubs, in the same transaction:

- an endpoint revoked, its token rotated, its grant changed or the endpoint
  deleted: its open streams and long polls re-check their token and end;
- an endpoint revoked: its MCP sessions end (the rows go, which rings too);
- an MCP session deleted or its log level changed: its GET stream ends or
  re-reads its level.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION switchboard_endpoint_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('switchboard_control',
            json_build_object('kind', 'endpoint', 'endpoint_id', OLD.id)::text);
        RETURN OLD;
    END IF;
    IF NEW.revoked_at IS DISTINCT FROM OLD.revoked_at
       OR NEW.token_hash IS DISTINCT FROM OLD.token_hash
       OR NEW.queues IS DISTINCT FROM OLD.queues THEN
        PERFORM pg_notify('switchboard_control',
            json_build_object('kind', 'endpoint', 'endpoint_id', NEW.id)::text);
    END IF;
    IF NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL THEN
        DELETE FROM mcp_sessions WHERE endpoint_id = NEW.id;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER endpoints_control
    AFTER UPDATE OF revoked_at, token_hash, queues OR DELETE ON endpoints
    FOR EACH ROW EXECUTE FUNCTION switchboard_endpoint_changed();

CREATE FUNCTION switchboard_mcp_session_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.log_level IS NOT DISTINCT FROM OLD.log_level THEN
        RETURN NEW;
    END IF;
    PERFORM pg_notify('switchboard_control',
        json_build_object('kind', 'session', 'endpoint_id', OLD.endpoint_id,
                          'session_id', OLD.id)::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER mcp_sessions_control
    AFTER UPDATE OF log_level OR DELETE ON mcp_sessions
    FOR EACH ROW EXECUTE FUNCTION switchboard_mcp_session_changed();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS mcp_sessions_control ON mcp_sessions;
DROP FUNCTION IF EXISTS switchboard_mcp_session_changed();
DROP TRIGGER IF EXISTS endpoints_control ON endpoints;
DROP FUNCTION IF EXISTS switchboard_endpoint_changed();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("todos", "0011_history_key"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
