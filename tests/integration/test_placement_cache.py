"""Placement's watch-fed cache against a real nats-server.

* Random sequences of topology reports, heartbeats, node states, ledger writes by another
  writer, poisoned ledger values, deletes, the clock moving on, and the cache's own assumed commits (some of
  which lose their compare-and-set) leave the cache equal to a fresh read of the buckets.
* The placement service answers requests (and a release) without reading a whole bucket:
  every JetStream API request it makes after start is counted by kind.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import anyio
import pytest

from phalanx_bus import Bus, BusAuth, KvConflict, kv_atomic_write
from phalanx_bus.records import read_all
from phalanx_engine.decide import Cluster
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_localstack.synthetic import synthetic_cluster
from phalanx_placement.cache import ClusterCache
from phalanx_placement.service import Config
from phalanx_placement.service import run as run_placement
from phalanx_proto import subjects as S
from phalanx_proto.dra import Device, DraPool, InUse, NodeSelection, Slice, pool_key
from phalanx_proto.events import (
    Assignment,
    MemberSpec,
    NodeHeartbeat,
    NodeTopologyReported,
    PlaceRequested,
    PodRef,
    Released,
    ReleaseRequested,
    Reserved,
    encoder,
    gang_decoder,
    uid_digest,
)
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key
from phalanx_topology.tiers import tiers_from_labels
from phalanx_topology_discovery.service import topology_from_file

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

STALE_S = 15.0


def reports(n: int) -> list[NodeTopologyReported]:
    return [NodeTopologyReported(
        node=node.name, topology=topology_from_file(node.topology_file, node.name, gpu_model=node.gpu_model,
                                                   gpu_memory_mib=node.gpu_memory_mib),
        tiers=tiers_from_labels(node.name, node.labels), enabled=True) for node in synthetic_cluster(f"{n}x8v100").nodes]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def fresh_views(bus: Bus, now: float) -> tuple[dict[str, NodeView], dict[str, frozenset[str]]]:
    """What placement used to read per request: the three buckets, as node views (a node
    whose ledger is unreadable left out) and, per gang, the ledger keys holding it."""
    topo, _ = await read_all(await bus.kv(S.KV_TOPOLOGY))
    beats, _ = await read_all(await bus.kv(S.KV_HEARTBEAT))
    ledgers, bad = await read_all(await bus.kv(S.KV_LEDGER))
    kube = {r.key: r.value for r in (await read_all(await bus.kv(S.KV_NODE_STATE)))[0]}
    pools = sorted((r.key, r.value) for r in (await read_all(await bus.kv(S.KV_DRA)))[0])
    at = {r.key: r.value.at for r in beats}
    led = {r.key: r for r in ledgers}
    views, gangs = {}, {}
    for r in ledgers:
        for a in r.value.allocations.values():
            gangs.setdefault(a.gang_id, set()).add(r.key)
    for r in topo:
        if r.key in {b.key for b in bad}:
            continue
        entry = led.get(r.key)
        views[r.key] = NodeView(
            name=r.value.node, topology=r.value.topology, enabled=r.value.enabled,
            fresh=r.key in at and now - at[r.key] <= STALE_S, tiers=r.value.tiers, unhealthy=r.value.unhealthy,
            allocations=tuple(a.assignment for a in entry.value.allocations.values()) if entry else (),
            revision=entry.revision if entry else 0, kube=kube.get(r.key),
            dra=tuple(p for _, p in pools if reaches(p, r.value.node)))
    return views, {g: frozenset(k) for g, k in gangs.items()}


def reaches(pool: DraPool, node: str) -> bool:
    """Does the pool concern ``node``: a slice names it, or reaches nodes by selector or all nodes?"""
    return any(s.nodes.node_name in ("", node) for s in pool.slices)


def pool(rng: random.Random, node: str) -> DraPool:
    """A DRA pool of ``node``'s GPUs (one slice, some devices held by a claim), or one reaching all nodes."""
    everywhere = rng.random() < 0.2
    devices = tuple(Device(name=f"gpu-{i}") for i in range(rng.randrange(1, 4)))
    return DraPool(driver="gpu.nvidia.com", pool="fabric" if everywhere else node,
                   slices=(Slice(name="s", nodes=NodeSelection(all_nodes=True) if everywhere else NodeSelection(
                       node_name=node), devices=devices),),
                   in_use=tuple(InUse(device=d.name, claim="t/c/u") for d in devices if rng.random() < 0.3))


