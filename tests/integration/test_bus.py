"""The bus mechanisms against a real nats-server: redelivery, de-duplication, dead letters."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from phalanx_bus import Bus, KvConflict, PermanentError, TemporaryError, consume
from phalanx_proto import subjects as S
from phalanx_proto.events import PlaceRequested, Released, gang_decoder

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    yield b
    await b.close()


async def collect(bus, durable, subject, handler, n, timeout=10, concurrency=1):
    """Run a consumer until ``handler`` has returned ``n`` times (bounded by ``timeout``)."""
    seen = []

    async def record(event, delivery):
        await handler(event, delivery)
        seen.append((event, delivery.num_delivered))
        if len(seen) >= n:
            tg.cancel_scope.cancel()

    with anyio.fail_after(timeout):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(bus, stream=S.STREAM_GANG, durable=durable, filter_subject=subject,
                                          decoder=gang_decoder, handler=record, ack_wait_s=1.0,
                                          concurrency=concurrency))
    return seen


async def test_a_message_is_redelivered_when_its_consumer_dies_before_the_ack(bus, nats_private, tmp_path):
    await bus.publish("phx.gang.placement.default.g1", PlaceRequested(gang_id="default/g1"))
    marker = tmp_path / "marker"
    with anyio.fail_after(60):
        proc = await anyio.run_process([sys.executable, str(Path(__file__).with_name("crashy_consumer.py")),
                                        nats_private.url, str(marker)], check=False)
    assert proc.returncode == 17, proc.stderr.decode()
    assert marker.read_text() == "default/g1 1\n"

    async def ok(event, delivery):
        pass

    seen = await collect(bus, "crash-test", "phx.gang.placement.>", ok, 1)
    assert seen == [(PlaceRequested(gang_id="default/g1"), 2)]


async def test_the_same_msg_id_published_twice_is_stored_once(bus):
    ev = PlaceRequested(gang_id="default/dup", attempt=1)
    first = await bus.publish("phx.gang.placement.default.dup", ev)
    second = await bus.publish("phx.gang.placement.default.dup", ev)
    third = await bus.publish("phx.gang.placement.default.dup", PlaceRequested(gang_id="default/dup", attempt=2))
    assert first == second
    assert third == first + 1
    info = await bus.js.stream_info(S.STREAM_GANG)
    assert info.state.messages == 2


async def test_an_undecodable_message_is_terminated_and_recorded_and_the_consumer_goes_on(bus):
    await bus.publish_raw("phx.gang.placement.default.bad", b'{"kind": "no.such.kind", "gang_id": 1}',
                          {"Nats-Msg-Id": "bad-1"})
    await bus.publish("phx.gang.placement.default.good", PlaceRequested(gang_id="default/good"))

    async def ok(event, delivery):
        pass

    seen = await collect(bus, "dlq-test", "phx.gang.placement.>", ok, 1)
    assert seen == [(PlaceRequested(gang_id="default/good"), 1)]
    dead = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, S.dead_letter_subject(S.STREAM_GANG, "dlq-test"))
    assert dead.data == b'{"kind": "no.such.kind", "gang_id": 1}'
    assert dead.headers["Phalanx-Original-Subject"] == "phx.gang.placement.default.bad"
    assert "undecodable" in dead.headers["Phalanx-Error"]
    info = await bus.js.consumer_info(S.STREAM_GANG, "dlq-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_temporary_error_is_retried_and_a_permanent_one_is_dead_lettered(bus):
    await bus.publish("phx.gang.placement.default.t", PlaceRequested(gang_id="default/t"))
    await bus.publish("phx.gang.placement.default.p", PlaceRequested(gang_id="default/p"))
    calls = []

    async def flaky(event, delivery):
        calls.append((event.gang_id, delivery.num_delivered))
        if event.gang_id == "default/p":
            raise PermanentError("never")
        if delivery.num_delivered == 1:
            raise TemporaryError("not yet", delay=0.1)

    seen = await collect(bus, "ladder-test", "phx.gang.placement.>", flaky, 1)
    assert seen == [(PlaceRequested(gang_id="default/t"), 2)]
    assert sorted(calls) == [("default/p", 1), ("default/t", 1), ("default/t", 2)]
    dead = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, S.dead_letter_subject(S.STREAM_GANG, "ladder-test"))
    assert "permanent: never" in dead.headers["Phalanx-Error"]


async def test_a_concurrent_consumer_runs_up_to_its_bound_at_once_and_settles_each_message_alone(bus):
    for i in range(12):
        await bus.publish(f"phx.gang.placement.default.c{i}", PlaceRequested(gang_id=f"default/c{i}"))
    in_flight, peak, calls = 0, 0, []
    four_at_once = anyio.Event()

    async def handler(event, delivery):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        calls.append((event.gang_id, delivery.num_delivered))
        if in_flight == 4:
            four_at_once.set()
        try:
            with anyio.fail_after(10):  # one message at a time would never get here
                await four_at_once.wait()
            await anyio.sleep(0.01)
        finally:
            in_flight -= 1
        if event.gang_id == "default/c3" and delivery.num_delivered == 1:
            raise TemporaryError("not yet", delay=0.1)
        if event.gang_id == "default/c7":
            raise PermanentError("never")

    seen = await collect(bus, "parallel-test", "phx.gang.placement.>", handler, 11, timeout=30, concurrency=4)
    assert peak == 4
    assert sorted((e.gang_id, n) for e, n in seen) == sorted(
        [(f"default/c{i}", 1) for i in range(12) if i not in (3, 7)] + [("default/c3", 2)])
    assert sorted(calls) == sorted([(f"default/c{i}", 1) for i in range(12)] + [("default/c3", 2)])
    dead = await bus.js.get_last_msg(S.STREAM_DEAD_LETTER, S.dead_letter_subject(S.STREAM_GANG, "parallel-test"))
    assert "permanent: never" in dead.headers["Phalanx-Error"]


async def test_an_ordered_consumer_handles_one_gang_at_a_time_in_order_and_never_twice_while_it_waits(bus):
    # Six messages of a slow gang first, then three fast gangs' interleaved: the slow gang's
    # later messages wait behind its earlier ones far longer than the ack wait (2 s); they
    # must neither be redelivered while they wait nor overtake each other.
    order = [("slow", a) for a in range(1, 7)] + [(g, a) for a in range(1, 4) for g in ("f1", "f2", "f3")]
    for gang, attempt in order:
        await bus.publish(S.placement_subject(f"default/{gang}"), PlaceRequested(gang_id=f"default/{gang}",
                                                                                     attempt=attempt))
    active: set[str] = set()
    overlapped_gangs, calls = [], []

    async def handler(event, delivery):
        assert event.gang_id not in active, f"two messages of {event.gang_id} handled at once"
        if active:
            overlapped_gangs.append(event.gang_id)
        active.add(event.gang_id)
        calls.append((event.gang_id, event.attempt, delivery.num_delivered))
        try:
            await anyio.sleep(0.6 if event.gang_id == "default/slow" else 0.01)
        finally:
            active.discard(event.gang_id)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(bus, stream=S.STREAM_GANG, durable="ordered-test",
                                          filter_subject="phx.gang.placement.>", decoder=gang_decoder,
                                          handler=handler, ack_wait_s=2.0, concurrency=8,
                                          order_key=S.gang_key_of_subject))
            while len(calls) < len(order) or active:
                await anyio.sleep(0.05)
            await anyio.sleep(3)  # long enough for a redelivery of anything left unacknowledged
            tg.cancel_scope.cancel()
    assert sorted(calls) == sorted((f"default/{g}", a, 1) for g, a in order)
    for gang in ("slow", "f1", "f2", "f3"):
        assert [a for g, a, _ in calls if g == f"default/{gang}"] == sorted(a for g, a in order if g == gang)
    assert overlapped_gangs, "different gangs were never handled at the same time"


async def test_a_message_that_fails_on_every_delivery_is_dead_lettered_with_its_error_not_dropped(bus):
    from phalanx_telemetry import metrics

    await bus.publish("phx.gang.placement.default.crash", PlaceRequested(gang_id="default/crash"))
    await bus.publish("phx.gang.placement.default.busy", PlaceRequested(gang_id="default/busy"))
    calls = []
    before = metrics.BUS_DEAD_LETTERS.value(consumer="exhaust-test", cause="exhausted")

    async def failing(event, delivery):
        calls.append((event.gang_id, delivery.num_delivered))
        if event.gang_id == "default/crash":
            raise RuntimeError("ledger unreachable")
        raise TemporaryError("ledger kept changing", delay=0.05)

    async def dead_letters():
        info = await bus.js.stream_info(S.STREAM_DEAD_LETTER)
        return info.state.messages >= 2

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(bus, stream=S.STREAM_GANG, durable="exhaust-test",
                                          filter_subject="phx.gang.placement.>", decoder=gang_decoder,
                                          handler=failing, ack_wait_s=1.0, max_deliver=3))
            while not await dead_letters():
                await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    assert sorted(calls) == [("default/busy", n) for n in (1, 2, 3)] + [("default/crash", n) for n in (1, 2, 3)]
    subject = S.dead_letter_subject(S.STREAM_GANG, "exhaust-test")
    got = {}
    for seq in (1, 2):
        m = await bus.js.get_msg(S.STREAM_DEAD_LETTER, seq)
        assert m.subject == subject
        got[gang_decoder.decode(m.data).gang_id] = (m.headers["Phalanx-Cause"], m.headers["Phalanx-Error"])
    assert got == {"default/crash": ("exhausted", "failed on all 3 deliveries: RuntimeError: ledger unreachable"),
                   "default/busy": ("exhausted", "failed on all 3 deliveries: ledger kept changing")}
    assert metrics.BUS_DEAD_LETTERS.value(consumer="exhaust-test", cause="exhausted") == before + 2
    info = await bus.js.consumer_info(S.STREAM_GANG, "exhaust-test")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_kv_compare_and_set_refuses_a_stale_revision(bus):
    kv = await bus.kv(S.KV_LEDGER)
    rev = await kv.create("n1", b"a")
    await kv.update("n1", b"b", last=rev)
    with pytest.raises(KvConflict):
        await kv.update("n1", b"c", last=rev)
    with pytest.raises(KvConflict):
        await kv.create("n1", b"d")
    assert (await kv.get("n1")).value == b"b"


async def test_a_delete_at_a_stale_revision_is_a_conflict_and_deletes_nothing(bus):
    kv = await bus.kv(S.KV_LEDGER)
    rev = await kv.create("n1", b"a")
    await kv.update("n1", b"b", last=rev)
    with pytest.raises(KvConflict):
        await kv.delete("n1", last=rev)
    assert (await kv.get("n1")).value == b"b"
    await kv.delete("n1", last=rev + 1)
    assert await kv.get("n1") is None


async def test_declare_is_idempotent_and_keeps_data(bus):
    await bus.publish("phx.gang.coord.default.x", Released(gang_id="default/x"))
    await bus.declare()
    await bus.declare()
    info = await bus.js.stream_info(S.STREAM_GANG)
    assert info.state.messages == 1
    assert msgspec.json.decode((await bus.js.get_last_msg(S.STREAM_GANG, "phx.gang.coord.default.x")).data) == {
        "kind": "gang.released", "gang_id": "default/x"}


async def test_an_atomic_kv_batch_commits_whole_or_changes_nothing(bus):
    from phalanx_bus import enable_atomic, kv_atomic_write

    await enable_atomic(bus, S.KV_LEDGER)
    kv = await bus.kv(S.KV_LEDGER)
    r1 = await kv.put("n1", b"one")
    await kv_atomic_write(bus, S.KV_LEDGER, [("n1", b"one'", r1), ("n2", b"two", 0)])
    e1, e2 = await kv.get("n1"), await kv.get("n2")
    assert (e1.value, e2.value) == (b"one'", b"two")
    with pytest.raises(KvConflict):
        await kv_atomic_write(bus, S.KV_LEDGER, [("n2", b"two'", e2.revision), ("n1", b"stale", r1)])
    assert ((await kv.get("n1")).value, (await kv.get("n2")).value) == (b"one'", b"two")


async def test_kv_keys_lists_every_key_while_they_are_being_rewritten(bus):
    kv = await bus.kv(S.KV_HEARTBEAT)
    names = [f"node-{i}" for i in range(20)]
    for n in names:
        await kv.put(n, b"0")
    listings = []

    async def churn():
        i = 0
        while True:
            await kv.put(names[i % len(names)], str(i).encode())
            i += 1
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(churn)
            for _ in range(30):
                listings.append(await kv.keys())
            tg.cancel_scope.cancel()
    assert all(listing == sorted(names) for listing in listings)


async def test_an_atomic_kv_batch_creates_a_key_again_after_it_was_deleted_and_still_refuses_a_live_one(bus):
    from phalanx_bus import enable_atomic, kv_atomic_write

    await enable_atomic(bus, S.KV_LEDGER)
    kv = await bus.kv(S.KV_LEDGER)
    await kv.put("n3", b"bad value an operator removed")
    await kv.delete("n3")
    await kv_atomic_write(bus, S.KV_LEDGER, [("n3", b"fresh", 0)])
    assert (await kv.get("n3")).value == b"fresh"
    with pytest.raises(KvConflict):
        await kv_atomic_write(bus, S.KV_LEDGER, [("n3", b"blind", 0)])
    assert (await kv.get("n3")).value == b"fresh"
