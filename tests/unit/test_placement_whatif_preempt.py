"""The preempt probe's planner in placement (``phalanx_placement.whatif.Relaxed``): when
placement's own preemption refused, the same planner with the refusing rules lifted names the
victims that would start the gang, and the refusal is the reason it is not done; the quotas and
limits still hold, and a gang no eviction would help gets no answer."""

from __future__ import annotations

import pytest
from test_preempt import World, q, v100, wants

from phalanx_engine.preempt import NoPlan, plan_preemption
from phalanx_engine.whatif import PreemptPlan
from phalanx_placement.whatif import Relaxed
from phalanx_rules.queues import QueueTree


def relaxed(world: World, preemptor, *queues, why: str = "refused") -> PreemptPlan | None:
    tree = QueueTree.of(queues)
    real = plan_preemption(world.cluster(), preemptor, world.gangs, tree)
    assert isinstance(real, NoPlan), real  # the probe runs only where placement's own plan refused
    hook = Relaxed(preemptor, tuple(world.gangs), tree, held(world), why)
    return hook(world.cluster(), preemptor.members, holders={})


def held(world: World) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in world.gangs:
        for queue in g.queues:
            out[queue] = out.get(queue, 0) + g.units
    return out


CASES = [
    pytest.param(
        World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1).gang("high", ("a", 4, 5, 6, 7), priority=50),
        wants("p", 4, policy="Never"), (),
        PreemptPlan(victims=("ns/low",), allowed=False, why_not="refused"),
        id="a gang whose preemptionPolicy is Never is told which gang it would evict, the cheapest"),
    pytest.param(
        World(v100("a")).gang("peer", ("a", 0, 1, 2, 3), priority=10).gang("above", ("a", 4, 5, 6, 7), priority=11),
        wants("p", 4, priority=10), (),
        PreemptPlan(victims=("ns/peer",), allowed=False, why_not="refused"),
        id="a gang of equal priority is named as the victim it would take, not done"),
    pytest.param(
        World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1, queue="t").gang("x", ("a", 4, 5, 6, 7), priority=5, queue="t"),
        wants("p", 4, queue="t"), (q("t", quota=8, within="Never"),),
        PreemptPlan(victims=("ns/low",), allowed=False, why_not="refused"),
        id="a queue that never preempts within itself is told what preemption would start its gang"),
    pytest.param(
        World(v100("a")).gang("b1", ("a", 0, 1, 2, 3), queue="b").gang("b2", ("a", 4, 5, 6, 7), queue="b"),
        wants("p", 4, priority=0, queue="a"), (q("a", quota=4, reclaim="Never"), q("b", quota=4)),
        PreemptPlan(victims=("ns/b1",), allowed=False, why_not="refused"),
        id="a queue below its quota that never reclaims is told what reclaim would take"),
    pytest.param(
        World(v100("a")).gang("b1", ("a", 0, 1, 2, 3), queue="b").gang("b2", ("a", 4, 5, 6, 7), queue="b"),
        wants("p", 4, priority=0, queue="a"), (q("a", quota=4, reclaim="Never"), q("b", quota=8)),
        None,
        id="no answer where reclaim would push the other queue below its quota: quotas are not lifted"),
    pytest.param(
        World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1),
        wants("p", 16, policy="Never"), (),
        None,
        id="no answer for a gang no eviction would let fit"),
]


@pytest.mark.parametrize(("world", "preemptor", "queues", "expected"), CASES)
def test_relaxed_plans(world, preemptor, queues, expected):
    assert relaxed(world, preemptor, *queues) == expected


def test_the_running_gangs_and_the_cluster_are_left_as_they_were():
    world = World(v100("a")).gang("low", ("a", 0, 1, 2, 3), priority=1).gang("high", ("a", 4, 5, 6, 7), priority=50)
    before = (tuple(world.gangs), world.cluster().nodes["a"].view)
    relaxed(world, wants("p", 4, policy="Never"))
    assert (tuple(world.gangs), world.cluster().nodes["a"].view) == before