def summary(cluster: Cluster) -> tuple:
    return (sorted((n, sorted(s.free_whole())) for n, s in cluster.nodes.items()),
            {k: sorted(v) for k, v in cluster.by_free.items() if v}, sorted(cluster.excluded), cluster.total)


def allocation(rng: random.Random, node: str, gang: str, gpus: tuple[int, ...], k: int) -> tuple[str, Allocation]:
    pod = PodRef(namespace="t", name=f"{gang}-{k}", uid=f"u-{gang}-{k}-{rng.randrange(10**6)}")
    return alloc_key(pod), Allocation(gang_id=gang, attempt=1, assignment=Assignment(pod=pod, node=node, gpus=gpus))


async def random_step(rng: random.Random, bus: Bus, cache: ClusterCache, reps, clock: Clock) -> str:
    kv = {b: await bus.kv(b) for b in (S.KV_TOPOLOGY, S.KV_HEARTBEAT, S.KV_LEDGER, S.KV_NODE_STATE, S.KV_DRA)}
    rep = rng.choice(reps)
    key = S.token(rep.node)
    roll = rng.random()
    if roll < 0.15:
        await kv[S.KV_TOPOLOGY].put(key, encoder.encode(
            NodeTopologyReported(node=rep.node, topology=rep.topology, tiers=rep.tiers, enabled=rng.random() < 0.8,
                                 unhealthy=tuple(sorted(rng.sample(range(8), rng.choice([0, 0, 1, 2])))))))
        return "report"
    if roll < 0.2:
        await kv[S.KV_TOPOLOGY].delete(key)
        return "report gone"
    if roll < 0.35:
        await kv[S.KV_HEARTBEAT].put(key, encoder.encode(NodeHeartbeat(node=rep.node, at=clock.now - rng.uniform(0, 25))))
        return "beat"
    if roll < 0.38:
        clock.now += rng.uniform(0, 10)
        return "clock"
    if roll < 0.48:
        if rng.random() < 0.35:
            await kv[S.KV_NODE_STATE].delete(key)
            return "node state gone"
        await kv[S.KV_NODE_STATE].put(key, encoder.encode(NodeKubeState(
            allocatable={"cpu": rng.choice([8000, 64000]), "pods": 110}, ready="True",
            unschedulable=rng.random() < 0.2)))
        return "node state"
    if roll < 0.56:
        gpus = tuple(sorted(rng.sample(range(8), rng.randrange(4))))
        allocs = dict(allocation(rng, rep.node, f"g{rng.randrange(4)}", (g,), g) for g in gpus)
        await kv[S.KV_LEDGER].put(key, encoder.encode(NodeLedger(node=rep.node, allocations=allocs)))
        return "ledger by another writer"
    if roll < 0.6:
        await kv[S.KV_LEDGER].put(key, b'{"node": 7}')
        return "poisoned ledger"
    if roll < 0.68:
        p = pool(rng, rep.node)
        dra_key = pool_key(p.driver, p.pool)
        what = rng.random()
        if what < 0.2:
            await kv[S.KV_DRA].delete(dra_key)
            return "pool gone"
        if what < 0.3:
            await kv[S.KV_DRA].put(dra_key, b'{"driver": 7}')
            return "poisoned pool"
        await kv[S.KV_DRA].put(dra_key, encoder.encode(p))
        return "pool"
    # The cache's own commits: one to three, each assumed before it is sent; some lose.
    commits = []
    for _ in range(rng.randrange(1, 4)):
        rep = rng.choice(reps)
        key = S.token(rep.node)
        if key in cache.ledger.poisoned:
            continue
        ledger = cache.ledger_of(key) or NodeLedger(node=rep.node)
        used = {g for a in ledger.allocations.values() for g in a.assignment.gpus}
        free = [g for g in range(8) if g not in used]
        if not free:
            continue
        k, a = allocation(rng, rep.node, f"g{rng.randrange(4)}", (rng.choice(free),), rng.randrange(10**6))
        commits.append(cache.assume({key: NodeLedger(node=rep.node, allocations={**ledger.allocations, k: a})}))
    if commits and rng.random() < 0.3:  # another writer gets in first
        first = next(iter(commits[0].writes))
        led = commits[0].writes[first]
        await kv[S.KV_LEDGER].put(first, encoder.encode(NodeLedger(node=led.node)))
    lost = False
    for commit in commits:
        try:
            last = await kv_atomic_write(bus, S.KV_LEDGER, await cache.expected(commit))
        except KvConflict:
            cache.forget(commit)
            lost = True
        else:
            cache.settle(commit, last)
    return "own commits, one lost" if lost else "own commits"


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_changes_leave_the_cache_equal_to_a_fresh_read_of_the_buckets(nats_private, seed):
    rng = random.Random(seed)
    bus = await Bus.connect(nats_private.url, service="cache-test")
    await bus.declare()
    reps = reports(12)
    clock = Clock()
    cache = ClusterCache(bus, stale_s=STALE_S, clock=clock, node_state_policy="optional")
    try:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                await tg.start(cache.run)
                kinds = Counter()
                seen: tuple[dict, int] | None = None
                for step in range(200):
                    kinds[await random_step(rng, bus, cache, reps, clock)] += 1
                    if step % 20 == 19:
                        for m in cache.mirrors:
                            await m.catch_up()
                        cache.refresh()
                        views, gangs = await fresh_views(bus, clock.now)
                        assert cache.views == views
                        fresh = Cluster.from_snapshot(Snapshot(nodes=tuple(views.values())))
                        assert summary(cache.cluster) == summary(fresh)
                        assert {g: cache.gang_keys(g) for g in gangs} == gangs
                        assert not cache._assumed, "every settled commit is echoed, every failed one forgotten"
                        # The what-if answers placement keeps are keyed by the generation: it moves
                        # whenever a view does, and stands still when nothing changed.
                        generation = cache.generation
                        cache.refresh()
                        assert cache.generation == generation
                        if seen is not None and seen[0] != views:
                            assert generation != seen[1]
                        seen = (views, generation)
                tg.cancel_scope.cancel()
        assert len(kinds) >= 12, kinds  # "pool gone" may not come up in 200 steps
    finally:
        await bus.close()


