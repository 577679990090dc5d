"""The batch span processor (todos.telemetry.batching) exports every sampled
span it is handed, in batches, on its schedule, when a batch is full, on a
flush and at shutdown; it drops the oldest when its queue is full and says so."""

import logging
import os
import threading

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from todos.telemetry.batching import (
    MAX_EXPORT_BATCH_SIZE,
    MAX_QUEUE_SIZE,
    SCHEDULE_DELAY_MILLIS,
    BatchSpanProcessor,
)

# Long enough that the schedule never fires in a test that does not wait for it.
NEVER = 3_600_000


class Batches(SpanExporter):
    """Keeps each batch exported, by span name; ``exported`` is set on each."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.exported = threading.Event()
        self.shut_down = False

    def export(self, spans):
        self.batches.append([span.name for span in spans])
        self.exported.set()
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.shut_down = True


def ended(name: str, sampled: bool = True) -> ReadableSpan:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return ReadableSpan(name, SpanContext(1, 2, is_remote=False, trace_flags=flags))


@pytest.fixture
def batches():
    return Batches()


def test_a_flush_exports_every_queued_span_oldest_first_in_batches(batches):
    processor = BatchSpanProcessor(
        batches, schedule_delay_millis=NEVER, max_export_batch_size=3
    )
    with processor.exporting:  # the thread exports nothing meanwhile
        for n in range(7):
            processor.on_end(ended(f"s{n}"))
    assert processor.force_flush()
    assert batches.batches == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6"]]
    processor.shutdown()


def test_an_unsampled_span_is_not_exported(batches):
    processor = BatchSpanProcessor(batches, schedule_delay_millis=NEVER)
    processor.on_end(ended("kept"))
    processor.on_end(ended("unsampled", sampled=False))
    processor.force_flush()
    assert batches.batches == [["kept"]]
    processor.shutdown()


def test_the_thread_exports_on_its_schedule(batches):
    processor = BatchSpanProcessor(batches, schedule_delay_millis=20)
    processor.on_end(ended("s"))
    assert batches.exported.wait(10)
    assert batches.batches == [["s"]]
    processor.shutdown()


def test_a_full_batch_wakes_the_thread_before_its_schedule(batches):
    processor = BatchSpanProcessor(
        batches, schedule_delay_millis=NEVER, max_export_batch_size=2
    )
    for n in range(3):  # the third finds a full batch queued
        processor.on_end(ended(f"s{n}"))
    assert batches.exported.wait(10)
    assert batches.batches[0] == ["s0", "s1"]
    processor.shutdown()


def test_a_full_queue_drops_the_oldest_and_says_how_many(batches, caplog):
    processor = BatchSpanProcessor(
        batches, max_queue_size=4, schedule_delay_millis=NEVER, max_export_batch_size=4
    )
    with processor.exporting:
        for n in range(6):
            processor.on_end(ended(f"s{n}"))
    with caplog.at_level(logging.WARNING, logger="todos.telemetry.batching"):
        processor.force_flush()
    assert batches.batches == [["s2", "s3", "s4", "s5"]]
    assert "2 spans dropped" in caplog.text
    processor.shutdown()


def test_shutdown_exports_what_is_left_and_ends_the_exporter(batches):
    processor = BatchSpanProcessor(batches, schedule_delay_millis=NEVER)
    processor.on_end(ended("left"))
    processor.shutdown()
    assert batches.batches == [["left"]]
    assert batches.shut_down
    assert not processor.thread.is_alive()
    processor.on_end(ended("after"))
    assert not processor.force_flush()
    assert batches.batches == [["left"]]


def test_the_environment_sets_the_schedule_and_the_sizes(batches, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
    processor = BatchSpanProcessor(batches)
    assert (processor.schedule_delay, processor.max_queue_size) == (0.25, 100)
    assert processor.batch_size == 10
    processor.shutdown()


def test_a_bad_setting_is_logged_and_the_default_used(batches, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "soon")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-1")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", raising=False)
    with caplog.at_level(logging.ERROR, logger="todos.telemetry.batching"):
        processor = BatchSpanProcessor(batches)
    assert processor.schedule_delay == SCHEDULE_DELAY_MILLIS / 1000
    assert processor.max_queue_size == MAX_QUEUE_SIZE
    assert processor.batch_size == MAX_EXPORT_BATCH_SIZE
    assert "OTEL_BSP_SCHEDULE_DELAY" in caplog.text
    assert "OTEL_BSP_MAX_QUEUE_SIZE" in caplog.text
    processor.shutdown()


def test_a_batch_is_never_larger_than_the_queue(batches):
    processor = BatchSpanProcessor(
        batches, max_queue_size=5, schedule_delay_millis=NEVER, max_export_batch_size=50
    )
    assert processor.batch_size == 5
    processor.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.filterwarnings("ignore:This process .* multi-threaded:DeprecationWarning")
def test_a_forked_child_exports_its_own_spans_from_a_thread_of_its_own(batches):
    processor = BatchSpanProcessor(batches, schedule_delay_millis=NEVER)
    processor.on_end(ended("parent's"))
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its own thread, an empty queue
        try:
            processor.on_end(ended("child's"))
            processor.force_flush()
            alive = processor.thread.is_alive()
            os.write(write, f"{batches.batches[-1]} {alive}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    os.waitpid(child, 0)
    assert said == '["child\'s"] True'
    processor.force_flush()
    assert batches.batches == [["parent's"]]
    processor.shutdown()
