"""The preemption planner (libs/phalanx_engine/preempt.py), table-driven on small clusters of
real V100 topologies: the rules (preemptionPolicy, within a queue, reclaim across queues and
the tree), the order (priority, GPUs, gangs, placement, GPU-seconds) and the reasons, each
compared as a whole ``Plan`` or ``NoPlan``."""

from __future__ import annotations

import msgspec
import pytest
from engine_builders import NodeBuilder, node, pod, snapshot

from phalanx_engine.decide import Cluster
from phalanx_engine.preempt import (
    NoPlan,
    Plan,
    Preemptor,
    RunningGang,
    SearchBounds,
    Victim,
    plan_preemption,
    running_gangs,
)
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_proto.state import Allocation, NodeLedger
from phalanx_rules.queues import QueueTree

G = GPU_UNITS


def ref(name: str) -> PodRef:
    return PodRef(namespace="ns", name=name, uid=f"uid-{name}")


class World:
    """Nodes with running gangs on exact GPUs: ``.gang("g", ("a", 0, 1), priority=3)``."""

    def __init__(self, *nodes: NodeBuilder) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.gangs: list[RunningGang] = []

    def gang(self, name: str, *members: tuple, priority: int = 0, queue: str = "default",
             parents: tuple[str, ...] = (), started: float | None = None) -> World:
        assignments = tuple(Assignment(pod=ref(f"{name}-{i}"), node=n, gpus=tuple(gpus))
                            for i, (n, *gpus) in enumerate(members))
        for a in assignments:
            taken = {g for other in self.gangs for b in other.assignments if b.node == a.node for g in b.gpus}
            assert not taken & set(a.gpus), f"{name}: GPUs {sorted(taken & set(a.gpus))} of {a.node} are taken"
            self.nodes[a.node].reserved(a)
        self.gangs.append(RunningGang(gang_id=f"ns/{name}", assignments=assignments, priority=priority,
                                      queues=(queue, *parents), started_at=started))
        return self

    def cluster(self) -> Cluster:
        return Cluster.from_snapshot(snapshot(*self.nodes.values()))


def wants(name: str, *gpus: int, priority: int = 10, queue: str = "default", policy: str = "PreemptLowerPriority"):
    members = tuple(pod(f"{name}-{i}" if len(gpus) > 1 else name).gpus(k).spec() for i, k in enumerate(gpus))
    return Preemptor(gang_id=f"default/{name}", members=members, priority=priority, queue=queue, preemption_policy=policy)


def q(name: str, quota: float = 0, limit: float | None = None, parent: str = "", within: str = "LowerPriority",
      reclaim: str = "Any") -> QueueSpec:
    return QueueSpec(name=name, parent=parent, quota=round(quota * G), limit=None if limit is None else round(limit * G),
                     within_queue=within, reclaim=reclaim)


def placed(name: str, node_name: str, *gpus: int) -> Assignment:
    return Assignment(pod=pod(name).spec().pod, node=node_name, gpus=gpus, gpu_uuids=("",) * len(gpus))


def victim(name: str, rule: str, *, gpus: int, priority: int = 0, queue: str = "default", pods: int = 1) -> Victim:
    return Victim(gang_id=f"ns/{name}", queue=queue, priority=priority, rule=rule, units=gpus * G,
                  pods=tuple(ref(f"{name}-{i}") for i in range(pods)))


def plan(world: World, preemptor: Preemptor, *queues: QueueSpec, **kw) -> Plan | NoPlan:
    return plan_preemption(world.cluster(), preemptor, world.gangs, QueueTree.of(queues), **kw)


def v100(name: str) -> NodeBuilder:
    return node(name).gpus(8).tiers(netpod="np")


def full(name: str, *taken: int) -> tuple:
    """The GPUs of node ``name`` not in ``taken``: a filler gang's member."""
    return (name, *(g for g in range(8) if g not in taken))


