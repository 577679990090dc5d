"""The HTTP pieces every surface shares, and the endpoints outside the surfaces.

- ``http``: the JSON error body, bounded body reading, strict JSON.
- ``middleware``: the request log line, JSON errors, the Board's middleware.
- ``threads``: the bounded thread pool the async views hand their sync work to.
- ``sse``: the event-stream response of the API's and MCP's streams.
- ``health`` (``/healthz``) and ``metrics`` (``/metrics``).
"""
