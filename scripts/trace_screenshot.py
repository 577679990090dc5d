"""One real trace, drawn for docs/operations.md: docs/screenshots/trace-laptop.png.

There is no Jaeger here and no network, so this script is its own small trace
viewer. It serves Switchboard as `make run` does (gunicorn) with tracing on,
exporting over OTLP/HTTP to the protobuf receiver of the tests
(tests/tracing/receiver.py) in this process; the agent (the Python client's
``Worker``) exports its own spans there too. Then one piece of work goes
through it:

1. a CI job, inside its span, creates a review todo with the client (which
   sends its ``traceparent``);
2. the agent claims it; its handler makes a model call (a span of its own),
   reports progress and asks a question: the todo is held;
3. a reviewer answers; the todo is delivered again (a new trace, linked to
   the first delivery); the handler makes another model call and returns.

Every span the receiver decoded is drawn as a waterfall, a trace a panel,
with each span's service, its events and its link, and Playwright (driving
Debian's Chromium, as the browser tests do) saves the page as a PNG. Nothing
is drawn that the receiver did not get.

    SB_PG_PORT=54329 .venv/bin/python scripts/trace_screenshot.py

It uses its own database, ``switchboard_trace_demo``, on the server of the
benchmarks (bench/benchlib.py: ``--database-url`` picks another).
"""

import argparse
import html
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python" / "src")]
sys.path.append(str(ROOT / "bench"))

import benchlib  # noqa: E402

OUT = ROOT / "docs" / "screenshots" / "trace-laptop.png"
CHROMIUM = "/usr/bin/chromium"
QUEUE = "reviews"
AGENT = "review-agent"
CALLER = "ci"
SERVICE = "switchboard"
# How long each pretend model call takes (so the bars have a length).
MODEL_SECONDS = 0.4


def options():
    parse = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parse.add_argument(
        "--database-url",
        default=benchlib.sibling_url(
            benchlib.default_url(), name="switchboard_trace_demo"
        ),
    )
    parse.add_argument("--out", type=Path, default=OUT, help="the PNG (%(default)s)")
    parse.add_argument("--html", type=Path, help="also keep the page here")
    parse.add_argument("--port", type=int, default=0, help="gunicorn's (0: any free)")
    return parse.parse_args()


# --- The run --------------------------------------------------------------------