CASES = [
    pytest.param(
        World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1).gang("keep", ("a", 4, 5, 6, 7), priority=50),
        wants("p", 4), (),
        Plan(victims=(victim("low", "priority", gpus=4, priority=1),),
             placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=4 * G),
        id="a gang evicts the lower-priority gang of its queue and takes its NVLink quad"),
    pytest.param(
        World(v100("a")).gang("peer", ("a", 0, 1, 2, 3), priority=10).gang("above", ("a", 4, 5, 6, 7), priority=11),
        wants("p", 4), (),
        NoPlan("no-candidates", "no running gang may be preempted: no gang of queue default with a priority below 10 "
                                "holds GPUs; queue default is at or above its quota (8 of 0 GPUs): it does not reclaim"),
        id="equal or higher priority in the same queue is never a victim"),
    pytest.param(
        World(v100("a")).gang("low", full("a"), priority=0), wants("p", 4, policy="Never"), (),
        NoPlan("preemption-policy-never", "its pods' preemptionPolicy is Never: it waits and never preempts"),
        id="preemptionPolicy Never waits with that reason"),
    pytest.param(
        World(v100("a")).gang("low", full("a"), priority=0, queue="t"), wants("p", 4, queue="t"),
        (q("t", 8, within="Never"),),
        NoPlan("no-candidates", "no running gang may be preempted: queue t does not preempt within itself "
                                "(spec.preemption.withinQueue: Never); queue t is at or above its quota (8 of 8 GPUs): "
                                "it does not reclaim"),
        id="withinQueue Never turns priority preemption off"),
    pytest.param(
        World(v100("a")).gang("mid", ("a", 0, 1), priority=5).gang("low", ("a", 2, 3, 4, 5), priority=0)
        .gang("keep", ("a", 6, 7), priority=50),
        wants("p", 2), (),
        Plan(victims=(victim("low", "priority", gpus=4),),
             placement=Decision(assignments=(placed("p", "a", 2, 3),)), units=4 * G),
        id="the lowest priority goes first even when it costs more GPUs"),
    pytest.param(
        World(v100("a")).gang("four", ("a", 0, 1, 2, 3)).gang("two", ("a", 4, 7)).gang("keep", ("a", 5, 6), priority=50),
        wants("p", 2), (),
        Plan(victims=(victim("two", "priority", gpus=2),),
             placement=Decision(assignments=(placed("p", "a", 4, 7),)), units=2 * G),
        id="among equal priorities the fewest GPUs go"),
    pytest.param(
        World(v100("a")).gang("pair-1", ("a", 0, 1)).gang("pair-2", ("a", 2, 3)).gang("quad", ("a", 4, 5, 6, 7)),
        wants("p", 4), (),
        Plan(victims=(victim("quad", "priority", gpus=4),),
             placement=Decision(assignments=(placed("p", "a", 4, 5, 6, 7),)), units=4 * G),
        id="among equal GPUs the fewest gangs go"),
    pytest.param(
        World(v100("a"), v100("b")).gang("a-cross", ("a", 0, 1, 4, 5)).gang("a-keep", ("a", 2, 3, 6, 7), priority=50)
        .gang("b-quad", ("b", 0, 1, 2, 3)).gang("b-keep", ("b", 4, 5, 6, 7), priority=50),
        wants("p", 4), (),
        Plan(victims=(victim("b-quad", "priority", gpus=4),),
             placement=Decision(assignments=(placed("p", "b", 0, 1, 2, 3),)), units=4 * G),
        id="among equal costs the set that frees an NVLink quad wins over one across the sockets"),
    pytest.param(
        World(v100("a"), v100("b")).gang("old", ("a", 0, 1, 2, 3), started=1000.0).gang("a-keep", ("a", 4, 5, 6, 7), priority=50)
        .gang("young", ("b", 0, 1, 2, 3), started=9000.0).gang("b-keep", ("b", 4, 5, 6, 7), priority=50),
        wants("p", 4), (),
        Plan(victims=(victim("young", "priority", gpus=4),),
             placement=Decision(assignments=(placed("p", "b", 0, 1, 2, 3),)), units=4 * G, gpu_seconds=4 * 1000.0),
        id="GPU-seconds break the last tie: the gang that started last loses less work"),
    pytest.param(
        World(v100("a"), v100("b")).gang("wide", ("a", 0, 1, 2, 3), ("b", 0, 1, 2, 3), priority=1)
        .gang("a-keep", ("a", 4, 5, 6, 7), priority=50).gang("b-keep", ("b", 4, 5, 6, 7), priority=50),
        wants("p", 4), (),
        Plan(victims=(victim("wide", "priority", gpus=8, priority=1, pods=2),),
             placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=8 * G),
        id="a victim gang goes whole, every member, though one node of it would do"),
    pytest.param(
        World(v100("a")).gang("low", ("a", 0, 1, 2, 3)), wants("p", 4), (),
        Plan(victims=(), placement=Decision(assignments=(placed("p", "a", 4, 5, 6, 7),))),
        id="a gang that fits as the cluster is evicts nobody"),
    pytest.param(
        World(v100("a")).gang("low", full("a")), wants("p", 9), (),
        NoPlan("does-not-fit", "evicting all 1 gang(s) it may preempt (1 by priority, 0 by reclaim; 8 GPUs) would still "
                               "not let it fit: 0/1 nodes are available: 1 insufficient free GPUs."),
        id="when evicting everything it may preempt would not help either the engine's reason is given"),
]


