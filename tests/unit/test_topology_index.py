"""The topology index a ``Cluster`` keeps (``phalanx_engine.topology.Topology``) equals a fresh
scan of its nodes by ``domain_of`` after any sequence of ``upsert``, ``remove`` and ``assume``:
the same domains with the same nodes, free whole GPUs and whole capacity at every tier, the
same sums without avoided nodes, the same tightest tier for a set of nodes. The gang search, the
preemption planner and the what-if probes read domains from it instead of scanning."""

from __future__ import annotations

import dataclasses

import pytest
from engine_builders import node, pod, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import NodeView
from phalanx_engine.topology import TIERS, Topology, domain_of
from phalanx_engine.whatif import tier_of
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.topology import NetworkTiers

NAMES = [f"n{i}" for i in range(6)]
DOMAINS = ["", "a", "b"]
"""Domain values a node reports at a tier; "" (none) makes it alone there."""


def scan(cluster: Cluster) -> dict[str, dict[str, tuple[list[str], int, int]]]:
    """Tier → domain → (sorted names, free whole GPUs, whole capacity), by ``domain_of`` over every usable node."""
    out: dict[str, dict[str, tuple[list[str], int, int]]] = {}
    for tier in TIERS:
        grouped: dict[str, list] = {}
        for s in cluster.nodes.values():
            grouped.setdefault(domain_of(s, tier), []).append(s)
        out[tier] = {d: (sorted(s.name for s in ns), sum(len(s.free_whole()) for s in ns),
                         sum(s.whole_capacity() for s in ns)) for d, ns in grouped.items()}
    return out


def indexed(topology: Topology) -> dict[str, dict[str, tuple[list[str], int, int]]]:
    """The same shape, read from the index."""
    return {tier: {d: (sorted(names), topology.free_whole_in(tier, d), topology.whole_capacity_in(tier, d))
                   for d, names in topology.domains(tier).items()} for tier in TIERS}


def without(cluster: Cluster, tier: str, avoid: frozenset[str]) -> dict[str, tuple[int, int]]:
    """``Topology.sums`` by a scan: per domain with a node outside ``avoid``, its (free, capacity) outside it."""
    out: dict[str, tuple[int, int]] = {}
    for s in cluster.nodes.values():
        if s.name not in avoid:
            f, c = out.get(domain_of(s, tier), (0, 0))
            out[domain_of(s, tier)] = (f + len(s.free_whole()), c + s.whole_capacity())
    return out


def tightest(cluster: Cluster, names: list[str]) -> tuple[str, str]:
    """``Topology.tier_of`` by a scan with ``domain_of``."""
    names = sorted(set(names))
    if len(names) <= 1:
        return "node", names[0] if names else ""
    states = [cluster.nodes[n] for n in names if n in cluster.nodes]
    for tier in TIERS[1:]:
        values = {domain_of(s, tier) for s in states}
        if len(values) == 1:
            return tier, values.pop()
    return "cluster", ""


def whole(cluster: Cluster) -> tuple:
    """Everything a decision reads of a cluster (an index bucket left empty is no bucket)."""
    return (cluster.nodes, cluster.total, cluster.excluded, {k: v for k, v in cluster.by_free.items() if v},
            {k: v for k, v in cluster.by_core.items() if v}, cluster._levels, cluster._room, indexed(cluster.topology))


upserts = st.tuples(st.just("upsert"), st.sampled_from(NAMES), st.sampled_from([0, 2, 8]),
                    st.tuples(*[st.sampled_from(DOMAINS)] * 3), st.sets(st.integers(0, 7)),
                    st.sampled_from(["usable", "usable", "stale", "mig"]))
removes = st.tuples(st.just("remove"), st.sampled_from(NAMES))
assumes = st.tuples(st.just("assume"), st.sampled_from(NAMES), st.sets(st.integers(0, 7), min_size=1),
                    st.booleans())
changes = st.lists(st.one_of(upserts, removes, assumes), max_size=40)


def view(name: str, gpus: int, tiers: tuple[str, str, str], busy: set[int], kind: str) -> NodeView:
    b = node(name).gpus(gpus, mig=kind == "mig")
    if busy & set(range(gpus)) and kind != "mig":
        b.busy(*sorted(busy & set(range(gpus))))
    if kind == "stale":
        b.stale()
    hypernode, leaf, netpod = tiers
    return dataclasses.replace(b.view(), tiers=NetworkTiers(hypernode=hypernode, leaf=leaf, netpod=netpod))


def apply(cluster: Cluster, change: tuple, k: int) -> None:
    match change:
        case ("upsert", name, gpus, tiers, busy, kind):
            cluster.upsert(view(name, gpus, tiers, busy, kind))
        case ("remove", name):
            cluster.remove(name)
        case ("assume", name, gpus, share):
            s = cluster.nodes.get(name)
            free = sorted(gpus & s.free_whole()) if s is not None else []
            if free:
                pod = PodRef(namespace="t", name=f"p{k}")
                cluster.assume([Assignment(pod=pod, node=name, gpus=(free[0],), core_pct=30, memory_mib=1024) if share
                                else Assignment(pod=pod, node=name, gpus=tuple(free))])


