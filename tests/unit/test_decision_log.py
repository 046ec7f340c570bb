"""placement's decision log and its replay (``phalanx_placement.recorder``,
``phalanx_sim.replay``): a log recorded from a cluster that changes between decisions replays
to the same answers, every one; a decision that is not what the engine decides is named with
both answers; a log read after a gap waits for the next base; big bases are split; a failed
publish starts again from a base."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import replace

import anyio
import anyio.lowlevel
import msgspec
import pytest
from engine_builders import node, pod

from phalanx_engine.decide import DEFAULT_PROFILE, decide
from phalanx_engine.snapshot import Decision
from phalanx_placement import recorder as R
from phalanx_placement.recorder import JournaledCluster, Recorder
from phalanx_proto.events import (
    Assignment,
    DecisionsRecorded,
    RecordedDecision,
    RecordedNode,
    decisions_decoder,
    encoder,
)
from phalanx_sim.replay import Replay

pytestmark = pytest.mark.anyio


class FakeBus:
    """Keeps what is published, as the wire carries it; ``fail`` raises on that many publishes."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.fail = 0

    async def publish(self, subject, event, **kw) -> int:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("nats-server is restarting")
        self.sent.append(encoder.encode(event))
        return len(self.sent)

    def records(self) -> list[DecisionsRecorded]:
        return [decisions_decoder.decode(b) for b in self.sent]


def views(rng: random.Random, n: int):
    """``n`` V100 nodes in HyperNodes of 4, some GPUs already taken at random."""
    out = []
    for i in range(n):
        b = node(f"n{i:02d}").gpus(8).tiers(hypernode=f"hn{i // 4}", leaf="leaf0", netpod="pod0")
        out.append(b.busy(*rng.sample(range(8), rng.randrange(0, 8))).view())
    return out


async def run_cycles(bus: FakeBus, rng: random.Random, *, cycles: int, nodes: int = 12,
                     between=None, coalesce_s: float = 0.0) -> tuple[Recorder, int]:
    """A placement-like loop: the cluster changes (nodes taken, freed, going stale, leaving and
    coming back), then a cycle of decisions, each assumed into the cluster before the next."""
    cluster = JournaledCluster(nodes={}, total=0)
    for v in views(rng, nodes):
        cluster.upsert(v)
    rec = Recorder(bus, cluster, replica="p1", clock=lambda: 0.0, coalesce_s=coalesce_s)  # type: ignore[arg-type]
    made = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        for cycle in range(cycles):
            for _ in range(rng.randrange(0, 4)):
                name = f"n{rng.randrange(nodes):02d}"
                roll = rng.random()
                if roll < 0.15:
                    cluster.remove(name)
                elif roll < 0.3:
                    cluster.upsert(node(name).gpus(8).tiers(hypernode="hn9", leaf="leaf0", netpod="pod0").stale().view())
                elif roll < 0.4:  # a new topology report: half its GPUs gone
                    cluster.upsert(node(name).gpus(4).tiers(hypernode=f"hn{int(name[1:]) // 4}", leaf="leaf0",
                                                            netpod="pod0").view())
                else:
                    cluster.upsert(node(name).gpus(8).tiers(hypernode=f"hn{int(name[1:]) // 4}", leaf="leaf0",
                                                            netpod="pod0").busy(*rng.sample(range(8), rng.randrange(8))).view())
            for d in range(rng.randrange(1, 4)):
                size, gpus = rng.choice([(1, 1), (1, 2), (2, 4), (4, 8), (3, 2)])
                members = tuple(pod(f"c{cycle}-{d}-{i}").gpus(gpus).spec() for i in range(size))
                avoid = frozenset(rng.sample(sorted(cluster.views), 1)) if rng.random() < 0.2 else frozenset()
                result = decide(cluster, members, DEFAULT_PROFILE, avoid=avoid)
                rec.decided(f"ns/g{cycle}-{d}", 1, members, node_state_required=False, avoid=avoid, result=result)
                made += 1
                if isinstance(result, Decision):  # assumed before the next decision, as the cache does
                    for name in sorted({a.node for a in result.assignments}):
                        v = cluster.views[name]
                        cluster.upsert(replace(v, allocations=v.allocations + tuple(
                            a for a in result.assignments if a.node == name)))
            rec.flush()
            if between is not None:
                between(cycle, rec)
            await anyio.lowlevel.checkpoint()
        while rec._receive.statistics().current_buffer_used:
            await anyio.lowlevel.checkpoint()
        await anyio.sleep(3 * coalesce_s)  # the sender's last wait
        await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    return rec, made