@pytest.mark.parametrize(("world", "preemptor", "queues", "expected"), CASES)
def test_plans(world, preemptor, queues, expected):
    assert plan(world, preemptor, *queues, now=10_000.0) == expected


# A repair attempt is confined to its domain (docs/repair.md, "Preemption for a repair"):
# ``within`` names the domain's nodes. Nodes a and b; the domain is node a.
def aged(spec: QueueSpec, preempt: float) -> QueueSpec:
    return msgspec.structs.replace(spec, preempt_min_runtime_s=preempt)


CONFINED = [
    pytest.param(
        World(v100("a"), v100("b")).gang("in", ("a", 0, 1, 2, 3), priority=1).gang("a-keep", ("a", 4, 5, 6, 7), priority=50)
        .gang("out", ("b", 0, 1, 2, 3), priority=0).gang("b-keep", ("b", 4, 5, 6, 7), priority=50),
        wants("p", 4), (),
        Plan(victims=(victim("in", "priority", gpus=4, priority=1),),
             placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=4 * G),
        id="the victim inside the domain is chosen though a lower-priority gang outside it would cost less"),
    pytest.param(
        World(v100("a"), v100("b")).gang("in", full("a"), priority=1),
        wants("p", 4), (),
        Plan(victims=(victim("in", "priority", gpus=8, priority=1),),
             placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=8 * G),
        id="free GPUs outside the domain do not count: it preempts inside"),
    pytest.param(
        World(v100("a"), v100("b")).gang("a-keep", full("a"), priority=50).gang("out", full("b"), priority=0),
        wants("p", 4), (),
        NoPlan("no-candidates", "no running gang on the 1 node(s) it is confined to may be preempted: no gang of queue "
                                "default with a priority below 10 holds GPUs there; queue default is at or above its "
                                "quota (16 of 0 GPUs): it does not reclaim"),
        id="no plan when the domain holds no gang it may preempt, though one outside could go"),
    pytest.param(
        World(v100("a"), v100("b")).gang("young", full("a"), queue="t", started=9_990.0)
        .gang("old", full("b"), queue="t", started=0.0),
        wants("p", 4, queue="t"), (aged(q("t"), 60.0),),
        NoPlan("min-runtime", "not preempting yet: evicting ns/young would let it start, but ns/young (queue t, "
                              "preemptMinRuntime 1m) started too recently to be a victim; it may preempt from "
                              "1970-01-01T02:47:30Z and is tried again then", retry_at=10_050.0),
        id="a victim inside too young to go: it waits for it, never takes the old one outside"),
]


