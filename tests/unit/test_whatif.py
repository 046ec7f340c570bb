"""The counterfactual probes (``phalanx_engine.whatif``): per probe, a table of small clusters
whose answer is compared whole — its decision is the engine's own on the changed cluster or
request — and checked minimal within the probe's rule (one step more is refused)."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from engine_builders import node, pod, snapshot

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Decision, NoFit
from phalanx_engine.whatif import PreemptPlan, ProbeContext, QueueView, Running, top_line, what_if
from phalanx_engine.whatif.search import largest_fitting
from phalanx_proto.events import PodRef
from phalanx_proto.queues import GPU_UNITS, QueueSpec
from phalanx_proto.whatif import Answer, Holder, WhatIf
from phalanx_rules.queues import QueueTree

NOW = 1000.0


def cluster(*nodes) -> Cluster:
    return Cluster.from_snapshot(snapshot(*nodes))


def gang(n: int, gpus: int, *, queue: str = "", **selector: str):
    return tuple(msgspec.structs.replace(pod(f"w{i}").gpus(gpus).selector(**selector).spec(), queue=queue)
                 for i in range(n))


def bg(node_name: str, i: int) -> PodRef:
    """The i-th reservation a builder's ``busy``/``share`` made on ``node_name``."""
    return PodRef(namespace="bg", name=f"busy-{node_name}-{i}")


def held_by(**gangs: tuple[PodRef, ...]) -> dict[PodRef, Running]:
    """Gang id (``team_x`` -> ``team/x``) -> its pods; each gang started at 100 in queue team."""
    return {p: Running(gang_id=g.replace("_", "/"), queue="team", priority=1, since=100.0)
            for g, pods in gangs.items() for p in pods}


def decision(members, *nodes) -> Decision:
    got = decide(cluster(*nodes), members)
    assert isinstance(got, Decision), got
    return got


def answers(result: WhatIf, probe: str) -> list[Answer]:
    return [a for a in result.answers if a.probe == probe]


# --- wait -------------------------------------------------------------------------------------

H1 = dict(hypernode="h1", netpod="p1")


def test_a_gang_waits_for_the_gang_whose_gpus_it_lacks_not_a_bigger_one():
    nodes = [node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)]
    members = gang(3, 4)
    ctx = ProbeContext(holders=held_by(team_x=(bg("a", 0),), team_y=(bg("b", 0),)), now=NOW)
    got = answers(what_if(cluster(*nodes), members, ctx=ctx), "wait")
    # The counterfactual: team/y gone; the engine's decision there is the answer's.
    expected = decision(members, node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1))
    assert got == [Answer(probe="wait", text="would start if 2 GPUs free in HyperNode h1 (held by gang team/y)",
                          gpus=2, holders=(Holder(gang_id="team/y", queue="team", priority=1, age_s=900.0, gpus=2),),
                          tier="hypernode", domain="h1", assignments=expected.assignments)]


def test_a_holder_the_pod_does_not_need_gone_is_not_waited_for():
    nodes = [node("a").gpus(8).busy(0, 1, 2, 3).busy(4)]
    members = gang(1, 4)
    ctx = ProbeContext(holders=held_by(team_big=(bg("a", 0),), team_small=(bg("a", 1),)), now=NOW)
    got = answers(what_if(cluster(*nodes), members, ctx=ctx), "wait")
    expected = decision(members, node("a").gpus(8).busy(0, 1, 2, 3))
    assert got == [Answer(probe="wait", text="would start if 1 GPU free on node a (held by gang team/small)", gpus=1,
                          holders=(Holder(gang_id="team/small", queue="team", priority=1, age_s=900.0, gpus=1),),
                          tier="node", domain="a", assignments=expected.assignments)]
    # Minimal: with team/small still there it does not fit.
    assert isinstance(decide(cluster(*nodes), members), NoFit)


def test_a_pod_waits_on_the_node_needing_the_fewest_gpus_freed():
    nodes = [node("a").gpus(8).busy(0, 1, 2, 3, 4, 5), node("b").gpus(8).busy(0, 1, 2, 3, 4, 5, 6)]
    members = gang(1, 4)
    ctx = ProbeContext(holders=held_by(team_a=(bg("a", 0),), team_b=(bg("b", 0),)), now=NOW)
    got = answers(what_if(cluster(*nodes), members, ctx=ctx), "wait")
    assert [(a.domain, a.gpus, [h.gang_id for h in a.holders]) for a in got] == [("a", 2, ["team/a"])]


