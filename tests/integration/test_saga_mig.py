"""The MIG step of the saga: gang-coordinator (in-process, real nats-server) asks the node for
every MIG instance, waits until every one is recorded ready in ``phx-mig``, then asks binder
for the members (binder reads each instance from ``phx-mig`` itself); a ``MigFailed``
rolls the attempt back (destroy the attempt's instances, release the reservation). Placement
and mig-manager are played by the test, so only the coordinator's side is under test."""

from __future__ import annotations

import anyio
import pytest

from phalanx_bus import Bus
from phalanx_gang_coordinator.service import Config, run
from phalanx_kube.kvcluster import KvCluster
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    Assignment,
    GangBatch,
    MigFailed,
    MigReady,
    Reserved,
    batch_of,
    encoder,
    gang_decoder,
    node_decoder,
    uid_digest,
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
from stackutil import gang_states, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GANG = "default/JobSet:mig"


def mig_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"jobset.sigs.k8s.io/jobset-name": "mig", "aliyun.com/min-member": "2"}},
            "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x", "resources": {
                "limits": {"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "20"}}}]}}


async def last(bus: Bus, stream: str, subject: str, decoder, kind: str = ""):
    """The latest event on ``subject`` (of type ``kind`` if given), waiting for it (it is
    published just after the state write the test waited for). Read back from the stream's
    newest messages, not only its last one: the gang may already have gone on (a retry after
    its backoff publishes on the same subject)."""
    async def get():
        try:
            info = await bus.js.stream_info(stream)
        except Exception:  # noqa: BLE001 - not there yet
            return None
        top, bottom = info.state.last_seq, max(info.state.first_seq, info.state.last_seq - 200)
        for seq in range(top, bottom - 1, -1):
            try:
                msg = await bus.js.get_msg(stream, seq)
            except Exception:  # noqa: BLE001 - a message removed meanwhile
                continue
            if not _matches(subject, msg.subject):
                continue
            ev = decoder.decode(msg.data)
            for e in reversed([x.event for x in ev.events] if isinstance(ev, GangBatch) else [ev]):
                if not kind or type(e).__name__ == kind:
                    return e
        return None

    return await wait_until(get, 10)


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    p, t = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(t) > i
        if i >= len(t) or (tok != "*" and tok != t[i]):
            return False
    return len(p) == len(t)


async def mig_ready(bus: Bus, attempt: int, pod, gpu: int, uuid: str, msg_id: str | None = None) -> None:
    """As mig-manager does: the instance is recorded ready in phx-mig before the reply (the
    coordinator checks)."""
    record = MigRecord(node="a100", gpu=gpu, start=4, profile="3g.20gb", gang_id=GANG, attempt=attempt, pod=pod,
                       state="ready", uuid=uuid)
    kv = await bus.kv(S.KV_MIG)
    entry = await kv.get("a100")
    book = node_mig_decoder.decode(entry.value) if entry is not None else NodeMig(node="a100")
    await kv.put("a100", encoder.encode(NodeMig(node="a100", instances={**book.instances, mig_slot(gpu, 4): record})))
    await bus.publish(S.node_reply_subject("a100"), MigReady(
        node="a100", gang_id=GANG, attempt=attempt, pod=pod, instance_uuid=uuid), msg_id=msg_id)


async def placed_gang(nats_private):
    bus = await Bus.connect(nats_private.url, service="test")
    await bus.declare()
    sim = await KvCluster.open(bus)
    return bus, sim


async def start_and_place(bus, sim, tg):
    await tg.start(lambda task_status: run(bus, sim, Config(resync_s=0.3, redrive_after_s=30),
                                           task_status=task_status))
    pods = [await sim.apply_pod(mig_pod(f"m{i}")) for i in range(2)]

    async def placing():
        s = (await gang_states(bus)).get(GANG)
        return s if s is not None and s.phase == "placing" else None

    s = await wait_until(placing, 15)
    assignments = tuple(Assignment(pod=p.ref, node="a100", gpus=(i,), mig_profile="3g.20gb", mig_start=4)
                        for i, p in enumerate(pods))
    # As placement does: the reservation is in the ledger before the reply (the coordinator checks).
    ledger = NodeLedger(node="a100", allocations={
        alloc_key(a.pod): Allocation(gang_id=GANG, attempt=s.attempt, assignment=a) for a in assignments})
    await (await bus.kv(S.KV_LEDGER)).put(S.token("a100"), encoder.encode(ledger))
    await bus.publish(S.placement_answers_subject("test"), batch_of("test", Reserved(
        gang_id=GANG, attempt=s.attempt, members_digest=uid_digest(p.ref for p in pods))))

    async def preparing():
        st = (await gang_states(bus)).get(GANG)
        return st if st.phase == "preparing" else None

    return await wait_until(preparing, 15), pods


async def test_every_mig_instance_is_prepared_before_binding_and_its_uuid_is_bound(nats_private):
    bus, sim = await placed_gang(nats_private)
    try:
        async with anyio.create_task_group() as tg:
            state, pods = await start_and_place(bus, sim, tg)
            cmd = await last(bus, S.STREAM_NODE, S.mig_subject("a100"), node_decoder, "MigPrepareRequested")
            assert (cmd.node, cmd.gang_id, cmd.profile, cmd.start) == ("a100", GANG, "3g.20gb", 4)
            # A MigReady nobody recorded (forged) changes nothing.
            await bus.publish(S.node_reply_subject("a100"), MigReady(
                node="a100", gang_id=GANG, attempt=state.attempt, pod=pods[1].ref, instance_uuid="MIG-forged"),
                msg_id="forged")
            await mig_ready(bus, state.attempt, pods[0].ref, 0, "MIG-0")
            await mig_ready(bus, state.attempt, pods[0].ref, 0, "MIG-0", msg_id="dup")  # a duplicate reply: no change
            await anyio.sleep(1)
            assert (await gang_states(bus))[GANG].phase == "preparing"
            await mig_ready(bus, state.attempt, pods[1].ref, 1, "MIG-1")

            async def binding():
                st = (await gang_states(bus))[GANG]
                return st if st.phase == "binding" else None

            await wait_until(binding, 15)
            # The coordinator sends binder its commands in its replica's batches.
            bind = await last(bus, S.STREAM_GANG, S.CHANNEL["gangBinderBatch"].template.replace("{replica}", "*"),
                              gang_decoder, "BindPods")
            assert bind.pods == tuple(p.ref for p in pods)
            tg.cancel_scope.cancel()
    finally:
        await bus.close()


async def test_a_failed_mig_instance_rolls_back_destroying_instances_and_releasing(nats_private):
    bus, sim = await placed_gang(nats_private)
    try:
        async with anyio.create_task_group() as tg:
            state, pods = await start_and_place(bus, sim, tg)
            await bus.publish(S.node_reply_subject("a100"), MigFailed(
                node="a100", gang_id=GANG, attempt=state.attempt, pod=pods[1].ref, reason="no free slot"))

            async def backoff():
                st = (await gang_states(bus))[GANG]
                return st if st.phase == "backoff" else None

            st = await wait_until(backoff, 15)
            assert st.reason == "MIG instance for default/m1 on a100 failed: no free slot"
            assert st.rollback_done == ("unbind", "claims", "mig", "release")
            destroy = await last(bus, S.STREAM_NODE, S.mig_subject("a100"), node_decoder, "MigDestroyRequested")
            assert destroy.attempt == state.attempt
            release = await last(bus, S.STREAM_GANG, S.placement_subject(GANG), gang_decoder, "ReleaseRequested")
            assert release.attempt == state.attempt
            events = await sim.list_events(pods[0].ref)
            assert any("no free slot" in e.message for e in events)
            tg.cancel_scope.cancel()
    finally:
        await bus.close()
