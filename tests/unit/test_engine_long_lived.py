"""A long-lived ``Cluster`` changed node by node (``upsert``/``remove``/``assume``) decides
exactly as one built afresh from the same nodes: placement's cache relies on it."""

from __future__ import annotations

import random

import pytest
from engine_builders import node, pod, snapshot

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.snapshot import Snapshot


def _summary(cluster: Cluster) -> tuple:
    """What a decision reads of a cluster: usable nodes' free GPUs, indexes, excluded, total."""
    return (sorted((n, sorted(s.free_whole())) for n, s in cluster.nodes.items()),
            {k: v for k, v in cluster.by_free.items() if v}, sorted(cluster.excluded), cluster.total)


@pytest.mark.parametrize("steps, expected_nodes, expected_excluded, expected_total", [
    ([("up", node("a").gpus(8))], ["a"], [], 1),
    ([("up", node("a").gpus(8)), ("up", node("a").gpus(8).stale())], [], ["a"], 1),
    ([("up", node("a").gpus(8).disabled()), ("up", node("a").gpus(8))], ["a"], [], 1),
    ([("up", node("a").gpus(8)), ("rm", "a")], [], [], 0),
    ([("up", node("a").gpus(8).stale()), ("rm", "a"), ("rm", "a")], [], [], 0),
    ([("rm", "ghost"), ("up", node("b").gpus(4))], ["b"], [], 1),
], ids=["a usable node is added", "a node going stale moves to excluded", "an enabled node comes back",
        "a removed node is gone", "removing twice is harmless", "an unknown name is ignored"])
def test_upsert_and_remove_keep_nodes_excluded_and_total_in_step(steps, expected_nodes, expected_excluded,
                                                                  expected_total):
    cluster = Cluster(nodes={}, total=0)
    for op, arg in steps:
        cluster.upsert(arg.view()) if op == "up" else cluster.remove(arg)
    assert (sorted(cluster.nodes), sorted(cluster.excluded), cluster.total) == (
        expected_nodes, expected_excluded, expected_total)


@pytest.mark.parametrize("seed", range(5))
def test_random_changes_leave_the_cluster_equal_to_one_built_from_the_final_nodes(seed):
    rng = random.Random(seed)
    cluster = Cluster(nodes={}, total=0)
    final = {}
    for _ in range(60):
        name = f"n{rng.randrange(8)}"
        if rng.random() < 0.2:
            cluster.remove(name)
            final.pop(name, None)
            continue
        b = node(name).gpus(8).tiers(hypernode=f"hn{int(name[1:]) // 4}")
        for g in rng.sample(range(8), rng.randrange(9)):
            b.busy(g)
        if rng.random() < 0.15:
            b.stale()
        view = b.view()
        cluster.upsert(view)
        final[name] = view
    fresh = Cluster.from_snapshot(Snapshot(nodes=tuple(final[n] for n in sorted(final))))
    assert _summary(cluster) == _summary(fresh)
    for members in ([pod("p").gpus(1).spec()], [pod("g1").gpus(4).spec(), pod("g2").gpus(4).spec()]):
        assert decide(cluster, tuple(members)) == decide(fresh, tuple(members))


def test_an_assumed_decision_takes_its_gpus_from_the_next_decision():
    cluster = Cluster.from_snapshot(snapshot(node("a").gpus(2)))
    first = decide(cluster, (pod("p").gpus(2).spec(),))
    cluster.assume(first.assignments)
    again = decide(cluster, (pod("q").gpus(1).spec(),))
    assert again.summary == "0/1 nodes are available: 1 insufficient free GPUs."
