"""The database floor: how this process reaches PostgreSQL, below everything else.

The store, the hub and the serving all connect as Django does; what that means
(the parameters, the check after idleness, a commit the synchronous standby did
not confirm) is decided here once, and so is the process's async pool that the
agent surfaces' statements are awaited on (``pool``). This package imports
Django and psycopg, and nothing of Switchboard's above it.
"""