@pytest.mark.parametrize(("world", "preemptor", "queues", "expected"), CONFINED)
def test_a_confined_plan_preempts_only_inside_its_nodes(world, preemptor, queues, expected):
    assert plan(world, preemptor, *queues, now=10_000.0, within=frozenset({"a"})) == expected


def test_without_confinement_the_same_worlds_take_the_cheapest_victims_anywhere():
    """The cases above are confinement's doing: unconfined, each takes the gang outside, or fits outside."""
    got = [plan(w, p, *qs, now=10_000.0) for w, p, qs, _ in (c.values for c in CONFINED)]
    assert [(tuple(v.gang_id for v in g.victims), tuple(a.node for a in g.placement.assignments))
            if isinstance(g, Plan) else g.code for g in got] == [
        (("ns/out",), ("b",)), ((), ("b",)), (("ns/out",), ("b",)), (("ns/old",), ("b",))]


def test_a_gang_holding_gpus_both_inside_and_outside_is_a_candidate_and_goes_whole():
    w = World(v100("a"), v100("b")).gang("wide", ("a", 0, 1, 2, 3), ("b", 0, 1, 2, 3), priority=1) \
        .gang("a-keep", ("a", 4, 5, 6, 7), priority=50).gang("b-keep", ("b", 4, 5, 6, 7), priority=50)
    assert plan(w, wants("p", 4), within=frozenset({"a"})) == Plan(
        victims=(victim("wide", "priority", gpus=8, priority=1, pods=2),),
        placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=8 * G)


def teams(a_quota: float = 8, b_quota: float = 8, reclaim: str = "Any") -> tuple[QueueSpec, ...]:
    return (q("team-a", a_quota, reclaim=reclaim), q("team-b", b_quota), q("team-c", 6))


def b_borrows(*gangs: tuple[str, int, int], a_held: int = 0) -> World:
    """Nodes a and b. team-b's gangs ``(name, GPUs, priority)`` fill node b from GPU 0, then node a
    after team-a's own ``a_held`` GPUs (priority 100)."""
    w = World(v100("a"), v100("b"))
    if a_held:
        w.gang("a-own", ("a", *range(a_held)), priority=100, queue="team-a")
    free = [("b", g) for g in range(8)] + [("a", g) for g in range(a_held, 8)]
    for name, gpus, priority in gangs:
        mine, free = free[:gpus], free[gpus:]
        w.gang(name, *[(n, *[g for m, g in mine if m == n]) for n in ("b", "a") if any(m == n for m, _ in mine)],
               priority=priority, queue="team-b")
    return w


def test_a_queue_below_its_quota_reclaims_from_one_above_whatever_the_priority():
    w = b_borrows(("b1", 4, 100), ("b2", 4, 100), ("b3", 4, 100), ("b4", 4, 100))
    got = plan(w, wants("p", 4, priority=0, queue="team-a"), *teams())
    assert got == Plan(victims=(victim("b1", "reclaim", gpus=4, priority=100, queue="team-b"),),
                       placement=Decision(assignments=(placed("p", "b", 0, 1, 2, 3),)), units=4 * G)


def test_reclaim_never_pushes_the_victim_queue_below_its_quota():
    # team-b (quota 8) holds 10: only its 2-GPU gang can go; team-c sits at its quota.
    w = b_borrows(("b1", 4, 0), ("b2", 4, 0), ("b3", 2, 0)).gang("c", ("a", 2, 3, 4, 5, 6, 7), queue="team-c")
    got = plan(w, wants("p", 4, queue="team-a"), *teams())
    assert got == NoPlan("does-not-fit", "evicting all 1 gang(s) it may preempt (0 by priority, 1 by reclaim; 2 GPUs) "
                                         "would still not let it fit: 0/2 nodes are available: 2 insufficient free GPUs.")


def test_reclaim_takes_a_gang_that_leaves_the_victim_queue_at_its_quota():
    w = b_borrows(("b1", 4, 0), ("b2", 4, 0), ("b3", 2, 0)).gang("c", ("a", 2, 3, 4, 5, 6, 7), queue="team-c")
    got = plan(w, wants("p", 2, queue="team-a"), *teams())
    assert got == Plan(victims=(victim("b3", "reclaim", gpus=2, queue="team-b"),),
                       placement=Decision(assignments=(placed("p", "a", 0, 1),)), units=2 * G)


