"""gang-coordinator's store against a real nats-server: an attempt starts with one
compare-and-set (its trace id in the same write), and the resync's view of every gang comes
from a watch-fed mirror, not from reading the bucket each tick."""

from __future__ import annotations

import anyio
import pytest

from phalanx_bus import Bus, KvMirror
from phalanx_gang_coordinator.driver import SagaDriver
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.service import Config
from phalanx_gang_coordinator.store import GangStore
from phalanx_proto import subjects as S
from phalanx_proto.events import MemberSpec, PodRef, encoder
from phalanx_proto.state import GangState

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


class CountingKv:
    """A ``Kv`` that counts what is asked of it."""

    def __init__(self, kv) -> None:
        self._kv = kv
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):
        inner = getattr(self._kv, name)
        if not callable(inner):
            return inner

        def counted(*args, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return inner(*args, **kw)
        return counted


class QuietCluster:
    """The cluster port calls an attempt start may make (pod events and conditions), recorded."""

    def __init__(self) -> None:
        self.told = []

    async def record_event(self, ref, **kw) -> None:
        self.told.append((str(ref), kw.get("reason")))

    async def set_scheduled_condition(self, ref, **kw) -> None:
        self.told.append((str(ref), kw.get("reason")))


def waiting_gang(name: str) -> GangState:
    return GangState(gang_id=f"t/{name}", phase="waiting", min_member=1,
                     members=(MemberSpec(pod=PodRef(namespace="t", name=name, uid=f"u-{name}"), gpus=1),))


@pytest.fixture
async def bus(nats_private):
    b = await Bus.connect(nats_private.url, service="test")
    await b.declare()
    yield b
    await b.close()


async def test_an_attempt_starts_with_one_compare_and_set_that_carries_its_trace_id(bus):
    kv = CountingKv(await bus.kv(S.KV_GANGS))
    await kv.create(S.gang_key("t/a"), encoder.encode(waiting_gang("a")))
    kv.calls.clear()
    cluster = QuietCluster()
    driver = SagaDriver(bus, cluster, GangStore(kv), Notifier(cluster), Config())
    await driver.start("t/a")
    state, _ = await GangStore(await bus.kv(S.KV_GANGS)).load("t/a")
    assert (state.phase, state.attempt, len(state.trace_id)) == ("placing", 1, 32)
    assert {k: v for k, v in kv.calls.items() if k in ("create", "update", "put", "delete")} == {"update": 1}


async def test_an_incomplete_gang_is_not_written_at_all(bus):
    kv = CountingKv(await bus.kv(S.KV_GANGS))
    await kv.create(S.gang_key("t/b"), encoder.encode(GangState(gang_id="t/b", phase="waiting", min_member=2)))
    kv.calls.clear()
    cluster = QuietCluster()
    await SagaDriver(bus, cluster, GangStore(kv), Notifier(cluster), Config()).start("t/b")
    assert {k: v for k, v in kv.calls.items() if k in ("create", "update", "put", "delete")} == {}


async def test_every_gang_comes_from_the_mirror_and_current_includes_the_latest_write(bus):
    raw = await bus.kv(S.KV_GANGS)
    for name in ("c", "d"):
        await raw.create(S.gang_key(f"t/{name}"), encoder.encode(waiting_gang(name)))
    await raw.put("t.poisoned", b"not json")
    kv = CountingKv(raw)
    store = GangStore(kv, KvMirror.of_bucket(bus, S.KV_GANGS))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            kv.calls.clear()
            await raw.create(S.gang_key("t/e"), encoder.encode(waiting_gang("e")))
            good, bad = await store.all(current=True)
            assert sorted(s.gang_id for s in good) == ["t/c", "t/d", "t/e"]
            assert [(b.bucket, b.key) for b in bad] == [(S.KV_GANGS, "t.poisoned")]
            for _ in range(5):  # resync ticks
                await store.all()
            tg.cancel_scope.cancel()
    assert kv.calls == {}, "no key listed or read: the mirror answered"


async def test_a_gang_written_here_is_read_back_without_a_kv_read_until_a_change_from_elsewhere_shows(bus):
    raw = await bus.kv(S.KV_GANGS)
    kv = CountingKv(raw)
    store = GangStore(kv, KvMirror.of_bucket(bus, S.KV_GANGS))
    key = S.gang_key("t/f")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(store.run)
            await store.transition("t/f", lambda s: waiting_gang("f"))
            kv.calls.clear()
            for reason in ("one", "two", "three"):
                await store.transition("t/f", lambda s, r=reason: GangState(**{
                    **{f: getattr(s, f) for f in s.__struct_fields__}, "reason": r}))
            assert ((await store.get("t/f")).reason, kv.calls) == ("three", {"update": 3})
            # Another writer (a repair, an attacker) changes the key: once the mirror shows the
            # later revision, the store reads the key again instead of trusting its copy.
            rev = await raw.put(key, encoder.encode(GangState(**{
                **{f: getattr(waiting_gang("f"), f) for f in GangState.__struct_fields__}, "reason": "elsewhere"})))
            await store.mirror.wait_for(rev)
            assert (await store.get("t/f")).reason == "elsewhere"
            await raw.put(key, b"not json")
            await store.mirror.catch_up()
            assert await store.get("t/f") is None  # unreadable now: read-only checks see nothing
            tg.cancel_scope.cancel()
    assert kv.calls.get("get", 0) == 2, kv.calls


async def test_a_stale_copy_costs_one_conflict_and_the_change_is_applied_to_the_newest_state(bus):
    raw = await bus.kv(S.KV_GANGS)
    store = GangStore(raw)  # no mirror: the kept copy cannot learn of the other write
    await store.transition("t/g", lambda s: waiting_gang("g"))
    state, rev = await store.load("t/g")
    await raw.update(S.gang_key("t/g"), encoder.encode(GangState(**{
        **{f: getattr(state, f) for f in state.__struct_fields__}, "reason": "elsewhere"})), last=rev)
    seen = []

    def change(s):
        seen.append(s.reason)
        return GangState(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "min_member": 3})

    t = await store.transition("t/g", change)
    assert (seen, t.after.reason, t.after.min_member) == (["", "elsewhere"], "elsewhere", 3)
    assert (await GangStore(raw).load("t/g"))[0].reason == "elsewhere"
