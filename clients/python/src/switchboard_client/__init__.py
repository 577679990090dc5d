"""Switchboard's Python client (``Client``, ``AsyncClient``) and worker
runtime (``Worker``)."""

from switchboard_client._core import KEEP, Retry
from switchboard_client.aio import AsyncClient
from switchboard_client.client import Client
from switchboard_client.errors import (
    APIError,
    BadRequest,
    BudgetExhausted,
    Conflict,
    Forbidden,
    LeaseSuperseded,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    SwitchboardError,
    TransportError,
    Unauthorized,
    Unavailable,
)
from switchboard_client.logs import JsonFormatter
from switchboard_client.models import (
    ActionResult,
    Answer,
    Created,
    CreateResult,
    Event,
    ItemError,
    Page,
    Progress,
    Question,
    Queue,
    Todo,
)
from switchboard_client.worker import Context, Worker

__all__ = [
    "KEEP",
    "APIError",
    "ActionResult",
    "Answer",
    "AsyncClient",
    "BadRequest",
    "BudgetExhausted",
    "Client",
    "Conflict",
    "Context",
    "CreateResult",
    "Created",
    "Event",
    "Forbidden",
    "ItemError",
    "JsonFormatter",
    "LeaseSuperseded",
    "MethodNotAllowed",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "Progress",
    "Question",
    "Queue",
    "RateLimited",
    "Retry",
    "ServerError",
    "SwitchboardError",
    "Todo",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Worker",
]
