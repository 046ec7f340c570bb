"""The stranding-aware packing score and the TDM share search: the engine's side of
docs/packing.md, checked against the research model it came from."""

from __future__ import annotations

import random

import pytest
from engine_builders import node, pod, snapshot

from phalanx_bench.sharepack import TargetMix, WorkloadShape
from phalanx_engine.decide import Cluster, decide, default_profile
from phalanx_engine.framework import Member
from phalanx_engine.packing import ShapeMix, StrandingScore
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, PodRef


def run(*nodes, members, profile=None):
    cluster = Cluster.from_snapshot(snapshot(*nodes))
    return decide(cluster, tuple(m.spec() for m in members), profile or default_profile())


def share_on(node_name: str, gpu: int, core: int, cpu: int) -> Assignment:
    return Assignment(pod=PodRef(namespace="default", name="s"), node=node_name, gpus=(gpu,), gpu_uuids=("",),
                      core_pct=core, requests={"cpu": cpu})


def test_a_share_that_opens_a_gpu_goes_where_the_cpu_could_not_feed_that_gpu_anyway():
    got = run(node("rich").gpus(2).allocatable(cpu=64_000), node("poor").gpus(2).allocatable(cpu=2_000),
              members=[pod("s").share(core=50).requests(cpu=1000)])
    assert got == Decision(assignments=(share_on("poor", 0, 50, 1000),))


def test_tightness_comes_before_the_stranding_score():
    got = run(node("rich").gpus(2).allocatable(cpu=64_000).share(1, core=60),
              node("poor").gpus(2).allocatable(cpu=2_000),
              members=[pod("s").share(core=40).requests(cpu=1000)])
    assert got == Decision(assignments=(share_on("rich", 1, 40, 1000),))


@pytest.mark.parametrize(("nodes", "expected"), [
    pytest.param([node("a").gpus(8).busy(0, 1, 2, 3, 4, 5), node("b").gpus(8)], "a",
                 id="between nodes with CPU to spare, best fit by free GPUs"),
    pytest.param([node("a").gpus(8).busy(0, 1, 2, 3, 4, 5), node("b").gpus(8).allocatable(cpu=20_000)], "b",
                 id="a node whose CPU cannot feed its free GPUs is used first"),
])
def test_whole_gpus_use_the_gpus_that_would_be_stranded_first(nodes, expected):
    got = run(*nodes, members=[pod("w").gpus(1)])
    assert isinstance(got, Decision) and got.assignments[0].node == expected


def test_assume_books_a_decision_so_the_next_one_sees_it():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(8), node("b").gpus(8).busy(0)))
    first = decide(cluster, (pod("p").gpus(7).spec(),))
    assert isinstance(first, Decision) and first.assignments[0].node == "b"
    cluster.assume(first.assignments)
    share = decide(cluster, (pod("s").share(core=30).spec(),))
    assert isinstance(share, Decision) and share.assignments[0].node == "a"
    cluster.assume(share.assignments)
    assert (cluster.by_free[0], cluster.by_core[70], cluster.by_core[100]) == ({"b"}, {"a"}, {"a"})


@pytest.mark.parametrize("seed", range(5))
def test_the_engines_fragmentation_is_the_research_models(seed):
    rng = random.Random(seed)
    shapes = [(rng.choice((0, 2000, 8000)), rng.choice((0, 250, 500, 1000)), 0, 0.0) for _ in range(4)]
    shapes = [(cpu, milli, 1 if milli else 0, p) for cpu, milli, _, p in shapes]
    probs = [rng.random() for _ in shapes]
    shapes = [(cpu, milli, n, p / sum(probs)) for (cpu, milli, n, _), p in zip(shapes, probs, strict=True)]
    research = TargetMix(WorkloadShape(cpu, milli, n, None, p) for cpu, milli, n, p in shapes)
    engine = ShapeMix(shapes)
    for _ in range(20):
        cpu = rng.randrange(0, 16_000)
        gpus = tuple(sorted((rng.choice((0, 200, 500, 1000)) for _ in range(4)), reverse=True))
        assert engine.fragmentation(cpu, gpus) == pytest.approx(research.fragmentation(cpu, gpus, None))


def test_a_node_without_reported_state_scores_neutrally():
    n = node("a").gpus(2).unreported().state()
    m = Member.of(pod("s").share(core=10).spec())
    assert StrandingScore().score(m, n, share_on("a", 0, 10, 0)) == 0


@pytest.mark.parametrize("seed", range(5))
def test_the_fast_stranding_path_scores_like_the_general_one(seed):
    rng = random.Random(seed)
    shared = rng.sample(range(8), 3)
    n = node("a").gpus(8).allocatable(cpu=rng.randrange(0, 96_000))
    for g in shared:
        n = n.share(g, core=rng.choice((10, 40, 90)))
    st = n.busy(*[g for g in range(8) if g not in shared][:2]).state()
    for p in (pod("s").share(core=30).requests(cpu=4000), pod("w").gpus(2).requests(cpu=8000), pod("c").requests(cpu=1)):
        m = Member.of(p.spec())
        got = default_profile().allocators[m.kind].allocate(m, st)
        assert isinstance(got, Assignment)
        assert StrandingScore().score(m, st, got) == StrandingScore(mix=ShapeMix(())).score(m, st, got)