def test_reclaim_never_takes_two_gangs_that_together_push_the_victim_queue_below_its_quota():
    # team-b (quota 8) holds 12 in three 4-GPU gangs: any one may go, not two. An 8-GPU pod of
    # team-a would need both gangs of node b; node a's other half is team-c's, at its quota.
    w = b_borrows(("b1", 4, 0), ("b2", 4, 0), ("b3", 4, 0)).gang("c", ("a", 4, 5, 6, 7), queue="team-c")
    got = plan(w, wants("p", 8, queue="team-a"), *teams())
    assert got == NoPlan("quota", "no set of the 3 gang(s) it may preempt (0 by priority, 3 by reclaim; 12 GPUs) both "
                                  "lets it fit and keeps every queue's quota and limit (evicting all of them: queue "
                                  "team-b would go below its quota 8 (it would hold 0 GPUs): reclaim takes only what a "
                                  "queue holds beyond its quota)")
    assert plan(w, wants("p", 4, queue="team-a"), *teams()) == Plan(
        victims=(victim("b1", "reclaim", gpus=4, queue="team-b"),),
        placement=Decision(assignments=(placed("p", "b", 0, 1, 2, 3),)), units=4 * G)


def test_a_queue_at_its_quota_does_not_reclaim():
    w = b_borrows(("b1", 4, 0), ("b2", 4, 0), ("b3", 4, 0), a_held=4)
    got = plan(w, wants("p", 4, queue="team-a"), *teams(a_quota=4))
    assert got == NoPlan("no-candidates", "no running gang may be preempted: no gang of queue team-a with a priority "
                                          "below 10 holds GPUs; queue team-a is at or above its quota (4 of 4 GPUs): it "
                                          "does not reclaim")


def test_reclaim_never_turns_reclaim_off():
    w = b_borrows(("b1", 8, 0), ("b2", 8, 0))
    got = plan(w, wants("p", 4, queue="team-a"), *teams(reclaim="Never"))
    assert got == NoPlan("no-candidates", "no running gang may be preempted: no gang of queue team-a with a priority "
                                          "below 10 holds GPUs; queue team-a does not reclaim "
                                          "(spec.preemption.reclaim: Never)")


def test_a_queue_reclaims_only_up_to_its_quota():
    w = b_borrows(("b1", 4, 0), ("b2", 4, 0), ("b3", 4, 0), a_held=4)
    got = plan(w, wants("p", 4, queue="team-a"), *teams(a_quota=6))
    assert got == NoPlan("quota", "no set of the 3 gang(s) it may preempt (0 by priority, 3 by reclaim; 12 GPUs) both "
                                  "lets it fit and keeps every queue's quota and limit (evicting all of them: queue "
                                  "team-a would pass its quota 6 (it would hold 8 GPUs with this gang): reclaim takes "
                                  "back only up to the quota)")


def test_a_child_reclaims_from_its_sibling_not_from_another_root_when_the_parent_is_at_its_quota():
    # research (quota 4) = team-a (quota 4, holds 0) + team-b (quota 0, holds 4): research is at its
    # quota. prod (quota 8) borrows 4. Taking prod's cheaper gang would lift research to 8, past its
    # quota; taking team-b's stays inside research.
    w = World(v100("a"), v100("b"))
    w.gang("sib", ("a", 0, 1, 2, 3), priority=9, queue="team-b", parents=("research",))
    w.gang("prod-1", ("a", 4, 5, 6, 7), priority=0, queue="prod").gang("prod-2", ("b", 0, 1, 2, 3), priority=0, queue="prod")
    w.gang("prod-3", ("b", 4, 5, 6, 7), priority=0, queue="prod")
    queues = (q("research", 4), q("team-a", 4, parent="research"), q("team-b", 0, parent="research"), q("prod", 8))
    got = plan(w, wants("p", 4, priority=0, queue="team-a"), *queues)
    assert got == Plan(victims=(victim("sib", "reclaim", gpus=4, priority=9, queue="team-b"),),
                       placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=4 * G)


