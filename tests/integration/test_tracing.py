"""One span per handled message, linked to the publisher's span through ``traceparent``."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from phalanx_bus import Bus, consume
from phalanx_proto import subjects as S
from phalanx_proto.events import PlaceRequested, gang_decoder
from phalanx_telemetry import tracer

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture(scope="module")
def spans():
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the process's provider can be set only once
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_the_consumer_span_is_a_child_of_the_publisher_span_across_the_bus(nats_private, spans):
    bus = await Bus.connect(nats_private.url, service="test")
    try:
        await bus.declare()
        with tracer().start_as_current_span("admit gang") as root:
            await bus.publish(S.placement_subject("default/g"), PlaceRequested(gang_id="default/g", attempt=3))
        done = anyio.Event()

        async def handler(event, delivery):
            assert "traceparent" in delivery.headers
            done.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: consume(bus, stream=S.STREAM_GANG, durable="trace-test",
                                              filter_subject="phx.gang.placement.>", decoder=gang_decoder,
                                              handler=handler))
                await done.wait()
                await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
        by_name = {s.name: s for s in spans.get_finished_spans()}
        send = by_name["publish phx.gang.placement.{gang}"]
        process = by_name["process phx.gang.placement.{gang}"]
        assert send.parent.span_id == root.get_span_context().span_id
        assert process.parent.span_id == send.context.span_id
        assert process.context.trace_id == root.get_span_context().trace_id
        assert process.kind == trace.SpanKind.CONSUMER and send.kind == trace.SpanKind.PRODUCER
        assert (process.attributes["phalanx.gang"], process.attributes["phalanx.attempt"],
                process.attributes["messaging.system"], process.attributes["phalanx.outcome"]) == (
            "default/g", 3, "nats", "ack")
        # OTel messaging semantic conventions (operation name/type, destination and its template).
        for span, op, op_type in ((send, "publish", "send"), (process, "process", "process")):
            assert (span.attributes["messaging.operation.name"], span.attributes["messaging.operation.type"],
                    span.attributes["messaging.destination.name"], span.attributes["messaging.destination.template"],
                    span.attributes["messaging.message.id"]) == (
                op, op_type, "phx.gang.placement.default.g", "phx.gang.placement.{gang}",
                bus.msg_id(PlaceRequested(gang_id="default/g", attempt=3).key()))
        assert process.attributes["messaging.consumer.group.name"] == "trace-test"
        assert process.attributes["messaging.nats.message.delivery_count"] == 1
    finally:
        await bus.close()
