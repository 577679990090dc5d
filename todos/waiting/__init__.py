"""Waiting without a thread or a connection, on the doorbell.

- ``doorbell``: the hub, two LISTEN connections per process, and its waiters.
- ``longpoll``: a claim that waits for work (API, SQS, MCP).
- ``results``: a creator's wait for one todo's result.
- ``streams``: the event-stream loop (``/api/v1/events``, MCP's GET stream).
"""