def test_the_queue_limit_counts_the_gangs_it_evicts_of_its_own_queue():
    # team-a (limit 8) holds 8 on node a; node b is free but a 4-GPU gang would take team-a to 12.
    w = World(v100("a"), v100("b")).gang("old", ("a", 0, 1, 2, 3), queue="team-a").gang("old2", ("a", 4, 5, 6, 7), queue="team-a")
    got = plan(w, wants("p", 4, queue="team-a"), q("team-a", 8, limit=8))
    assert got == Plan(victims=(victim("old", "priority", gpus=4, queue="team-a"),),
                       placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=4 * G)


def test_a_gang_spread_over_nodes_evicts_what_it_needs_in_one_network_domain():
    nodes = [node(n).gpus(8).tiers(hypernode=h, netpod="np") for n, h in (("a", "h1"), ("b", "h1"), ("c", "h2"), ("d", "h2"))]
    w = World(*nodes)
    w.gang("h1-low", ("a", *range(8)), ("b", *range(8)), priority=1)
    w.gang("h2-c", ("c", *range(8)), priority=0).gang("h2-d", ("d", *range(8)), priority=2)
    got = plan(w, wants("g", 8, 8, priority=5))
    assert got == Plan(victims=(victim("h1-low", "priority", gpus=16, priority=1, pods=2),),
                       placement=Decision(assignments=(placed("g-0", "a", *range(8)), placed("g-1", "b", *range(8)))),
                       units=16 * G)


def test_the_greedy_search_of_a_large_domain_keeps_the_cost_but_may_miss_the_best_placement():
    # Eight 1-GPU gangs of priorities 0,1,2,0,1,2,0,1 on node a; a 4-GPU pod needs four gangs of
    # priority at most 1. Greedy empties the node up to priority 1 and then drops, highest priority
    # first and then by name, what it does not need: GPUs 0,3,6,7 (GPU 6 reaches 0 and 3 only over
    # SYS). The exhaustive search finds the same cost with an NVLink ring: 0-3-7-4.
    w = World(v100("a"), v100("b"))
    for i in range(8):
        w.gang(f"one-{i}", ("a", i), priority=i % 3)
    w.gang("b-keep", ("b", *range(8)), priority=50)
    greedy = plan(w, wants("p", 4), bounds=SearchBounds(exact_victims=0))
    assert greedy == Plan(victims=tuple(victim(f"one-{i}", "priority", gpus=1, priority=i % 3) for i in (0, 3, 6, 7)),
                          placement=Decision(assignments=(placed("p", "a", 0, 3, 6, 7),)), units=4 * G)
    assert not greedy.search.exact
    exact = plan(w, wants("p", 4))
    assert exact == Plan(victims=tuple(victim(f"one-{i}", "priority", gpus=1, priority=i % 3) for i in (0, 3, 4, 7)),
                         placement=Decision(assignments=(placed("p", "a", 0, 3, 4, 7),)), units=4 * G)
    assert exact.search.exact


def test_the_plan_leaves_the_cluster_it_was_given_untouched():
    w = World(v100("a")).gang("low", ("a", 0, 1, 2, 3)).gang("keep", ("a", 4, 5, 6, 7), priority=50)
    cluster = w.cluster()
    before = ({n: sorted(st.free_whole()) for n, st in cluster.nodes.items()}, {k: set(v) for k, v in cluster.by_free.items()})
    assert isinstance(plan_preemption(cluster, wants("p", 4), w.gangs, QueueTree.of([])), Plan)
    assert ({n: sorted(st.free_whole()) for n, st in cluster.nodes.items()}, {k: set(v) for k, v in cluster.by_free.items()}) == before


