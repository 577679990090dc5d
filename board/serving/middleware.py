"""The middleware bypass of the waiting views (see board.serving)."""

import re
import threading
from collections.abc import Awaitable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, ResolverMatch, resolve

from todos.web.middleware import GetResponse, MaybeAwaitable

# A path that names a todo by its id: the part before, the id, the part after.
TODO_PATH = re.compile(
    r"(?P<before>/api/v1/todos/)"
    r"(?P<id>[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"(?P<after>/[a-z]+)?"
)


class Routes:
    """Django's ``resolve``, for the paths agents call most, without walking
    the URLconf each time (20 µs a request, in three nested resolvers).

    A path with nothing captured resolves alike every time: its match is kept
    as it is. Every path that names a todo by its id resolves alike but for
    the id: its first match is kept per shape (the path around the id), and
    later paths of that shape get a copy with their own id. Any other path,
    and any path whose route did not capture exactly that id as ``todo_id``,
    resolves as Django does. At most ``SIZE`` matches are kept.
    """

    SIZE = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[object, ResolverMatch] = {}

    def resolve(self, path: str) -> ResolverMatch:
        """Return ``path``'s match; raise Resolver404 as ``resolve`` does."""
        todo = TODO_PATH.fullmatch(path)
        key: object = path if todo is None else (todo["before"], todo["after"])
        kept = self._kept.get(key)
        if kept is not None:
            return kept if todo is None else _with_todo_id(kept, todo["id"])
        match = resolve(path)
        if todo is None:
            keep = not match.args and not match.kwargs
        else:
            # Django sets captured_kwargs; its stubs do not know it.
            captured = {"todo_id": todo["id"]}
            keep = (
                not match.args
                and match.kwargs == captured
                and match.__dict__.get("captured_kwargs") == captured
            )
        if keep:
            with self._lock:
                if len(self._kept) < self.SIZE:
                    self._kept[key] = match
        return match


def _with_todo_id(match: ResolverMatch, todo_id: str) -> ResolverMatch:
    """A copy of ``match`` (a todo path's) that names ``todo_id``."""
    copy: ResolverMatch = object.__new__(ResolverMatch)
    copy.__dict__.update(
        match.__dict__,
        kwargs={"todo_id": todo_id},
        captured_kwargs={"todo_id": todo_id},
    )
    return copy


routes = Routes()


class WaitingViewsMiddleware:
    """Take the async views (the agent surfaces' views, served in the event
    loop) past the middleware below this one.

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
        try:
            match = routes.resolve(request.path_info)
        except Resolver404:
            match = None
        response: HttpResponseBase
        if match is None:
            response = await self.get_response(request)  # type: ignore[misc]  # is_async: an awaitable
            return response
        if iscoroutinefunction(match.func):
            request.resolver_match = match
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
