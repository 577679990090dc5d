"""The middleware bypass of the waiting views (see board.serving)."""

from collections.abc import Awaitable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from todos.middleware import GetResponse, MaybeAwaitable


class WaitingViewsMiddleware:
    """Take the waiting views (async views marked ``waits``) past the
    middleware below this one.

    Django runs a sync middleware's hooks in a thread, one hop each way per
    middleware, even around an async view: a long poll would cost a dozen
    thread hops and park a thread while it waits. The views below need none
    of them (token auth, no session, no cookie, no CSRF), so they are called
    here directly; the headers the skipped middleware would add (security
    headers, Content-Length) are added here. Everything else goes down the
    chain as usual.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        from django.middleware.clickjacking import XFrameOptionsMiddleware
        from django.middleware.security import SecurityMiddleware

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        self.headers = (
            SecurityMiddleware(get_response),
            XFrameOptionsMiddleware(get_response),
        )

    def __call__(self, request: HttpRequest) -> MaybeAwaitable:
        if self.is_async:
            return self._acall(request)
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        from django.urls import Resolver404, resolve

        try:
            match = resolve(request.path_info)
        except Resolver404:
            match = None
        response: HttpResponseBase
        if match is None:
            response = await self.get_response(request)  # type: ignore[misc]  # is_async: an awaitable
            return response
        if getattr(match.func, "waits", False):
            request.resolver_match = match
            # A waiting view is an async function view (``waits``, api_view).
            waiting: Awaitable[HttpResponseBase] = match.func(
                request, *match.args, **match.kwargs
            )
            response = await waiting
        else:
            response = await self.get_response(request)  # type: ignore[misc]  # is_async: an awaitable
            return response
        for middleware in self.headers:
            response = middleware.process_response(request, response)  # type: ignore[arg-type]  # stubs say HttpResponse; Django passes streams too
        if isinstance(response, HttpResponse) and not response.has_header(
            "Content-Length"
        ):
            # As CommonMiddleware would: keep-alive clients need the length.
            response.headers["Content-Length"] = str(len(response.content))
        return response