def test_running_gangs_are_read_from_the_ledgers_with_their_queues_priority_and_start():
    a0 = Assignment(pod=ref("g-0"), node="a", gpus=(0,))
    a1 = Assignment(pod=ref("g-1"), node="b", gpus=(1, 2))
    solo = Assignment(pod=ref("solo"), node="a", gpus=(3,))
    ledgers = [NodeLedger(node="a", allocations={"x": Allocation(gang_id="ns/g", attempt=1, assignment=a0,
                                                                  queues=("team-a", "research")),
                                                 "y": Allocation(gang_id="ns/solo", attempt=2, assignment=solo)}),
               NodeLedger(node="b", allocations={"z": Allocation(gang_id="ns/g", attempt=1, assignment=a1,
                                                                  queues=("team-a", "research"))})]
    assert running_gangs(ledgers, {"ns/g": 7}, {"ns/g": 123.0}) == (
        RunningGang(gang_id="ns/g", assignments=(a0, a1), priority=7, queues=("team-a", "research"), started_at=123.0),
        RunningGang(gang_id="ns/solo", assignments=(solo,)),
    )


def test_with_no_ties_to_try_the_first_plan_of_the_lowest_cost_is_taken():
    w = World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1).gang("keep", ("a", 4, 5, 6, 7), priority=50)
    got = plan(w, wants("p", 4), bounds=SearchBounds(ties=0))
    assert got == Plan(victims=(victim("low", "priority", gpus=4, priority=1),),
                       placement=Decision(assignments=(placed("p", "a", 0, 1, 2, 3),)), units=4 * G)


# -- preemptors that decide together ----------------------------------------------------------------
def _ledgers(world: World, noms: list) -> list[NodeLedger]:
    """The nodes' ledgers: ``world``'s gangs as reservations (charged to their queues) and ``noms``."""
    from phalanx_proto.state import Nomination, alloc_key

    out = []
    for name in world.nodes:
        allocs = {alloc_key(a.pod): Allocation(gang_id=g.gang_id, attempt=1, assignment=a, queues=g.queues)
                  for g in world.gangs for a in g.assignments if a.node == name}
        mine = {alloc_key(n.assignment.pod): n for n in noms if isinstance(n, Nomination) and n.assignment.node == name}
        out.append(NodeLedger(node=name, allocations=allocs, nominations=mine))
    return out