def replayed(records) -> Replay:
    r = Replay()
    for rec in records:
        r.feed(rec)
    return r


@pytest.mark.parametrize("seed", range(6))
async def test_a_replayed_log_agrees_with_every_decision_it_recorded(seed):
    bus = FakeBus()
    _, made = await run_cycles(bus, random.Random(seed), cycles=40)
    records = bus.records()
    r = replayed(records)
    one = r.replicas["p1"]
    assert (r.differences, one.decisions, one.not_replayable, one.gaps, records[0].base) == ([], made, 0, 0, True)
    # something was placed and something did not fit, or the test proves little
    decisions = [i for rec in records for i in rec.items if isinstance(i, RecordedDecision)]
    assert any(d.placed for d in decisions) and any(d.no_fit for d in decisions)


async def test_a_decision_the_engine_would_not_make_is_named_with_both_answers():
    bus = FakeBus()
    await run_cycles(bus, random.Random(7), cycles=20)
    records = bus.records()
    at, record = next((i, rec) for i, rec in enumerate(records)
                      if any(isinstance(d, RecordedDecision) and d.placed for d in rec.items))
    k, item = next((k, d) for k, d in enumerate(record.items) if isinstance(d, RecordedDecision) and d.placed)
    forged = msgspec.structs.replace(item, placed=(msgspec.structs.replace(item.placed[0], gpus=(99,)),)
                                     + item.placed[1:])
    records[at] = msgspec.structs.replace(record, items=record.items[:k] + (forged,) + record.items[k + 1:])
    diffs = replayed(records).differences
    assert [(d.seq, d.gang_id) for d in diffs] == [(record.seq, item.gang_id)]
    assert "[99]" in diffs[0].recorded and "[99]" not in diffs[0].replayed


async def test_after_a_gap_nothing_is_replayed_until_the_next_base():
    bus = FakeBus()
    starts = []

    def base_now(cycle, rec):
        if cycle == 15:  # as after a lost record: the recorder starts again from a base
            rec._needs_base = True
            starts.append(cycle)

    await run_cycles(bus, random.Random(3), cycles=30, between=base_now)
    records = bus.records()
    bases = [i for i, rec in enumerate(records) if rec.base]
    assert len(bases) == 2 and bases[1] > 5
    lost = bases[1] - 3
    kept = records[:lost] + records[lost + 1:]
    r = replayed(kept).replicas["p1"]
    skipped = sum(isinstance(i, RecordedDecision) for rec in records[lost + 1:bases[1]] for i in rec.items)
    assert (r.gaps, r.not_replayable, r.differences) == (1, skipped, [])
    assert r.agree == r.decisions - skipped > 0


async def test_a_log_read_from_the_middle_waits_for_a_base():
    bus = FakeBus()
    await run_cycles(bus, random.Random(4), cycles=10)
    r = replayed(bus.records()[3:]).replicas["p1"]
    assert r.agree == 0 and r.not_replayable == r.decisions > 0 and r.differences == []


async def test_a_base_too_big_for_one_message_is_split_and_replays(monkeypatch):
    monkeypatch.setattr(R, "MAX_RECORD_BYTES", 40_000)  # a V100 node with its topology is ~9 kB of JSON
    bus = FakeBus()
    _, made = await run_cycles(bus, random.Random(5), cycles=10, nodes=24)
    records = bus.records()
    assert max(len(b) for b in bus.sent) <= 40_000 + 12_000  # one node more than the budget at most
    assert [rec.base for rec in records[:3]] == [True, False, False]
    assert [rec.seq for rec in records] == list(range(1, len(records) + 1))
    r = replayed(records)
    assert (r.differences, r.decisions) == ([], made)


