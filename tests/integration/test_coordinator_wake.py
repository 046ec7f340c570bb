"""gang-coordinator's wake on released GPUs against a real nats-server: a gang whose attempt
was under way when GPUs came free is tried again as soon as that attempt fails, instead of
sleeping its backoff (the lost wakeup the kwok preemption benchmark found: a preemptor woken by
each of its victims' releases was placing when the last one came, and slept 51 s)."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_bus import Bus
from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.service import Config
from phalanx_gang_coordinator.store import GangStore
from phalanx_proto import subjects as S
from phalanx_proto.events import PlacementFailed, PodRef, Released, encoder
from test_coordinator_store import QuietCluster, waiting_gang

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    yield b
    await b.close()


async def driver_with_a_placing_gang(bus, name: str, failures: int) -> tuple[SagaDriver, GangStore]:
    """A driver whose gang ``t/<name>`` is placing its attempt ``failures + 1``."""
    kv = await bus.kv(S.KV_GANGS)
    await kv.create(S.gang_key(f"t/{name}"), encoder.encode(waiting_gang(name)))
    cluster = QuietCluster()
    store = GangStore(kv)
    driver = SagaDriver(bus, cluster, store, Notifier(cluster), Config())
    await driver.start(f"t/{name}")
    for attempt in range(1, failures + 1):
        await driver.on_reply(failed(name, attempt), None)
        assert await driver.wake() == [f"t/{name}"]  # GPUs released: its next attempt starts
    state, _ = await store.load(f"t/{name}")
    assert (state.phase, state.attempt) == ("placing", failures + 1)
    return driver, store


def failed(name: str, attempt: int) -> PlacementFailed:
    return PlacementFailed(gang_id=f"t/{name}", attempt=attempt, summary="0/2 nodes are available.",
                           members=(PodRef(namespace="t", name=name, uid=f"u-{name}"),))


def released() -> Released:
    return Released(gang_id="t/victim", attempt=1, pods=(PodRef(namespace="t", name="v", uid="u-v"),))


async def test_a_gang_placing_when_gpus_are_released_is_tried_again_as_soon_as_its_attempt_fails(bus):
    driver, store = await driver_with_a_placing_gang(bus, "pre", failures=7)
    await driver.on_reply(released(), None)  # placement decided attempt 8 before these GPUs came free
    await driver.on_reply(failed("pre", 8), None)
    state, _ = await store.load("t/pre")
    assert (state.phase, state.attempt, state.failures) == ("placing", 9, 8)  # not 60 s of backoff


async def test_without_a_release_during_its_attempt_a_failed_gang_waits_its_backoff(bus):
    driver, store = await driver_with_a_placing_gang(bus, "quiet", failures=0)
    await driver.on_reply(failed("quiet", 1), None)
    state, _ = await store.load("t/quiet")
    assert (state.phase, state.attempt) == ("backoff", 1)
    await driver.on_reply(released(), None)  # and a release then wakes it, as before
    state, _ = await store.load("t/quiet")
    assert (state.phase, state.attempt) == ("placing", 2)


def failed_for(name: str, attempt: int, waits_for: str) -> PlacementFailed:
    return PlacementFailed(gang_id=f"t/{name}", attempt=attempt, summary="0/2 nodes are available.",
                           members=(PodRef(namespace="t", name=name, uid=f"u-{name}"),), waits_for=waits_for,
                           fits_empty_cluster=waits_for == "gpus")


async def test_a_release_wakes_a_gang_waiting_for_gpus_but_never_one_that_fits_no_node_set(bus):
    driver, store = await driver_with_a_placing_gang(bus, "needs-gpus", failures=0)
    other, _ = await driver_with_a_placing_gang(bus, "too-big", failures=0)
    await driver.on_reply(failed_for("needs-gpus", 1, "gpus"), None)
    await driver.on_reply(failed_for("too-big", 1, "cluster"), None)
    big, _ = await store.load("t/too-big")
    assert (big.phase, big.waits_for) == ("backoff", "cluster")
    assert big.backoff_until - big.updated_at >= 225  # its timer is minutes, not seconds
    assert await driver.wake() == ["t/needs-gpus"]
    big, _ = await store.load("t/too-big")
    assert (big.phase, big.attempt) == ("backoff", 1)  # still waiting for the cluster to change
    from phalanx_rules import fairness

    states, _ = await store.all()
    assert await driver.wake_all(fairness.woken_by_cluster_change(states, now=big.updated_at + 1),
                                 "a node was added") == ["t/too-big"]
    big, _ = await store.load("t/too-big")
    assert (big.phase, big.attempt) == ("placing", 2)


async def test_a_gang_at_its_queues_limit_is_woken_by_a_release_of_its_queue_only(bus):
    kv = await bus.kv(S.KV_GANGS)
    gang = waiting_gang("capped")
    gang = msgspec.structs.replace(gang, members=tuple(msgspec.structs.replace(m, queue="team-a")
                                                        for m in gang.members))
    await kv.create(S.gang_key("t/capped"), encoder.encode(gang))
    cluster = QuietCluster()
    store = GangStore(kv)
    driver = SagaDriver(bus, cluster, store, Notifier(cluster), Config())
    await driver.start("t/capped")
    await driver.on_reply(failed_for("capped", 1, "queue"), None)
    other = Released(gang_id="t/victim", attempt=1, pods=(PodRef(namespace="t", name="v", uid="u-v"),),
                     queues=("team-b",))
    await driver.on_reply(other, None)
    assert (await store.load("t/capped"))[0].phase == "backoff"  # team-b's GPUs do not lift team-a's limit
    mine = msgspec.structs.replace(other, queues=("team-a",))
    await driver.on_reply(mine, None)
    assert (await store.load("t/capped"))[0].phase == "placing"
