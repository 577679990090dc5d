"""The database floor: how this process reaches PostgreSQL, below everything else.

The store, the hub and the serving all connect as Django does; what that means
(the parameters, the check after idleness, a commit the synchronous standby did
not confirm) is decided here once. This package imports Django's settings and
psycopg, and nothing of Switchboard's own.
"""
