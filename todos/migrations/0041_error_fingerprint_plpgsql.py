"""The error fingerprint (``switchboard_error_fingerprint``) in PL/pgSQL.

``todos.error_fingerprint`` is a stored generated column, and PostgreSQL
prepares every generated column's expression at the start of every INSERT
and UPDATE of todos, whichever columns it sets. The SQL function was inlined
into that expression, so each create, claim and acknowledgement parsed and
analysed its body again: about 20 µs of the database's CPU a statement, 8% of
a claim+complete pair's (a profile of the backend: ExecInitStoredGenerated).
PL/pgSQL is not inlined: the statement's start only names the function, and
it runs (keeping its compiled body for the session) when a row's last_error
is set. The same fingerprints: the body is the same expression.
"""

from django.db import migrations

BODY = r"""
    regexp_replace(
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
        '\s+', ' ', 'g')"""

PLPGSQL = rf"""
CREATE OR REPLACE FUNCTION switchboard_error_fingerprint(error text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fp$
BEGIN
    RETURN NULLIF(left(btrim({BODY}), 300), '');
END
$fp$
"""

SQL = rf"""
CREATE OR REPLACE FUNCTION switchboard_error_fingerprint(error text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fp$
SELECT NULLIF(left(btrim({BODY}), 300), '')
$fp$
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0040_rate_shards_take_in_proportion")]

    operations = [migrations.RunSQL(sql=PLPGSQL, reverse_sql=SQL)]
