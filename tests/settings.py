"""The test suite's settings: the project's, with a fast password hasher.

A key for the tests is put in the environment first, so that the settings
(and every child process the tests start: gunicorn, manage.py, workers)
find one; a real deployment sets its own SECRET_KEY.
"""

import os
import re

os.environ.setdefault(
    "SECRET_KEY", "switchboard-tests-only-key-not-a-secret-0123456789abcdef"
)

from board.settings import *  # noqa: E402,F403

# Hashing a password the production way costs a quarter second per user.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The test process runs many threads that each keep their connection (claimant
# threads, the live server's request threads) without handing it back: its own
# pool must not be the bound. The servers the tests start keep the project's.
if "pool" in DATABASES["default"]["OPTIONS"]:  # noqa: F405
    DATABASES["default"]["OPTIONS"]["pool"]["max_size"] = 200  # noqa: F405
    DATABASES["default"]["OPTIONS"]["pool"]["min_size"] = 0  # noqa: F405

# The suite's statements wait longer than a deployment's 5 s: a transactional
# test's teardown truncates every table, and on a loaded machine that TRUNCATE
# (a new file per table, fsynced) can outlast 5 s. The tests of the timeout
# itself set their own (SET LOCAL, or SWITCHBOARD_STATEMENT_TIMEOUT_MS for the
# servers they start with board.settings).
STATEMENT_TIMEOUT_MS = 30_000
DATABASES["default"]["OPTIONS"]["options"] = re.sub(  # noqa: F405
    r"statement_timeout=\d+",
    f"statement_timeout={STATEMENT_TIMEOUT_MS}",
    DATABASES["default"]["OPTIONS"]["options"],  # noqa: F405
)
