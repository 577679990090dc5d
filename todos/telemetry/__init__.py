"""What the process tells its operators, below the store: nothing here imports
Switchboard.

- ``tracing``: OpenTelemetry, W3C context in and out, and the spans.
- ``otlp``: the spans' export over OTLP/HTTP, in an encoding of our own.
- ``logs``: the log formatters and the filter that keeps credentials out.
"""
