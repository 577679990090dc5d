"""The health check: 200 when the database answers, 503 when it does not."""

from todos import store
from todos.web.http import JsonResponse


def healthz(request):
    """Answer whether the database is reachable."""
    if store.ping():
        return JsonResponse({"status": "ok"})
    return JsonResponse(
        {"status": "unavailable", "detail": "the database cannot be reached"},
        status=503,
    )
