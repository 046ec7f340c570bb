"""setup_tracing: spans are recorded when something exports them, and only then (unless the
standard sampler variable says otherwise); ids are made and passed on either way."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from phalanx_telemetry import inject_headers, setup_tracing, tracer


@pytest.fixture
def restore_provider(monkeypatch):
    # The global provider may be set once per process: let each case set its own.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", trace.Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


CASES = [
    ("no exporter records nothing new", {}, False),
    ("an exporter records every span", {"OTEL_TRACES_EXPORTER": "console"}, True),
    ("the sampler variable wins without an exporter", {"OTEL_TRACES_SAMPLER": "always_on"}, True),
]


@pytest.mark.parametrize(("name", "env", "recorded"), CASES, ids=[c[0] for c in CASES])
def test_spans_are_recorded_only_when_read(restore_provider, name, env, recorded):
    for k, v in env.items():
        restore_provider.setenv(k, v)
    provider = setup_tracing("test")
    with tracer().start_as_current_span("root") as span:
        headers = inject_headers({})
        context = span.get_span_context()
        assert span.is_recording() is recorded
    provider.shutdown()
    assert context.is_valid
    assert headers["traceparent"].split("-")[1] == format(context.trace_id, "032x")


def test_a_parent_recorded_upstream_is_followed_without_an_exporter(restore_provider):
    setup_tracing("test")
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    from phalanx_telemetry import extract_context

    with tracer().start_as_current_span("child", context=extract_context({"traceparent": upstream})) as span:
        assert span.is_recording()
        assert format(span.get_span_context().trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