def test_unknown_reservations_are_named_by_their_pod():
    nodes = [node("a").gpus(8).busy(0, 1, 2, 3, 4, 5, 6, 7)]
    got = answers(what_if(cluster(*nodes), gang(1, 1)), "wait")
    assert [h.gang_id for a in got for h in a.holders] == ["bg/busy-a-0"]


def test_nothing_is_waited_for_when_no_amount_of_waiting_lets_it_fit():
    nodes = [node("a").gpus(8).busy(0)]
    assert answers(what_if(cluster(*nodes), gang(1, 9)), "wait") == []


def test_a_pod_kept_out_by_its_queue_alone_has_no_wait_answer():
    tree = QueueTree.of([QueueSpec(name="team", limit=2 * GPU_UNITS)])
    ctx = ProbeContext(queue=QueueView(tree=tree, held={"team": 2 * GPU_UNITS}))
    result = what_if(cluster(node("a").gpus(8)), gang(1, 1, queue="team"), ctx=ctx)
    assert answers(result, "wait") == []


# --- queue ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("specs", "held", "owed", "members", "expected"), [
    pytest.param([QueueSpec(name="team-a", limit=16 * GPU_UNITS)], {"team-a": 14 * GPU_UNITS}, (),
                 gang(1, 4, queue="team-a"),
                 ("queue-limit", "team-a", 2.0, True,
                  "would start if queue team-a had 2 more GPUs under its limit 16 (it holds 14, the gang needs 4)"),
                 id="a gang past its queue's limit lacks the headroom the limit leaves"),
    pytest.param([QueueSpec(name="org", limit=10 * GPU_UNITS), QueueSpec(name="a", parent="org")],
                 {"org": 8 * GPU_UNITS, "a": 8 * GPU_UNITS}, (), gang(1, 4, queue="a"),
                 ("queue-limit", "org", 2.0, True,
                  "would start if queue org had 2 more GPUs under its limit 10 (it holds 8, the gang needs 4)"),
                 id="a parent's limit is named when the child has none"),
    pytest.param([QueueSpec(name="team-a", quota=8 * GPU_UNITS), QueueSpec(name="team-b", quota=8 * GPU_UNITS)],
                 {"team-a": 8 * GPU_UNITS}, ("team-b",), gang(1, 4, queue="team-a"),
                 ("queue-quota", "team-a", 4.0, True,
                  "would start if queue team-a's quota were 4 GPUs higher (it would borrow beyond 8 while queue(s) "
                  "team-b, below quota, wait)"),
                 id="a gang held from borrowing lacks quota while another queue is owed the GPUs"),
    pytest.param([QueueSpec(name="team-a", limit=4 * GPU_UNITS)], {"team-a": 4 * GPU_UNITS}, (),
                 gang(1, 9, queue="team-a"),
                 ("queue-limit", "team-a", 9.0, False,
                  "needs 9 more GPUs of headroom under queue team-a's limit 4, and room in the cluster"),
                 id="headroom that would not be enough says so and does not start the gang"),
])
def test_queue_probe(specs, held, owed, members, expected):
    ctx = ProbeContext(queue=QueueView(tree=QueueTree.of(specs), held=held, owed=owed))
    nodes = [node("a").gpus(8)]
    got = answers(what_if(cluster(*nodes), members, ctx=ctx), expected[0])
    probe, queue, lacking, starts, text = expected
    fits = decide(cluster(*nodes), members)
    where = dict(tier="node", domain="a") if isinstance(fits, Decision) else {}
    assert got == [Answer(probe=probe, text=text, starts=starts, queue=queue, lacking_gpus=lacking,
                          assignments=fits.assignments if isinstance(fits, Decision) else (), **where)]


def test_a_queue_without_a_limit_or_a_gate_gives_no_answer():
    ctx = ProbeContext(queue=QueueView(tree=QueueTree.of([QueueSpec(name="t")]), held={"t": 64 * GPU_UNITS}))
    result = what_if(cluster(node("a").gpus(8).busy(0, 1, 2, 3, 4, 5, 6, 7)), gang(1, 1, queue="t"), ctx=ctx)
    assert answers(result, "queue-limit") + answers(result, "queue-quota") == []


# --- preempt ------------------------------------------------------------------------------------


def test_the_preemption_hooks_plan_is_checked_and_says_why_it_is_not_done():
    nodes = [node("a").gpus(8).busy(0, 1, 2, 3, 4, 5, 6, 7)]
    seen = []

    def planner(c, members, *, holders):
        seen.append((sorted(c.nodes), len(members), len(holders)))
        return PreemptPlan(victims=("team/low",), allowed=False, why_not="queue team does not allow reclaim")

    ctx = ProbeContext(holders=held_by(team_low=(bg("a", 0),)), now=NOW, preempt=planner)
    got = answers(what_if(cluster(*nodes), gang(1, 2), ctx=ctx), "preempt")
    expected = decision(gang(1, 2), node("a").gpus(8))
    assert got == [Answer(probe="preempt", starts=False, gpus=2,
                          text="would start if gang(s) team/low were preempted; not done: queue team does not allow "
                               "reclaim",
                          holders=(Holder(gang_id="team/low", queue="team", priority=1, age_s=900.0, gpus=8),),
                          tier="node", domain="a", assignments=expected.assignments)]
    assert seen == [(["a"], 1, 1)]