# -- the request path reads no bucket -------------------------------------------------------------

WHOLE = ("listing", "watch")


def kind_of(subject: str, payload: bytes) -> str:
    """The kind of KV read a JetStream API request is."""
    if subject.startswith("$JS.API.STREAM.INFO.KV_"):
        return "listing" if b"subjects_filter" in (payload or b"") else "stream info"
    if subject.startswith("$JS.API.CONSUMER.CREATE.KV_"):
        return "watch"
    if subject.startswith("$JS.API.STREAM.MSG.GET.KV_") and b"last_by_subj" in (payload or b"") \
            and b"*" in (payload or b""):
        return "catch-up"  # a filtered mirror asking where its keys end (one message's header)
    if subject.startswith(("$JS.API.DIRECT.GET.KV_", "$JS.API.STREAM.MSG.GET.KV_")):
        return "one key"
    return "other"


async def test_placement_answers_requests_and_releases_without_reading_a_whole_bucket(nats_private, bus_secrets):
    admin = await Bus.connect(nats_private.url, service="test")
    await admin.declare()
    reps = reports(40)
    for r in reps:
        await (await admin.kv(S.KV_TOPOLOGY)).put(S.token(r.node), encoder.encode(r))
        await (await admin.kv(S.KV_HEARTBEAT)).put(S.token(r.node), encoder.encode(
            NodeHeartbeat(node=r.node, at=time.time())))
    me = await Bus.connect(nats_private.url, service="placement",
                           auth=BusAuth.from_env(bus_secrets.env(S.PLACEMENT)))
    counted: Counter = Counter()
    counting = False
    original = me.nc.request

    async def request(subject, payload=b"", *args, **kw):
        if counting:
            counted[kind_of(subject, payload)] += 1
        return await original(subject, payload, *args, **kw)

    me.nc.request = request
    replies = []

    async def on_reply(msg):
        replies.extend(c.event for c in gang_decoder.decode(msg.data).events)

    sub = await admin.nc.subscribe("phx.gang.coord.answers.>", cb=on_reply)
    gangs = await admin.kv(S.KV_GANGS)
    try:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                requests, first = [], None
                for k in range(30):
                    pod = PodRef(namespace="t", name=f"p{k}", uid=f"uid-{k}")
                    members = (MemberSpec(pod=pod, gpus=1 + k % 3),)
                    await gangs.put(S.gang_key(f"t/p{k}"), encoder.encode(GangState(
                        gang_id=f"t/p{k}", phase="placing", attempt=1, members=members)))
                    requests.append(PlaceRequested(gang_id=f"t/p{k}", attempt=1, members_digest=uid_digest([pod])))
                    first = first or members
                for ev in requests:  # all waiting before placement starts: its first cycle takes them together
                    await admin.publish(S.placement_subject(ev.gang_id), ev)
                await tg.start(lambda task_status: run_placement(me, Config(heartbeat_stale_s=600),
                                                                 task_status=task_status))
                counting = True
                while sum(isinstance(r, Reserved) for r in replies) < len(requests):
                    await anyio.sleep(0.05)
                await gangs.put(S.gang_key("t/p0"), encoder.encode(GangState(
                    gang_id="t/p0", phase="backoff", attempt=1, members=first)))
                await admin.publish(S.placement_subject("t/p0"), ReleaseRequested(
                    gang_id="t/p0", attempt=1, pods=(first[0].pod,), reason="test"))
                while not any(isinstance(r, Released) for r in replies):
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        assert sum(isinstance(r, Reserved) for r in replies) == 30
        assert {k: counted[k] for k in WHOLE} == {"listing": 0, "watch": 0}, counted
        ledger = {r.key: r.value for r in (await read_all(await admin.kv(S.KV_LEDGER), pattern="*"))[0]}
        used = [(led.node, g) for led in ledger.values() for a in led.allocations.values() for g in a.assignment.gpus]
        assert len(used) == len(set(used)) == sum(1 + k % 3 for k in range(1, 30))  # t/p0 released
        # The only single-key reads: the delete-marker lookup of a node's first ledger write.
        assert counted["one key"] <= len(ledger), counted
        assert not any(a.gang_id == "t/p0" for led in ledger.values() for a in led.allocations.values())
    finally:
        await sub.unsubscribe()
        await me.close()
        await admin.close()