def provider(service, receiver):
    """An SDK tracer provider of one service, exporting to ``receiver``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    made = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{receiver}/v1/traces")
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


def journey(port, token, receiver):
    """Create, claim, ask, answer, claim again, complete; every span exported."""
    from switchboard_client import Client, Context, Worker

    ci = provider(CALLER, receiver)
    agent = provider(AGENT, receiver)
    model = agent.get_tracer("review-agent")
    url = f"http://127.0.0.1:{port}"

    def review(ctx: Context):
        with model.start_as_current_span(
            "chat claude-sonnet", attributes={"gen_ai.request.model": "claude-sonnet"}
        ):
            time.sleep(MODEL_SECONDS)
        if ctx.answer is None:
            ctx.progress("read the diff", 0.5)
            ctx.save_checkpoint({"read": True}, now=True)
            ctx.ask("Post the review on the pull request?", choices=["post", "hold"])
        return {"posted": ctx.answer.value == "post"}

    with Client(url, token, worker="reviewer-1") as client:
        worker = Worker(Client(url, token, worker="reviewer-1"), wait_seconds=1)
        worker.handler(QUEUE)(review)
        thread = threading.Thread(target=worker.run, daemon=True)
        with ci.get_tracer("ci").start_as_current_span("pipeline #812: request review"):
            todo = client.create(QUEUE, title="Review PR #42", payload={"pr": 42}).todo
        thread.start()
        held = client.wait(todo, timeout=30)
        assert held.held, held
        time.sleep(0.3)
        client.answer(held, "post", worker="maintainer")
        done = client.wait(todo, timeout=30)
        assert done.outcome == "done", done
        worker.stop()
        thread.join(timeout=30)
    ci.shutdown()
    agent.shutdown()
    return todo.id


# --- The page -------------------------------------------------------------------


def spans_of(received):
    """Every span the receiver decoded: (service, span), by trace."""
    traces = {}
    for _, _, request in received:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value for a in resource_spans.resource.attributes}
            service = attributes["service.name"].string_value
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    traces.setdefault(span.trace_id.hex(), []).append((service, span))
    return traces


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else ""


SHOWN = (
    "messaging.operation.name",
    "messaging.switchboard.delivery",
    "messaging.switchboard.attempt",
    "messaging.switchboard.outcome",
    "messaging.client.id",
    "gen_ai.request.model",
)


def ordered(spans):
    """Depth-first from the roots, children by start time: (depth, service, span)."""
    ids = {span.span_id for _, span in spans}
    children = {}
    for service, span in spans:
        parent = span.parent_span_id if span.parent_span_id in ids else b""
        children.setdefault(parent, []).append((service, span))
    out = []

    def walk(parent, depth):
        for service, span in sorted(
            children.get(parent, []), key=lambda item: item[1].start_time_unix_nano
        ):
            out.append((depth, service, span))
            walk(span.span_id, depth + 1)

    walk(b"", 0)
    return out


def marks(span, start, width):
    """A span's events on its lane, one under the other; a label near the end
    of the lane runs leftwards so it stays inside."""
    out = []
    for number, event in enumerate(span.events):
        label = html.escape(event.name)
        early = span.start_time_unix_nano - event.time_unix_nano
        if early > 0:
            # Kept for this delivery before it began (the answer that ended
            # the hold): drawn at its start, saying how long before.
            label += f" ({early / 1e6:,.0f} ms before the claim)"
        at = max(event.time_unix_nano, start)
        left = (at - start) / width * 100
        side = "end" if left > 60 else "start"
        out.append(
            f'<span class="event {side}" style="left:{left:.2f}%;'
            f'top:{28 + number * 15}px"><i></i>{label}</span>'
        )
    return "".join(out)


def row(depth, service, span, start, width, names):
    left = (span.start_time_unix_nano - start) / width * 100
    size = max((span.end_time_unix_nano - span.start_time_unix_nano) / width, 0.004)
    took = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
    attributes = {a.key: value(a.value) for a in span.attributes}
    details = " · ".join(
        f"{key.rsplit('.', 1)[-1]}={attributes[key]}"
        for key in SHOWN
        if key in attributes
    )
    links = "".join(
        '<div class="link">↪ linked to '
        f"{html.escape(names.get(link.span_id, 'a span'))} in trace "
        f"{link.trace_id.hex()[:8]}…</div>"
        for link in span.links
    )
    kind = html.escape(service) + (" error" if span.status.code == 2 else "")
    lines = max(1, len(span.events))
    return (
        f'<div class="row" style="min-height:{30 + lines * 15}px">'
        f'<div class="name" style="padding-left:{depth * 18 + 8}px">'
        f'<b class="svc {kind}">{html.escape(service)}</b> '
        f"{html.escape(span.name)} <em>{took:,.1f} ms</em>"
        f"<small>{html.escape(details)}</small>{links}</div>"
        f'<div class="lane"><div class="bar {kind}" '
        f'style="left:{left:.2f}%;width:{size * 100:.2f}%"></div>'
        f"{marks(span, start, width)}</div></div>"
    )


def panel(trace_id, spans, names):
    start = min(span.start_time_unix_nano for _, span in spans)
    end = max(span.end_time_unix_nano for _, span in spans)
    width = max(end - start, 1)
    rows = "".join(
        row(depth, service, span, start, width, names)
        for depth, service, span in ordered(spans)
    )
    return (
        f"<section><h2>Trace <code>{trace_id}</code> <span>{len(spans)} spans, "
        f"{width / 1e6:,.0f} ms</span></h2>{rows}</section>"
    )


STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; }
h1 { font-size: 18px; margin: 0 0 4px; } p.lede { margin: 0 0 16px; color: #566; }
section { border: 1px solid #d5dae3; border-radius: 8px; margin-bottom: 18px; }
h2 { font-size: 14px; margin: 0; padding: 8px 12px; background: #f3f5f9;
     border-bottom: 1px solid #d5dae3; border-radius: 8px 8px 0 0; }
h2 span { font-weight: normal; color: #667; margin-left: 8px; }
.row { display: grid; grid-template-columns: 470px 1fr; border-top: 1px solid #eef0f4; }
.row:first-of-type { border-top: 0; }
.name { padding: 6px 8px; } .name small { display: block; color: #778; }
.link { color: #6a4fb3; font-size: 12px; }
.lane { position: relative; margin: 0 24px 0 8px; }
.name em { font-style: normal; color: #667; font-size: 12px; }
.bar { position: absolute; top: 10px; height: 14px; border-radius: 3px; }
.bar.switchboard { background: #3b7ddd; } .bar.review-agent { background: #e08a2e; }
.bar.ci { background: #4aa36c; } .bar.error { outline: 2px solid #c0392b; }
.svc { font-size: 11px; padding: 1px 5px; border-radius: 3px; color: #fff; }
.svc.switchboard { background: #3b7ddd; } .svc.review-agent { background: #e08a2e; }
.svc.ci { background: #4aa36c; }
.event { position: absolute; font-size: 11px; color: #333; white-space: nowrap; }
.event.end { transform: translateX(-100%); }
.event i { display: inline-block; width: 7px; height: 7px; background: #222;
           transform: rotate(45deg); margin-right: 3px; }
"""


def page(traces):
    names = {span.span_id: span.name for spans in traces.values() for _, span in spans}
    panels = sorted(
        traces.items(),
        key=lambda item: min(span.start_time_unix_nano for _, span in item[1]),
    )
    body = "".join(panel(trace_id, spans, names) for trace_id, spans in panels)
    return (
        f"<!doctype html><meta charset=utf-8><style>{STYLE}</style>"
        "<h1>One review, as the OTLP receiver got it</h1>"
        '<p class="lede">Spans exported by Switchboard (<b>switchboard</b>), the '
        "Python client's worker (<b>review-agent</b>) and its caller (<b>ci</b>); "
        "drawn by scripts/trace_screenshot.py.</p>" + body
    )


def capture(text, out):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        view = browser.new_page(viewport={"width": 1280, "height": 300})
        view.set_content(text)
        out.parent.mkdir(parents=True, exist_ok=True)
        view.screenshot(path=str(out), full_page=True)
        browser.close()


def main():
    args = options()
    url = args.database_url
    benchlib.prepare_database(url)
    _, token = benchlib.ensure_endpoint(url, name="trace-demo")
    benchlib.reset_todos(url)
    from tests.tracing.receiver import receiving

    with receiving() as (receiver, received):
        environment = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver,
            "OTEL_SERVICE_NAME": SERVICE,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with benchlib.serve(
            url, workers=1, port=args.port or None, **environment
        ) as server:
            todo_id = journey(server.port, token, receiver)
        # gunicorn exported what it held as it stopped.
        traces = spans_of(received)
    text = page(traces)
    if args.html:
        args.html.write_text(text)
    capture(text, args.out)
    count = sum(len(spans) for spans in traces.values())
    print(f"todo {todo_id}: {count} spans in {len(traces)} traces -> {args.out}")


if __name__ == "__main__":
    main()
