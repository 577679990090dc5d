"""ASGI entry point: what gunicorn's uvicorn workers serve (gunicorn.conf.py).

Django's ASGI handler gives every request a thread of its own for its sync
code (asgiref's ThreadSensitiveContext), parked for as long as the request
lasts. The waiting requests — long-poll claims, ``/api/v1/events``, MCP GET
streams — are async all through (todos.middleware.WaitingViewsMiddleware
takes them past the sync middleware, and their database calls run in the
bounded pool of todos.aio), so they are served without that context: a
waiting agent parks no thread.
"""

import os

import django
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "board.settings")

# Paths (and methods) whose views are async and wait.
WAITING = {
    "/api/v1/todos/claim": {"POST"},
    "/api/v1/events": {"GET"},
    "/mcp": {"GET"},
    # The SQS surface: every call, since any ReceiveMessage may wait.
    "/": {"POST"},
}


# The agent API's sync views run in todos.aio's bounded pool instead (one hop).
API_PREFIX = "/api/"


class Handler(ASGIHandler):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (
            scope["path"].startswith(API_PREFIX)
            or scope["method"] in WAITING.get(scope["path"], ())
        ):
            await self.handle(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


django.setup(set_prefix=False)
application = Handler()
