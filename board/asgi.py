"""ASGI entry point: what gunicorn's uvicorn workers serve (gunicorn.conf.py)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")

application = get_asgi_application()