def test_a_plan_whose_victims_would_not_make_room_is_dropped():
    nodes = [node("a").gpus(8).busy(0, 1, 2, 3).busy(4, 5, 6, 7)]
    ctx = ProbeContext(holders=held_by(team_x=(bg("a", 0),), team_y=(bg("a", 1),)),
                       preempt=lambda c, m, *, holders: PreemptPlan(victims=("team/x",), allowed=True))
    assert answers(what_if(cluster(*nodes), gang(1, 8), ctx=ctx), "preempt") == []


# --- tier ---------------------------------------------------------------------------------------


def test_a_gang_held_to_one_hypernode_would_start_in_its_leaf_switch():
    nodes = [node("a").gpus(8).tiers(hypernode="h1", leaf="l1", netpod="p1").busy(0, 1, 2, 3),
             node("b").gpus(8).tiers(hypernode="h2", leaf="l1", netpod="p1").busy(0, 1, 2, 3)]
    members = gang(2, 4)
    assert isinstance(decide(cluster(*nodes), members, loosest="hypernode"), NoFit)
    ctx = ProbeContext(loosest="hypernode", permitted="netpod")
    got = answers(what_if(cluster(*nodes), members, ctx=ctx), "tier")
    expected = decide(cluster(*nodes), members, loosest="leaf")
    assert got == [Answer(probe="tier", text="would start if it could span one leaf switch instead of one HyperNode",
                          change="hypernode -> leaf", tier="leaf", domain="l1", assignments=expected.assignments)]


def test_no_tier_answer_when_the_gang_may_already_span_a_network_pod():
    nodes = [node("a").gpus(8).tiers(netpod="p1").busy(0, 1, 2, 3), node("b").gpus(8).tiers(netpod="p2").busy(0, 1, 2, 3)]
    assert answers(what_if(cluster(*nodes), gang(2, 4)), "tier") == []


# --- model --------------------------------------------------------------------------------------

PRODUCT = "nvidia.com/gpu.product"


def test_a_gang_pinned_to_a_busy_model_would_start_on_the_free_one():
    nodes = [node("a").gpus(8).label(PRODUCT, "A100").busy(0, 1, 2, 3, 4, 5, 6, 7),
             node("v").gpus(8).label(PRODUCT, "V100"), node("t").gpus(4).label(PRODUCT, "T4")]
    members = gang(1, 4, **{PRODUCT: "A100"})
    got = answers(what_if(cluster(*nodes), members), "model")
    expected = decision(gang(1, 4, **{PRODUCT: "V100"}), *nodes)
    assert got == [Answer(probe="model", text=f"would start on {PRODUCT}=V100 (it asks for A100)",
                          change=f"{PRODUCT}=V100", tier="node", domain="v", assignments=expected.assignments)]


def test_a_gang_that_pins_no_model_gets_no_model_answer():
    nodes = [node("a").gpus(8).label(PRODUCT, "A100").busy(0), node("v").gpus(8).label(PRODUCT, "V100")]
    assert answers(what_if(cluster(*nodes), gang(1, 9)), "model") == []


# --- smaller and fewer ----------------------------------------------------------------------------


@pytest.mark.parametrize(("nodes", "members", "expected"), [
    pytest.param([node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)], gang(3, 4),
                 [("gpus 4 -> 3", "would start with 3 GPUs per member instead of 4 GPUs", gang(3, 3))],
                 id="a gang of three 4-GPU members would start with 3 GPUs each"),
    pytest.param([node("a").gpus(8).allocatable(cpu=16_000)], (pod("p").gpus(1).requests(cpu=20_000).spec(),),
                 [("cpu 20000 -> 16000", "would start with 16 CPU per member instead of 20 CPU",
                   (pod("p").gpus(1).requests(cpu=16_000).spec(),))],
                 id="a pod asking more CPU than the node has would start with what it has"),
    pytest.param([node("a").gpus(8).share(0, core=70).share(1, core=70).busy(2, 3, 4, 5, 6, 7)],
                 (pod("t").share(core=40).spec(),),
                 [("core_pct 40 -> 30", "would start with 30% of a GPU's core per member instead of 40% of a GPU's core",
                   (pod("t").share(core=30).spec(),))],
                 id="a share larger than any GPU's free core would start with the largest free one"),
])
def test_smaller_requests(nodes, members, expected):
    got = answers(what_if(cluster(*nodes), members), "smaller")
    want = []
    for change, text, changed in expected:
        fits = decision(changed, *nodes)
        tier, domain = ("node", fits.assignments[0].node) if len({a.node for a in fits.assignments}) == 1 else (
            "hypernode", "h1")
        want.append(Answer(probe="smaller", text=text, change=change, tier=tier, domain=domain,
                           assignments=fits.assignments))
    assert got == want


