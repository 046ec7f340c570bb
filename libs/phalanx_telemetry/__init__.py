"""Structured logs and OpenTelemetry tracing for every Phalanx process.

Logs are one ``key=value`` line per event on stderr with stable keys (``service=``,
``event=``, ``gang=``, ``node=``, …) so they grep and parse alike. Traces are configured only
by the standard ``OTEL_*`` variables: ``OTEL_TRACES_EXPORTER`` = ``none`` (default),
``console`` or ``otlp`` (OTLP over HTTP; endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``OTEL_SERVICE_NAME`` overrides the service name,
``OTEL_TRACES_SAMPLER`` the sampler (default: record everything when exporting, nothing new
when not).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from phalanx_proto.vocab import RefusalRule

_LOG = logging.getLogger("phalanx")
_service = "phalanx"


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class _KvFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"service={_service}",
                 f"event={_quote(record.getMessage())}"]
        for k, v in getattr(record, "kv", {}).items():
            parts.append(f"{k}={_quote(v)}")
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup_logging(service: str, level: str | None = None) -> None:
    """Send Phalanx logs as key=value lines to stderr. Idempotent."""
    global _service
    _service = service
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KvFormatter())
    _LOG.handlers[:] = [handler]
    _LOG.setLevel((level or os.environ.get("PHALANX_LOG_LEVEL", "INFO")).upper())
    _LOG.propagate = False


def log(event: str, *, level: int = logging.INFO, exc_info: bool = False, **kv: object) -> None:
    """Log one event with stable keys: ``log("placed", gang=g, node=n)``."""
    _LOG.log(level, event, extra={"kv": kv}, exc_info=exc_info)


def warn(event: str, **kv: object) -> None:
    log(event, level=logging.WARNING, **kv)


def refused(rule: RefusalRule | str, why: str, **kv: object) -> None:
    """A message refused because it does not match the record: one warning naming the rule and
    the reason, and ``phalanx_refused_messages_total{rule}``. Nothing else happens. Raises
    ``ValueError`` for a rule that is not a ``RefusalRule`` (a string is read as its value)."""
    from phalanx_telemetry import metrics

    rule = RefusalRule(rule)
    metrics.REFUSED.inc(rule=rule)
    warn("refused", rule=rule, why=why, **kv)


def setup_tracing(service: str) -> TracerProvider:
    """Install a tracer provider whose exporter is chosen by ``OTEL_TRACES_EXPORTER``.

    With no exporter, nobody reads the spans, so new traces are not recorded (a
    ``parentbased_always_off`` sampler: span and trace ids are still made, logged and passed on
    in headers; a parent recorded upstream is still followed). ``OTEL_TRACES_SAMPLER`` set in the
    environment decides instead."""
    name = os.environ.get("OTEL_SERVICE_NAME", f"phalanx-{service}")
    processors = []
    for exporter_name in os.environ.get("OTEL_TRACES_EXPORTER", "none").split(","):
        exporter_name = exporter_name.strip().lower()
        if exporter_name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        elif exporter_name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
        elif exporter_name not in ("none", ""):
            warn("unknown OTEL_TRACES_EXPORTER ignored", exporter=exporter_name)
    unread = not processors and not os.environ.get("OTEL_TRACES_SAMPLER")
    provider = TracerProvider(resource=Resource.create({"service.name": name}),
                              sampler=ParentBased(ALWAYS_OFF) if unread else None)
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return provider


_tracer: tuple[object, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """Phalanx's tracer from the current tracer provider, made once per provider (getting a
    tracer builds a new one each time, which shows on every message's path)."""
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, trace.get_tracer("phalanx", tracer_provider=provider))
    return _tracer[1]


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add W3C ``traceparent``/``tracestate`` of the current span to NATS headers."""
    propagate.inject(headers)
    return headers


def extract_context(headers: dict[str, str] | None):
    """The trace context carried by NATS headers (empty context when absent)."""
    return propagate.extract(headers or {})