@pytest.mark.parametrize("count_nominations", [True, False], ids=["nominations counted", "nominations ignored"])
def test_preemptors_deciding_one_after_another_reclaim_up_to_the_quota_and_no_further(count_nominations):
    """The burst: team-a (quota 8) holds all 16 GPUs in one-GPU gangs — 4 of them already taken back
    by team-b's gang and nominated — and six one-GPU team-b pods (team-b quota 8, holding 0 but
    those 4) decide one after another, each on the ledgers with the nominations before it. Counting
    nominations, exactly 4 more reclaim (team-b 8, team-a 8) and 2 find no plan; ignoring them (the
    bug), all 6 do, taking team-a to 6 and team-b to 10."""
    from phalanx_proto.state import Nomination
    from phalanx_rules.preemption import with_nominations
    from phalanx_rules.queues import held_by_queue

    w = World(v100("a"), v100("b"))
    for i in range(16):
        w.gang(f"a{i:02d}", ("ab"[i // 8], i % 8), priority=0, queue="team-a")
    tree = QueueTree.of(teams())
    noms: list[Nomination] = [  # team-b's gang of 4 reclaimed a00..a03 and waits for them to go
        Nomination(gang_id="default/b-gang", attempt=1, assignment=placed(f"b-gang-{i}", "a", i), queue="team-b",
                   victims={f"ns/a{i:02d}": "reclaim"}, expires_at=2_000.0) for i in range(4)]
    outcomes = []
    for p in range(6):
        taken = {v for n in noms for v in n.victims}
        running = [g for g in w.gangs if g.gang_id not in taken]
        ledgers = _ledgers(w, noms)
        held = held_by_queue(ledgers)
        if count_nominations:
            held = with_nominations(held, ledgers, tree, 1_000.0)
        got = plan_preemption(w.cluster(), wants(f"b{p}", 1, priority=0, queue="team-b"), running, tree, held_by=held)
        outcomes.append(isinstance(got, Plan) and bool(got.victims))
        if isinstance(got, Plan):
            noms += [Nomination(gang_id=f"default/b{p}", attempt=1, assignment=a, queue="team-b",
                                victims={v.gang_id: v.rule for v in got.victims}, expires_at=2_000.0)
                     for a in got.placement.assignments]
    taken = {v for n in noms for v in n.victims}
    team_a = sum(1 for g in w.gangs if g.gang_id not in taken)
    if count_nominations:
        assert (outcomes, team_a, 16 - team_a) == ([True] * 4 + [False] * 2, 8, 8)
    else:
        assert (outcomes, team_a, 16 - team_a) == ([True] * 6, 6, 10)


def test_nominations_in_force_count_toward_the_queues_they_move_units_between():
    from phalanx_proto.state import Nomination
    from phalanx_rules.preemption import with_nominations

    tree = QueueTree.of((q("org", 16), q("team-a", 8, parent="org"), q("team-b", 8, parent="org"), q("other", 0)))
    a0 = Allocation(gang_id="ns/a0", attempt=1, assignment=placed("a0", "n", 0, 1), queues=("team-a", "org"))
    o0 = Allocation(gang_id="ns/o0", attempt=1, assignment=placed("o0", "n", 2), queues=("other",))
    nom = Nomination(gang_id="ns/b0", attempt=1, assignment=placed("b0", "n", 0, 1), queue="team-b",
                     victims={"ns/a0": "reclaim"}, expires_at=50.0)
    old = Nomination(gang_id="ns/b1", attempt=1, assignment=placed("b1", "n", 2), queue="team-b",
                     victims={"ns/o0": "reclaim"}, expires_at=5.0)
    led = NodeLedger(node="n", allocations={"a0": a0, "o0": o0}, nominations={"b0": nom, "b1": old})
    held = {"team-a": 2 * G, "org": 2 * G, "other": 1 * G}
    # b0's nomination: +2 to team-b and org, -2 (a0, its victim) from team-a and org; b1's expired
    assert with_nominations(held, [led], tree, 10.0) == {"team-a": 0, "team-b": 2 * G, "org": 2 * G, "other": G}
    # the preemptor deciding again leaves its own nomination out
    assert with_nominations(held, [led], tree, 10.0, but="ns/b0") == held


def test_a_domain_with_room_by_gpus_where_something_else_refuses_the_preemptor_has_no_plan_and_no_crash():
    """Four nodes whose CPU is all taken, each with 2 free GPUs among 6 one-GPU gangs (24
    candidates, more than the exact search takes): the greedy search may offer no victim at all
    for a domain that already has room by GPU count; the empty set was tried first and did not
    fit (no CPU), so it is no plan — not the ValueError it once raised."""
    nodes, gangs = [], []
    for i in range(4):
        b = node(f"n{i}").gpus(8).tiers(hypernode="hn", leaf="l", netpod="p").running(cpu=128_000)
        for g in range(6):
            a = Assignment(pod=ref(f"g{i}-{g}"), node=f"n{i}", gpus=(g,))
            b.reserved(a)
            gangs.append(RunningGang(gang_id=f"ns/g{i}-{g}", assignments=(a,), priority=0))
        nodes.append(b)
    cluster = Cluster.from_snapshot(snapshot(*nodes))
    p = Preemptor(gang_id="t/p", members=(pod("m0").gpus(1).requests(cpu=1000).spec(),
                                          pod("m1").gpus(1).requests(cpu=1000).spec()), priority=10)
    got = plan_preemption(cluster, p, gangs, QueueTree.of(()))
    assert isinstance(got, NoPlan) and (got.code, got.reason) == (
        "does-not-fit", "evicting all 24 gang(s) it may preempt (24 by priority, 0 by reclaim; 24 GPUs) would still "
                        "not let it fit: 0/4 nodes are available: 4 Insufficient cpu."), got