async def test_a_node_topology_is_carried_once_until_it_changes():
    bus = FakeBus()
    await run_cycles(bus, random.Random(6), cycles=30)
    later = [i for rec in bus.records()[1:] for i in rec.items if not isinstance(i, RecordedDecision) and not i.removed]
    assert later and all(("topology" in i.same) == (i.topology is None) for i in later)
    assert sum("topology" in i.same for i in later) > len(later) / 2


async def test_a_failed_publish_starts_again_from_a_base_and_the_replay_agrees():
    bus = FakeBus()

    def fail_once(cycle, rec):
        if cycle == 12:
            bus.fail = 1

    _, made = await run_cycles(bus, random.Random(8), cycles=30, between=fail_once)
    records = bus.records()
    assert sum(rec.base for rec in records) == 2
    r = replayed(records).replicas["p1"]
    # the failed record's seq is missing, and what it carried is lost; from the base on, all agree
    assert (r.differences, r.gaps) == ([], 1) and r.decisions < made and r.agree == r.decisions - r.not_replayable > 0


async def test_cycles_close_together_go_out_as_one_record_and_replay_the_same():
    bus = FakeBus()
    _, made = await run_cycles(bus, random.Random(9), cycles=25, coalesce_s=0.05)
    records = bus.records()
    assert len(records) < 25 / 2  # 25 cycles, decided at once, in a record or two
    r = replayed(records)
    assert (r.differences, r.decisions) == ([], made)


def test_assignments_survive_the_wire_whole():
    a = Assignment(pod=pod("x").spec().pod, node="n1", gpus=(0, 1), nics=("mlx5_0",), rdma_level="numa")
    item = RecordedDecision(gang_id="ns/x", placed=(a,))
    rec = decisions_decoder.decode(encoder.encode(DecisionsRecorded(replica="p", items=(item,))))
    assert rec.items == (item,)


def test_the_sender_writes_exactly_the_wire_contract():
    item = RecordedDecision(gang_id="ns/x", no_fit="0/1 nodes are available")
    node_ = RecordedNode(name="n1", removed=True)
    wire = DecisionsRecorded(replica="p", seq=3, at=2.5, base=True, items=(node_, item))
    sent = R._Record(replica="p", seq=3, at=2.5, base=True,
                     items=(msgspec.Raw(encoder.encode(node_)), msgspec.Raw(encoder.encode(item))))
    assert encoder.encode(sent) == encoder.encode(wire) and sent.key() == wire.key()


