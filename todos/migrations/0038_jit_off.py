"""PostgreSQL's JIT off for Switchboard's database.

PostgreSQL compiles a statement's expressions to machine code when its plan's
estimated cost passes ``jit_above_cost`` (100,000 by default). The claim that
admits (lifecycle.CLAIM_SQL) crosses it once the todos table holds some
100,000 rows, and then every claim spent 150–220 ms compiling 456 functions
to run a statement that takes a millisecond (measured with auto_explain: a
queue with every admission control on went from 1,100 claims a second to
10). A queue's statements are short and run thousands of times a second: JIT
never pays for itself here, so new sessions of this database start with it
off. Setting it needs the database's owner (or a superuser); a role that is
neither sets it for itself in this database; one that cannot do either is
told with a notice, and operations.md says how to set it by hand.
"""

from django.db import migrations

JIT_OFF = r"""
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET jit = off', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    BEGIN
        EXECUTE format('ALTER ROLE CURRENT_USER IN DATABASE %I SET jit = off',
                       current_database());
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE NOTICE 'Switchboard could not turn JIT off for database %: set '
                     'jit = off for it (docs/operations.md)', current_database();
    END;
END
$$;
"""

JIT_BACK = r"""
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I RESET jit', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    EXECUTE format('ALTER ROLE CURRENT_USER IN DATABASE %I RESET jit',
                   current_database());
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("todos", "0037_usage_total_plpgsql")]

    operations = [migrations.RunSQL(sql=JIT_OFF, reverse_sql=JIT_BACK)]