@settings(max_examples=300)
@given(changes, st.integers(0, 40), st.sets(st.sampled_from([*NAMES, "ghost"])),
       st.lists(st.sampled_from([*NAMES, "ghost"]), max_size=4))
def test_the_index_equals_a_fresh_scan_after_any_changes(steps, first_read, avoid, names):
    """The index is built on its first read (``first_read`` changes in) and kept in step after."""
    cluster = Cluster(nodes={}, total=0)
    for k, change in enumerate(steps):
        if k == first_read:
            assert indexed(cluster.topology) == scan(cluster)
        apply(cluster, change, k)
    assert indexed(cluster.topology) == scan(cluster)
    for tier in TIERS:
        assert cluster.topology.sums(tier, frozenset(avoid)) == without(cluster, tier, frozenset(avoid))
        assert {n: cluster.topology.domain(n, tier) for n in cluster.nodes} == {
            n: domain_of(s, tier) for n, s in cluster.nodes.items()}
    assert cluster.topology.tier_of(names) == tightest(cluster, names)


@settings(max_examples=100)
@given(changes, st.lists(st.one_of(upserts, removes), max_size=20))
def test_a_copy_keeps_the_indexes_and_changes_apart_from_its_original(before, after):
    """``Cluster.copy`` (the preemption planner's scratch) copies the indexes instead of
    rebuilding them: equal to a cluster built over the same states, and changed by ``put``,
    ``upsert`` and ``remove`` without touching the original."""
    cluster = Cluster(nodes={}, total=0)
    for k, change in enumerate(before):
        apply(cluster, change, k)
    decide(cluster, (pod("p").gpus(1).spec(),))  # fills the sorted buckets the copy must keep in step
    assert indexed(cluster.topology) == scan(cluster)  # and builds the index the copy must copy
    kept = indexed(cluster.topology), dict(cluster.nodes), {k: set(v) for k, v in cluster.by_free.items()}
    copy = cluster.copy()
    rebuilt = Cluster(nodes=dict(cluster.nodes), total=cluster.total, excluded=dict(cluster.excluded))
    assert (whole(copy), sorted(vars(copy))) == (whole(rebuilt), sorted(vars(rebuilt)))
    for k, change in enumerate(after):
        apply(copy, change, k)
    assert indexed(copy.topology) == scan(copy)
    for c in (copy, cluster):
        assert all(names == sorted((c.by_core if shares else c.by_free)[key]) for (shares, key), names in c._sorted.items())
    assert (indexed(cluster.topology), cluster.nodes, cluster.by_free) == kept


@pytest.mark.parametrize("names, expected", [
    (["a1"], ("node", "a1")),
    ([], ("node", "")),
    (["a1", "a2"], ("hypernode", "hn-a")),
    (["a1", "b1"], ("leaf", "leaf-1")),
    (["a1", "c1"], ("netpod", "pod-1")),
    (["a1", "d1"], ("cluster", "")),
    (["u1", "u2"], ("netpod", "pod-1")),
    (["x1", "x2"], ("cluster", "")),
    (["a1", "gone"], ("hypernode", "hn-a")),
], ids=["one node is its own domain", "no node", "two nodes of one HyperNode", "two HyperNodes of one leaf",
        "two leaves of one network-pod", "two network-pods", "nodes reporting no HyperNode or leaf share only the pod",
        "nodes reporting no domain at all share none", "a node the cluster does not hold is left out"])
def test_tier_of_names_the_tightest_domain_holding_every_node(names, expected):
    cluster = Cluster.from_snapshot(snapshot(
        node("a1").gpus(8).tiers(hypernode="hn-a", leaf="leaf-1", netpod="pod-1"),
        node("a2").gpus(8).tiers(hypernode="hn-a", leaf="leaf-1", netpod="pod-1"),
        node("b1").gpus(8).tiers(hypernode="hn-b", leaf="leaf-1", netpod="pod-1"),
        node("c1").gpus(8).tiers(hypernode="hn-c", leaf="leaf-2", netpod="pod-1"),
        node("d1").gpus(8).tiers(hypernode="hn-d", leaf="leaf-3", netpod="pod-2")))
    for name, netpod in (("u1", "pod-1"), ("u2", "pod-1"), ("x1", ""), ("x2", "")):
        b = node(name).gpus(8)
        cluster.upsert(dataclasses.replace(b.view(), tiers=NetworkTiers(netpod=netpod)))
    assert cluster.topology.tier_of(names) == expected


def test_what_if_names_the_domain_the_engine_placed_in_when_nodes_report_no_hypernode():
    """Nodes that report no HyperNode or leaf are each alone at those tiers (``domain_of``): a
    gang across two of them is placed in their network-pod, and ``tier_of`` says so (before
    #42 it read the raw labels and named HyperNode "")."""
    views = [dataclasses.replace(node(n).gpus(8).view(), tiers=NetworkTiers(netpod="pod-1")) for n in ("u1", "u2")]
    cluster = Cluster(nodes={}, total=0)
    for v in views:
        cluster.upsert(v)
    placed = decide(cluster, (pod("g-0").gpus(8).spec(), pod("g-1").gpus(8).spec()))
    assert sorted(a.node for a in placed.assignments) == ["u1", "u2"]
    assert tier_of(cluster, placed.assignments) == ("netpod", "pod-1")
