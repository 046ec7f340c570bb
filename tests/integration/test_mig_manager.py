"""mig-manager against a real nats-server, on the fake NVML: prepare → verified ready, NVML's
refusals as MigFailed, a crash between create and reply, destroy, orphan reconciliation."""

from __future__ import annotations

import sys

import anyio
import msgspec
import pynvml
import pytest

from phalanx_bus import Bus
from phalanx_bus.declare import declare_consumer
from phalanx_nvml import NvmlMig
from phalanx_nvmlfake.mig import FakeMigNvml, from_spec
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    Assignment,
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    PodRef,
    node_decoder,
)
from phalanx_proto.state import (
    Allocation,
    MigRecord,
    NodeLedger,
    NodeMig,
    alloc_key,
    mig_slot,
    node_mig_decoder,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

NODE = "a100-a"
POD = PodRef(namespace="default", name="p0", uid="u0")


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    await declare_consumer(b, S.node_consumer(NODE))  # what gang-coordinator does before a node's first command
    yield b
    await b.close()


async def records(bus) -> dict:
    """The node's MIG ownership records, by slot (``{}`` when it has none)."""
    entry = await (await bus.kv(S.KV_MIG)).get(S.token(NODE))
    return {} if entry is None else node_mig_decoder.decode(entry.value).instances


class NoDelivery:
    """A handler's ``Delivery`` for direct calls."""

    async def in_progress(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def replies(bus, n: int, timeout: float = 10.0) -> list:
    """The first ``n`` replies on the node's reply subject (from the stream, so none are missed)."""
    sub = await bus.js.subscribe(S.node_reply_subject(NODE), stream=S.STREAM_NODE, ordered_consumer=True)
    out = []
    try:
        with anyio.fail_after(timeout):
            while len(out) < n:
                msg = await sub.next_msg(timeout=timeout)
                out.append(node_decoder.decode(msg.data))
    finally:
        await sub.unsubscribe()
    return out


def prepare(gpu=0, profile="3g.20gb", start=4, attempt=1, pod=POD) -> MigPrepareRequested:
    return MigPrepareRequested(node=NODE, gang_id="default/g", attempt=attempt, pod=pod, gpu=gpu,
                               profile=profile, start=start)


async def with_manager(bus, fake: FakeMigNvml, body, *, clock=None, grace=60.0, reconcile_s=3600.0):
    from phalanx_mig_manager.service import Config, run

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            manager = await tg.start(lambda task_status: run(
                bus, Config(node=NODE, reconcile_s=reconcile_s, orphan_grace_s=grace, devices=NvmlMig(fake),
                            clock=clock or Clock()), task_status=task_status))
            await body(manager)
            tg.cancel_scope.cancel()


async def test_a_prepare_replies_ready_with_the_uuid_the_driver_lists(bus):
    fake = FakeMigNvml.of("A100-40GB")

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare())
        [reply] = await replies(bus, 1)
        [inst] = NvmlMig(fake).list_instances(0)
        assert reply == MigReady(node=NODE, gang_id="default/g", attempt=1, pod=POD, instance_uuid=inst.uuid)
        assert (inst.profile, inst.start) == ("3g.20gb", 4)
        record = (await records(bus))["0.4"]
        assert (record.state, record.uuid, record.gang_id) == ("ready", inst.uuid, "default/g")

    await with_manager(bus, fake, body)


@pytest.mark.parametrize(("case", "spec", "command", "reason"), [
    ("an illegal start slot fails with NVML's reason", "A100-40GBx1", prepare(start=2),
     "NVML refused 3g.20gb at slot 2 on GPU 0: nvmlDeviceCreateGpuInstanceWithPlacement failed: ERROR_INVALID_ARGUMENT"),
    ("a GPU not in MIG mode fails with the admin's command", "A100-40GBx1@off", prepare(),
     "GPU 0 is not in MIG mode; an admin enables it with nvidia-smi -i 0 -mig 1"),
    ("a GPU model without MIG fails", "V100-32GBx1", prepare(), "GPU 0 (NVIDIA V100-32GB) does not support MIG"),
    ("a GPU that does not exist fails", "A100-40GBx1", prepare(gpu=3), "GPU 3 does not exist on node a100-a"),
])
async def test_a_prepare_that_cannot_succeed_replies_failed_with_the_reason(bus, case, spec, command, reason):
    fake = from_spec(spec)

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), command)
        [reply] = await replies(bus, 1)
        assert isinstance(reply, MigFailed), case
        assert reply.reason.startswith(reason), reply.reason
        assert fake.creates == 0
        assert await records(bus) == {}

    await with_manager(bus, fake, body)