def test_the_smaller_answer_is_the_largest_that_fits():
    nodes = [node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)]
    (a,) = answers(what_if(cluster(*nodes), gang(3, 4)), "smaller")
    assert isinstance(decide(cluster(*nodes), gang(3, 3)), Decision)
    assert isinstance(decide(cluster(*nodes), gang(3, 4)), NoFit)  # one more GPU each is refused
    assert a.change == "gpus 4 -> 3"


@pytest.mark.parametrize(("nodes", "n", "gpus", "k"), [
    pytest.param([node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)], 3, 4, 2,
                 id="a gang of three would start with two"),
    pytest.param([node(f"n{i}").gpus(8).tiers(**H1) for i in range(3)], 5, 8, 3,
                 id="five 8-GPU members on three free nodes: three"),
    pytest.param([node("a").gpus(8).busy(0, 1, 2, 3, 4, 5, 6, 7)], 2, 1, None,
                 id="a gang none of whose members fits gets no answer"),
])
def test_fewer_members(nodes, n, gpus, k):
    members = gang(n, gpus)
    got = answers(what_if(cluster(*nodes), members), "fewer")
    if k is None:
        assert got == []
        return
    fits = decision(members[:k], *nodes)
    (answer,) = got
    assert answer == Answer(probe="fewer", text=f"would start now with {k} of its {n} members", members=k,
                            tier=answer.tier, domain=answer.domain, assignments=fits.assignments)
    assert isinstance(decide(cluster(*nodes), members[:k + 1]), NoFit)  # one more is refused


# --- the whole ------------------------------------------------------------------------------------


def test_answers_come_in_the_documented_order_and_the_top_line_is_the_first_that_starts():
    tree = QueueTree.of([QueueSpec(name="team", limit=12 * GPU_UNITS)])
    nodes = [node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)]
    ctx = ProbeContext(queue=QueueView(tree=tree, held={"team": 4 * GPU_UNITS}),
                       holders=held_by(team_x=(bg("a", 0),), team_y=(bg("b", 0),)), now=NOW)
    result = what_if(cluster(*nodes), gang(3, 4, queue="team"), ctx=ctx)
    assert [(a.probe, a.starts) for a in result.answers] == [
        ("queue-limit", False), ("wait", False), ("smaller", True), ("fewer", True)]
    assert top_line(result) == "would start with 2 GPUs per member instead of 4 GPUs"  # the limit leaves 8
    assert result.cut == ()


def test_probes_out_of_time_are_named_with_every_probe_after_them():
    ticks = itertools.count()
    nodes = [node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)]
    result = what_if(cluster(*nodes), gang(3, 4), budget_s=3, clock=lambda: float(next(ticks)))
    assert result.cut == ("wait", "preempt", "tier", "model", "smaller", "fewer")
    assert result.answers == ()


def test_the_cluster_is_not_changed_by_the_probes():
    nodes = [node("a").gpus(8).tiers(**H1).busy(0, 1, 2), node("b").gpus(8).tiers(**H1).busy(4, 5)]
    c = cluster(*nodes)
    before = {n: (set(st.whole), dict(st.core)) for n, st in c.nodes.items()}
    what_if(c, gang(3, 4), ctx=ProbeContext(holders=held_by(team_x=(bg("a", 0),))))
    assert {n: (set(st.whole), dict(st.core)) for n, st in c.nodes.items()} == before


@pytest.mark.parametrize(("fits_below", "high", "expected"), [
    pytest.param(5, 10, 4, id="the largest value below the first refused one"),
    pytest.param(1, 10, None, id="none when even the lowest is refused"),
    pytest.param(10, 10, 9, id="one below the known refused bound when all below fit"),
])
def test_largest_fitting_decides_both_bounds(fits_below, high, expected):
    asked = []

    def fits(v):
        asked.append(v)
        return v < fits_below

    got = largest_fitting(fits, 1, high)
    assert got == expected
    if got is not None:
        assert got in asked and (got + 1 == high or got + 1 in asked)
