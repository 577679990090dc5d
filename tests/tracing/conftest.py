"""Tracing's fixtures: the SDK's in-memory exporter, on for one test."""

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from todos.telemetry import tracing


@pytest.fixture
def spans():
    """Tracing on for the test, every span kept in memory (``.get_finished_spans``)."""
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    yield exporter
    tracing.disable()


@pytest.fixture
def operator(db):
    """A staff operator of the Board."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(
        "ops", password="a-long-password", is_staff=True
    )