async def test_a_create_that_is_not_listed_afterwards_fails_closed(bus):
    fake = FakeMigNvml.of("H100-80GB")
    fake.phantom_next_create()

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare(profile="3g.40gb", start=0))
        [reply] = await replies(bus, 1)
        assert isinstance(reply, MigFailed)
        assert "not listed" in reply.reason

    await with_manager(bus, fake, body)


@pytest.mark.parametrize("state", ["creating", "ready"], ids=["before the verify", "after the verify"])
async def test_a_redelivery_after_a_crash_between_create_and_reply_finds_the_instance(bus, state):
    """The previous process wrote its intent and created the instance, then died before the
    reply: the redelivered command must answer ready for that instance, with no second create."""
    fake = FakeMigNvml.of("A100-40GB")
    gi = NvmlMig(fake).create(0, "3g.20gb", 4)
    [before] = NvmlMig(fake).list_instances(0)
    intent = MigRecord(node=NODE, gpu=0, start=4, profile="3g.20gb", gang_id="default/g", attempt=1, pod=POD,
                       state=state, uuid=before.uuid if state == "ready" else "", gi_id=gi if state == "ready" else -1)
    await (await bus.kv(S.KV_MIG)).create(S.token(NODE), msgspec.json.encode(
        NodeMig(node=NODE, instances={mig_slot(0, 4): intent})))

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare())
        [reply] = await replies(bus, 1)
        assert reply == MigReady(node=NODE, gang_id="default/g", attempt=1, pod=POD, instance_uuid=before.uuid)
        assert fake.creates == 1  # the one the "crashed" process made
        assert NvmlMig(fake).list_instances(0) == (before,)

    await with_manager(bus, fake, body)


async def test_an_nvml_error_on_create_fails_the_prepare_and_frees_the_slot(bus):
    fake = FakeMigNvml.of("A100-40GB")
    fake.fail_next_create(pynvml.NVML_ERROR_UNKNOWN)

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare())
        [failed] = await replies(bus, 1)
        assert isinstance(failed, MigFailed) and "ERROR_UNKNOWN" in failed.reason
        assert await records(bus) == {}
        await bus.publish(S.mig_subject(NODE), prepare(attempt=2))  # the next attempt gets the slot
        _, ready = await replies(bus, 2)
        assert isinstance(ready, MigReady)

    await with_manager(bus, fake, body)


async def test_a_second_prepare_for_a_slot_someone_else_holds_fails(bus):
    fake = FakeMigNvml.of("A100-40GB")
    other = PodRef(namespace="default", name="p1")

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare())
        await bus.publish(S.mig_subject(NODE), prepare(pod=other))
        first, second = await replies(bus, 2)
        assert isinstance(first, MigReady)
        assert isinstance(second, MigFailed) and "held by default/p0" in second.reason
        assert fake.creates == 1

    await with_manager(bus, fake, body)


async def test_destroy_removes_the_instance_and_is_idempotent(bus):
    fake = FakeMigNvml.of("A100-40GB")

    async def body(manager):
        await bus.publish(S.mig_subject(NODE), prepare())
        [ready] = await replies(bus, 1)
        destroy = MigDestroyRequested(node=NODE, gang_id="default/g", attempt=1, pod=POD, gpu=0,
                                      instance_uuid=ready.instance_uuid)
        await bus.publish(S.mig_subject(NODE), destroy)
        _, first = await replies(bus, 2)
        assert first == MigDestroyed(node=NODE, gang_id="default/g", attempt=1, pod=POD)
        # A redelivered destroy (its reply would be de-duplicated on the stream): same answer.
        assert await manager.destroy(destroy, NoDelivery()) == first
        assert NvmlMig(fake).list_instances(0) == ()
        assert await records(bus) == {}

    await with_manager(bus, fake, body)


async def test_reconciliation_destroys_an_orphan_only_after_the_grace(bus):
    fake = FakeMigNvml.of("A100-40GB")
    m = NvmlMig(fake)
    m.create(0, "1g.5gb", 6)  # an orphan: no record, no reservation
    m.create(0, "3g.20gb", 0)  # booked in the ledger
    booked = Assignment(pod=POD, node=NODE, gpus=(0,), mig_profile="3g.20gb", mig_start=0)
    ledger = NodeLedger(node=NODE, allocations={alloc_key(POD): Allocation(gang_id="default/g", attempt=1,
                                                                          assignment=booked)})
    await (await bus.kv(S.KV_LEDGER)).put(S.token(NODE), msgspec.json.encode(ledger))
    clock = Clock()

    async def body(manager):
        assert [i.start for i in m.list_instances(0)] == [0, 6]  # seen at start, not yet destroyed
        clock.now += 30
        await manager.reconcile()
        assert [i.start for i in m.list_instances(0)] == [0, 6]
        clock.now += 31
        await manager.reconcile()
        assert [(i.profile, i.start) for i in m.list_instances(0)] == [("3g.20gb", 0)]
        assert manager.counters.orphans_destroyed == 1

    await with_manager(bus, fake, body, clock=clock, grace=60.0)