async def test_requests_decided_in_one_cycle_see_each_others_assumed_gpus(nats_private):
    """Twenty requests wait before the cycle starts, so one cycle decides them all on one view:
    each decision is assumed before the next, so none gets a GPU another one got."""
    from phalanx_placement.cycle_queue import Waiting
    from phalanx_placement.service import Placement

    bus = await Bus.connect(nats_private.url, service="test")
    await bus.declare()
    for r in reports(3):
        await (await bus.kv(S.KV_TOPOLOGY)).put(S.token(r.node), encoder.encode(r))
        await (await bus.kv(S.KV_HEARTBEAT)).put(S.token(r.node), encoder.encode(
            NodeHeartbeat(node=r.node, at=time.time())))
    replies = []

    async def on_reply(msg):
        replies.extend(c.event for c in gang_decoder.decode(msg.data).events)

    sub = await bus.nc.subscribe("phx.gang.coord.answers.>", cb=on_reply)
    cache = ClusterCache(bus, stale_s=600)
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                await tg.start(cache.run)
                placement = Placement(bus, cache, Config(cycle_max=64))
                waiting = []
                for k in range(20):
                    members = (MemberSpec(pod=PodRef(namespace="t", name=f"c{k}", uid=f"c-{k}"), gpus=1 + k % 2),)
                    await (await bus.kv(S.KV_GANGS)).put(S.gang_key(f"t/c{k}"), encoder.encode(GangState(
                        gang_id=f"t/c{k}", phase="placing", attempt=1, members=members)))
                    w = Waiting(ev=PlaceRequested(gang_id=f"t/c{k}", attempt=1,
                                                  members_digest=uid_digest(m.pod for m in members)), priority=0,
                                arrival=k)
                    placement.queue.put(w)
                    waiting.append(w)
                await cache.gangs.catch_up()
                await tg.start(placement.answers.run)
                tg.start_soon(placement.run_cycles)
                for w in waiting:
                    await w.done.wait()
                while len(replies) < len(waiting):
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        assert all(w.error is None for w in waiting)
        placed = [r for r in replies if isinstance(r, Reserved)]
        ledger = [r.value for r in (await read_all(await bus.kv(S.KV_LEDGER), pattern="*"))[0]]
        used = [(led.node, g) for led in ledger for a in led.allocations.values() for g in a.assignment.gpus]
        assert len(placed) == 16 and len(used) == len(set(used)) == 24  # 3 nodes x 8 GPUs: the last four wait
    finally:
        await sub.unsubscribe()
        await bus.close()
