"""The bus on a real three-server JetStream cluster (loopback, auth and TLS on, R3 streams and
buckets): the ledger's atomic batch commits whole or not at all, the saga's deadline arrives as
a scheduled message, and both keep working when the leader of their stream is SIGKILLed."""

from __future__ import annotations

import time

import anyio
import pytest

from phalanx_bus import Bus, KvConflict, kv_atomic_write
from phalanx_localstack.natsserver import NatsCluster
from phalanx_proto import events as E
from phalanx_proto import subjects as S

pytestmark = pytest.mark.anyio


@pytest.fixture
def cluster(tmp_path, bus_secrets):
    c = NatsCluster(tmp_path / "cluster", 3, security=bus_secrets)
    c.start()
    yield c
    c.close()


@pytest.fixture
async def bus(cluster):
    b = await Bus.connect(cluster.url, service="test")
    with anyio.fail_after(120):
        await b.declare(replicas=3)
    yield b
    await b.close()


async def leader(bus: Bus, stream: str) -> str:
    return (await bus.js.stream_info(stream)).cluster.leader


async def replicas_current(bus: Bus, stream: str) -> bool:
    info = await bus.js.stream_info(stream)
    peers = info.cluster.replicas or []
    return info.cluster.leader is not None and len(peers) == 2 and all(p.current for p in peers)


async def wait_for(predicate, timeout: float = 60.0):
    with anyio.fail_after(timeout):
        while True:
            try:
                if await predicate():
                    return
            except Exception:  # noqa: BLE001 - the cluster is electing a leader
                pass
            await anyio.sleep(0.3)


async def test_streams_and_buckets_are_declared_with_three_replicas(bus):
    names = [s.name for s in S.STREAMS] + [f"KV_{b.name}" for b in S.BUCKETS]
    got = {n: (await bus.js.stream_info(n)).config.num_replicas for n in names}
    assert got == dict.fromkeys(names, 3)
    assert (await bus.js.stream_info(f"KV_{S.KV_LEDGER}")).config.allow_atomic


async def test_the_atomic_batch_commits_whole_or_not_at_all_and_survives_its_leader_being_killed(cluster, bus):
    kv = await bus.kv(S.KV_LEDGER)
    r1 = await kv.create("n1", b"one")
    await kv_atomic_write(bus, S.KV_LEDGER, [("n1", b"one'", r1), ("n2", b"two", 0), ("n3", b"three", 0)])
    with pytest.raises(KvConflict):
        await kv_atomic_write(bus, S.KV_LEDGER, [("n2", b"stale", r1), ("n3", b"three'", 0)])
    assert {e.key: e.value for e in await kv.items()} == {"n1": b"one'", "n2": b"two", "n3": b"three"}

    victim = cluster.server(await leader(bus, f"KV_{S.KV_LEDGER}"))
    victim.stop(kill=True)

    async def committed():
        n1, n4 = await kv.get("n1"), await kv.get("n4")
        if n1.value == b"after" and n4 is not None:
            return True  # an earlier try committed, only its answer was lost in the failover
        await kv_atomic_write(bus, S.KV_LEDGER, [("n1", b"after", n1.revision), ("n4", b"four", 0)], timeout_s=2)
        return True

    await wait_for(committed)
    assert await leader(bus, f"KV_{S.KV_LEDGER}") != victim.name
    victim.start()
    await wait_for(lambda: replicas_current(bus, f"KV_{S.KV_LEDGER}"))
    assert {e.key: e.value for e in await kv.items()} == {"n1": b"after", "n2": b"two", "n3": b"three",
                                                         "n4": b"four"}


async def test_a_scheduled_deadline_fires_after_its_streams_leader_is_killed(cluster, bus):
    gang = "default/cluster-deadline"
    victim = cluster.server(await leader(bus, S.STREAM_DEADLINE))
    at = time.time() + 4
    await bus.publish_scheduled(S.deadline_schedule_subject(gang), E.GangDeadline(gang_id=gang, attempt=2),
                                at=at, target=S.deadline_fired_subject(gang))
    victim.stop(kill=True)
    fired = {}

    async def stored():  # the server published it into the stream (gang-coordinator's durable reads it there)
        msg = await bus.js.get_last_msg(S.STREAM_DEADLINE, S.deadline_fired_subject(gang))
        fired["event"], fired["at"] = E.gang_decoder.decode(msg.data), time.time()
        return True

    await wait_for(stored, 90)
    assert (fired["event"], fired["at"] >= at - 1) == (E.GangDeadline(gang_id=gang, attempt=2), True)
    victim.start()
    await wait_for(lambda: replicas_current(bus, S.STREAM_DEADLINE))