async def test_the_cli_runs_the_service_on_the_fake_nvml(bus, nats_private, tmp_path):
    ready = tmp_path / "ready"
    async with await anyio.open_process(
        [sys.executable, "-m", "phalanx_cli.main", "run", "mig-manager", "--nats", nats_private.url, "--node", NODE,
         "--nvml", "fake:H100-80GBx1", "--ready-file", str(ready)]) as proc:
        try:
            with anyio.fail_after(30):
                while not ready.exists():
                    await anyio.sleep(0.1)
            await bus.publish(S.mig_subject(NODE), prepare(profile="7g.80gb", start=0))
            [reply] = await replies(bus, 1, timeout=20)
            assert isinstance(reply, MigReady) and reply.instance_uuid.startswith("MIG-")
        finally:
            proc.terminate()
            with anyio.move_on_after(10):
                await proc.wait()


async def test_an_instance_whose_pod_gave_its_reservation_back_is_destroyed_after_the_grace(bus):
    """The pod was deleted and placement released its reservation, but no destroy came: the
    ready record no longer owns the instance."""
    fake = FakeMigNvml.of("A100-40GB")
    clock = Clock()
    ledger = await bus.kv(S.KV_LEDGER)

    async def body(manager):
        booked = Assignment(pod=POD, node=NODE, gpus=(0,), mig_profile="3g.20gb", mig_start=4)
        rev = await ledger.put(S.token(NODE), msgspec.json.encode(NodeLedger(node=NODE, allocations={
            alloc_key(POD): Allocation(gang_id="default/g", attempt=1, assignment=booked)})))
        await bus.publish(S.mig_subject(NODE), prepare())
        [ready] = await replies(bus, 1)
        assert isinstance(ready, MigReady)
        clock.now += 120
        await manager.reconcile()
        assert len(NvmlMig(fake).list_instances(0)) == 1  # still reserved: kept
        await ledger.update(S.token(NODE), msgspec.json.encode(NodeLedger(node=NODE)), last=rev)
        await manager.reconcile()
        clock.now += 61
        await manager.reconcile()
        assert NvmlMig(fake).list_instances(0) == ()
        assert await records(bus) == {}

    await with_manager(bus, fake, body, clock=clock)


async def test_an_unreadable_records_or_ledger_value_never_leads_to_a_destroy(bus):
    fake = FakeMigNvml.of("A100-40GB", 2)
    m = NvmlMig(fake)
    m.create(0, "3g.20gb", 4)  # owned by a record, once the records can be read
    m.create(1, "3g.20gb", 4)  # no record, no reservation: an orphan once both values can be read
    mig = await bus.kv(S.KV_MIG)
    mig_rev = await mig.put(S.token(NODE), b"{not a record")
    ledger = await bus.kv(S.KV_LEDGER)
    rev = await ledger.put(S.token(NODE), b"[not a ledger")
    clock = Clock()
    owner = MigRecord(node=NODE, gpu=0, start=4, profile="3g.20gb", gang_id="default/g", attempt=1, pod=POD)

    async def body(manager):
        clock.now += 120
        await manager.reconcile()
        assert [(i.gpu, i.start) for g in (0, 1) for i in m.list_instances(g)] == [(0, 4), (1, 4)]
        await ledger.update(S.token(NODE), msgspec.json.encode(NodeLedger(node=NODE)), last=rev)
        clock.now += 120
        await manager.reconcile()
        assert [(i.gpu, i.start) for g in (0, 1) for i in m.list_instances(g)] == [(0, 4), (1, 4)]
        await mig.update(S.token(NODE), msgspec.json.encode(NodeMig(node=NODE, instances={"0.4": owner})),
                         last=mig_rev)
        await manager.reconcile()
        clock.now += 61
        await manager.reconcile()
        assert [(i.gpu, i.start) for g in (0, 1) for i in m.list_instances(g)] == [(0, 4)]

    await with_manager(bus, fake, body, clock=clock, grace=60.0)
