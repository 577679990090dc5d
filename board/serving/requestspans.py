"""The HTTP server span of each request, when asked for.

OpenTelemetry's Django instrumentation makes it (its middleware, set up by
todos.telemetry.tracing), first in ``MIDDLEWARE``: one ``SERVER`` span per
request named by its method and route, a child of the request's
``traceparent``; the spans the request makes (a create's ``send <queue>``) are
its children. Its own middleware is sync only, and one sync middleware would
make Django serve the waiting views in a thread (board.serving); this one is
the same middleware made async capable: for the views served in the event
loop it runs there, its hooks being no I/O.

Opt-in (``OTEL_PYTHON_DJANGO_INSTRUMENT=true`` with tracing on; see
``tracing._request_spans_asked``): else ``request_spans`` raises
MiddlewareNotUsed, so no handler holds it.
"""

from functools import cache
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.urls import Resolver404

from board.serving.middleware import routes
from todos.telemetry import tracing
from todos.web.middleware import GetResponse


def request_spans(get_response: GetResponse) -> Any:
    """The middleware factory ``MIDDLEWARE`` names: the span's middleware, or
    MiddlewareNotUsed while requests are not traced."""
    if not tracing.requests_traced():
        raise MiddlewareNotUsed
    return middleware_class()(get_response)


request_spans.sync_capable = True  # type: ignore[attr-defined]  # Django reads it
request_spans.async_capable = True  # type: ignore[attr-defined]  # Django reads it


@cache
def middleware_class() -> type:
    """The instrumentation's middleware, async capable (imported only when
    tracing is on)."""
    from opentelemetry.context import detach
    from opentelemetry.instrumentation.django.middleware.otel_middleware import (
        _DjangoMiddleware,
    )
    from opentelemetry.trace import Status, StatusCode
    from opentelemetry.util.http import sanitize_method

    # Untyped: its hooks are called as Any.
    instrumentations: Any = _DjangoMiddleware

    class RequestSpanMiddleware(instrumentations):  # type: ignore[misc]  # Any
        def __init__(self, get_response: GetResponse) -> None:
            super().__init__(get_response)
            self.is_async = iscoroutinefunction(get_response)
            if self.is_async:
                markcoroutinefunction(self)

        def __call__(self, request: HttpRequest) -> Any:
            if self.is_async:
                return self._acall(request)
            return super().__call__(request)

        async def _acall(self, request: HttpRequest) -> HttpResponseBase:
            self.process_request(request)
            try:
                response: HttpResponseBase = await self.get_response(request)
            except BaseException as exc:
                # The client left (the view was cancelled): end the span.
                self.abandon(request, exc)
                raise
            if request.resolver_match is not None:
                # The waiting views are resolved below, with no process_view.
                self.process_view(request, request.resolver_match.func)
            response = self.process_response(request, response)
            return response

        def abandon(self, request: HttpRequest, exc: BaseException) -> None:
            """End the span of a request that got no response, with ``exc``."""
            activation = request.META.pop(self._environ_activation_key, None)
            span = request.META.pop(self._environ_span_key, None)
            if span is not None:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
            if activation is not None:
                activation.__exit__(type(exc), exc, exc.__traceback__)
            token = request.META.pop(self._environ_token, None)
            if token is not None:
                detach(token)

        @staticmethod
        def _get_span_name(request: HttpRequest) -> str:
            # Resolved through the kept matches (board.serving.middleware.Routes),
            # not Django's resolve (20 µs).
            method: str = sanitize_method(str(request.method).strip())
            if method == "_OTHER":
                return "HTTP"
            try:
                route = routes.resolve(request.path_info).route
            except Resolver404:
                return method
            return f"{method} {route}" if route else method

    return RequestSpanMiddleware
