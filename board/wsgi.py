"""WSGI entry point: `gunicorn board.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")

application = get_wsgi_application()
