"""Gang events that share a hop travel as one ``GangBatch`` (docs/events.md, "Batches"), against
a real nats-server: the sender batches a burst and sends a lone event at once; the consumer
hands each event to the handler as if it came alone — in its gang's line with the gang's
other messages, in its own trace, refused alone when its channel's batches do not carry its
kind — and settles the batch once."""

from __future__ import annotations

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from phalanx_bus import BatchSender, Bus, PermanentError, TemporaryError, consume
from phalanx_proto import subjects as S
from phalanx_proto.events import BindsDone, PlacementFailed, Released, Reserved, batch_of, gang_decoder
from phalanx_telemetry import tracer

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ANSWERS = S.placement_answers_subject("r1")


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    yield b
    await b.close()


async def run_consumer(bus, durable: str, handler, done, *, concurrency: int = 8, settle_s: float = 0.0):
    """Consume ``phx.gang.coord.>`` in gang order until ``done()``, then ``settle_s`` more."""
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(bus, stream=S.STREAM_GANG, durable=durable, filter_subject="phx.gang.coord.>",
                                          decoder=gang_decoder, handler=handler, ack_wait_s=2.0,
                                          concurrency=concurrency, order_key=S.gang_key_of_subject))
            while not done():
                await anyio.sleep(0.05)
            await anyio.sleep(settle_s)
            tg.cancel_scope.cancel()


async def stored(bus, subject: str) -> int:
    info = await bus.js.stream_info(S.STREAM_GANG, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def test_a_burst_goes_out_in_a_few_batches_in_order_and_a_lone_event_at_once(bus):
    sender = BatchSender(bus, ANSWERS, "r1")
    events = [Reserved(gang_id=f"default/g{i % 7}", attempt=1 + i // 7, members_digest=f"d{i}") for i in range(60)]
    async with anyio.create_task_group() as tg:
        await tg.start(sender.run)
        async with anyio.create_task_group() as burst:
            for ev in events:
                burst.start_soon(sender.send, ev)
        assert 1 <= sender.batches <= 2, sender.batches  # what waits when the sender is free goes as one
        before = sender.batches
        with anyio.fail_after(5):
            await sender.send(Released(gang_id="default/lone"))
        assert sender.batches == before + 1
        tg.cancel_scope.cancel()
    assert await stored(bus, ANSWERS) == sender.batches
    seen = []

    async def handler(event, delivery):
        seen.append(event)

    await run_consumer(bus, "burst-test", handler, lambda: len(seen) >= len(events) + 1)
    for g in range(7):  # each gang's answers in the order they were sent
        assert [e for e in seen if e.gang_id == f"default/g{g}"] == [e for e in events if e.gang_id == f"default/g{g}"]
    assert sorted(e.key() for e in seen) == sorted([e.key() for e in events] + [Released(gang_id="default/lone").key()])


async def test_a_batched_event_waits_for_its_gangs_earlier_message_on_another_subject(bus):
    """A gang's reply from binder, published first in binder's batch, is handled before its
    answer from placement in placement's batch, and the two are never handled at once."""
    await bus.publish(S.binder_answers_subject("b1"), batch_of("b1", BindsDone(gang_id="default/a", attempt=1)))
    await bus.publish(ANSWERS, batch_of("r1", Reserved(gang_id="default/a", attempt=2),
                                        Reserved(gang_id="default/b", attempt=1)))
    calls, active = [], set()

    async def handler(event, delivery):
        assert event.gang_id not in active
        active.add(event.gang_id)
        try:
            await anyio.sleep(0.5 if isinstance(event, BindsDone) else 0.01)
            calls.append((type(event).__name__, event.gang_id, event.attempt))
        finally:
            active.discard(event.gang_id)

    await run_consumer(bus, "order-test", handler, lambda: len(calls) >= 3)
    assert [c for c in calls if c[1] == "default/a"] == [("BindsDone", "default/a", 1), ("Reserved", "default/a", 2)]
    assert calls[0] == ("Reserved", "default/b", 1)  # another gang does not wait


async def test_an_event_its_channel_does_not_carry_is_dead_lettered_alone_and_the_rest_handled_once(bus):
    forged = BindsDone(gang_id="default/x", attempt=1)  # a binder reply smuggled into placement's answers
    await bus.publish(ANSWERS, batch_of("r1", Reserved(gang_id="default/x", attempt=1), forged,
                                        Released(gang_id="default/y")))
    seen = []

    async def handler(event, delivery):
        seen.append((event, delivery.num_delivered))

    await run_consumer(bus, "carry-test", handler, lambda: len(seen) >= 2, settle_s=3.0)  # > the ack wait
    assert seen == [(Reserved(gang_id="default/x", attempt=1), 1), (Released(gang_id="default/y"), 1)]
    dead = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, S.dead_letter_subject(S.STREAM_GANG, "carry-test"))
    assert dead.headers["Phalanx-Cause"] == "misaddressed"
    assert "event 1 of the batch: kind 'gang.binds_done' of gang 'default/x' is not carried" in \
        dead.headers["Phalanx-Error"]
    info = await bus.js.consumer_info(S.STREAM_GANG, "carry-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_retry_sends_the_whole_batch_again_and_a_permanent_refusal_is_dead_lettered_alone(bus):
    await bus.publish(ANSWERS, batch_of("r1", Reserved(gang_id="default/t", attempt=1),
                                        PlacementFailed(gang_id="default/p", summary="no"),
                                        Released(gang_id="default/ok")))
    calls = []

    async def handler(event, delivery):
        calls.append((event.gang_id, delivery.num_delivered))
        if event.gang_id == "default/p":
            raise PermanentError("never")
        if event.gang_id == "default/t" and delivery.num_delivered == 1:
            raise TemporaryError("not yet", delay=0.1)

    await run_consumer(bus, "retry-test", handler, lambda: ("default/t", 2) in calls, settle_s=3.0)
    # The second delivery handles every event again (handlers are idempotent); then the batch is acked.
    assert sorted(calls) == sorted([("default/t", 1), ("default/p", 1), ("default/ok", 1),
                                    ("default/t", 2), ("default/p", 2), ("default/ok", 2)])
    dead = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, S.dead_letter_subject(S.STREAM_GANG, "retry-test"))
    assert "event 1 of the batch (gang default/p): permanent: never" in dead.headers["Phalanx-Error"]
    info = await bus.js.consumer_info(S.STREAM_GANG, "retry-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0


@pytest.fixture
def recording():
    """A recording tracer provider (the process's first; test_tracing's when it ran before)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())


async def test_each_batched_event_continues_the_trace_it_was_sent_in(bus, recording):
    sender = BatchSender(bus, ANSWERS, "r1")
    sent = {}
    async with anyio.create_task_group() as tg:
        await tg.start(sender.run)

        async def send(gang: str) -> None:
            with tracer().start_as_current_span(f"decide {gang}") as span:
                sent[gang] = span.get_span_context().trace_id
                await sender.send(Reserved(gang_id=gang, attempt=1))

        async with anyio.create_task_group() as burst:
            for g in ("default/a", "default/b", "default/c"):
                burst.start_soon(send, g)
        tg.cancel_scope.cancel()
    got = {}

    async def handler(event, delivery):
        got[event.gang_id] = trace.get_current_span().get_span_context().trace_id

    await run_consumer(bus, "trace-test", handler, lambda: len(got) >= 3)
    assert got == sent and len(set(sent.values())) == 3