def _logged_decision_with_queue_and_preemption(*, invalid: str = "", gpus: int = 4, count: int = 1):
    """A base of two full V100 nodes (three running gangs of two queues) and one decision whose
    queue rules and preemption plan are logged as placement logs them (``invalid``: node n0's
    report is, so the engine leaves n0 out while its gang still holds GPUs there)."""
    from phalanx_engine.decide import Cluster
    from phalanx_engine.preempt import Plan, plan_preemption
    from phalanx_engine.recorded import Memory
    from phalanx_engine.snapshot import Snapshot
    from phalanx_placement import preempting
    from phalanx_proto.events import RecordedQueueGate
    from phalanx_proto.queues import GPU_UNITS, QueueSpec
    from phalanx_rules import queueorder
    from phalanx_rules.preemption import Preemptor, RunningGang
    from phalanx_rules.queues import QueueTree

    def running(name, node_name, gpus, prio, queue):
        a = Assignment(pod=pod(name).spec().pod, node=node_name, gpus=gpus, gpu_uuids=("",) * len(gpus))
        return RunningGang(gang_id=f"ns/{name}", assignments=(a,), priority=prio, queues=(queue,), started_at=10.0)

    gangs = (running("a0", "n0", tuple(range(8)), 1, "team-a"), running("a1", "n1", (0, 1, 2, 3), 2, "team-a"),
             running("b0", "n1", (4, 5, 6, 7), 0, "team-b"))
    built = {n: node(n).gpus(8).tiers(hypernode="hn0", leaf="leaf0", netpod="pod0") for n in ("n0", "n1")}
    for g in gangs:
        for a in g.assignments:
            built[a.node].reserved(a)
    nodes = [b.view() for b in built.values()]
    if invalid:
        nodes[0] = dataclasses.replace(nodes[0], invalid=invalid)
    cluster = Cluster.from_snapshot(Snapshot(nodes=tuple(nodes)))
    tree = QueueTree.of((QueueSpec(name="team-a", quota=4 * GPU_UNITS, limit=12 * GPU_UNITS),
                         QueueSpec(name="team-b", quota=8 * GPU_UNITS)))
    members = tuple(msgspec.structs.replace(pod(f"hi-{i}").gpus(gpus).spec(), queue="team-b") for i in range(count))
    held = {"team-a": 12 * GPU_UNITS, "team-b": 4 * GPU_UNITS}
    gate = RecordedQueueGate(specs=tuple(tree.specs.values()), limited_held={}, held={"team-b": held["team-b"]},
                             refusal=queueorder.refusal(tree, members, {}), borrowing=queueorder.borrowing(
                                 tree, members, held))
    who = Preemptor(gang_id="ns/hi", members=members, priority=5, queue="team-b")
    plan = plan_preemption(cluster, who, gangs, tree, held_by=held, now=20.0)
    if not invalid:
        assert isinstance(plan, Plan) and [v.gang_id for v in plan.victims] == ["ns/b0"]  # its own queue's lowest
    logged = preempting.recorded(who, gangs, tree, held, 20.0, plan)
    memory = Memory()
    base = DecisionsRecorded(replica="p1", seq=1, base=True, items=(
        *(memory.record(v) for v in nodes),
        RecordedDecision(gang_id="ns/hi", members=members, engine=False, queue=gate, preemption=logged)))
    return base, plan


def test_the_queue_rules_and_the_preemption_plan_a_decision_read_replay_to_what_was_logged():
    base, plan = _logged_decision_with_queue_and_preemption()
    r = replayed([decisions_decoder.decode(encoder.encode(base))])
    assert (r.differences, r.replicas["p1"].agree, r.replicas["p1"].decisions) == ([], 1, 1)
    assert [v.gang_id for v in plan.victims] == list(base.items[-1].preemption.victims)


def test_a_plan_over_gangs_holding_gpus_on_a_node_the_engine_left_out_replays_to_what_was_logged():
    """Placement's planner reads the running gangs from the ledgers, a node with an invalid
    report included; the replay must count the same gangs (it once counted only the usable
    nodes' and answered 'evicting all 1 gang(s)' where 3 were logged)."""
    base, plan = _logged_decision_with_queue_and_preemption(invalid="topology: gpus[0].index: out of range",
                                                            gpus=8, count=2)
    assert not hasattr(plan, "victims") and "3 gang(s)" in plan.reason, plan
    r = replayed([decisions_decoder.decode(encoder.encode(base))])
    assert (r.differences, r.replicas["p1"].agree, r.replicas["p1"].decisions) == ([], 1, 1)


@pytest.mark.parametrize(("what", "change", "words"), [
    ("a limit refusal the rules would not give", lambda d: msgspec.structs.replace(
        d, queue=msgspec.structs.replace(d.queue, refusal="at its limit")), "queue refusal: at its limit"),
    ("a borrowing the rules would not say", lambda d: msgspec.structs.replace(
        d, queue=msgspec.structs.replace(d.queue, borrowing=True)), "borrowing: True"),
    ("victims the planner would not choose", lambda d: msgspec.structs.replace(
        d, preemption=msgspec.structs.replace(d.preemption, victims=("ns/a1",))), "evict ns/a1"),
])
def test_a_queue_or_preemption_answer_that_is_not_the_rules_is_named_with_both(what, change, words):
    base, _ = _logged_decision_with_queue_and_preemption()
    forged = msgspec.structs.replace(base, items=base.items[:-1] + (change(base.items[-1]),))
    diffs = replayed([forged]).differences
    assert len(diffs) == 1 and words in diffs[0].recorded and words not in diffs[0].replayed, diffs
