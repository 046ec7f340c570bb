"""Preferred pod affinity and anti-affinity (``podaffinity.preference``, the
``PodAffinityPreference`` score): kube-scheduler's InterPodAffinity score from the pod's own
preferred terms, ranked after the GPU set's quality and before packing; and the node's own
preferences (PreferNoSchedule taints, preferred node affinity), ranked before it."""

from __future__ import annotations

from engine_builders import node, pod, snapshot, term

from phalanx_engine import podaffinity
from phalanx_engine.cluster import Cluster
from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision
from phalanx_proto.scheduling import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
)

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def weighted(weight: int, key: str, *reqs: tuple, **kw) -> WeightedPodAffinityTerm:
    return WeightedPodAffinityTerm(weight=weight, term=term(key, *reqs, **kw))


def hosts(*builders):
    return [b.label(HOST, b.name) for b in builders]


def placed_on(cluster: Cluster, spec) -> str:
    got = decide(cluster, (spec,))
    assert isinstance(got, Decision), got
    cluster.assume(got.assignments)
    (a,) = got.assignments
    return a.node


def test_the_score_adds_affinity_weights_and_takes_anti_affinity_weights_per_selected_pod_in_the_domain():
    views = snapshot(node("a").label(ZONE, "z1").pod_here(app="db").pod_here(app="db").pod_here(app="web"),
                     node("b").label(ZONE, "z1"), node("c").label(ZONE, "z2").pod_here(app="web"),
                     node("d").pod_here(app="db"))
    p = (pod("p").pod_affinity_preferred(weighted(10, ZONE, ("app", "In", "db")))
         .pod_anti_affinity_preferred(weighted(3, ZONE, ("app", "In", "web"))).spec())
    cluster = Cluster.from_snapshot(views)
    with podaffinity.trial(cluster.affinity_pods()) as pods:
        score = pods.preference(p)
        by_node = {n: podaffinity.preferred_score(score, st.view.kube.labels) for n, st in sorted(cluster.nodes.items())}
    assert score == {(ZONE, "z1"): 2 * 10 - 3, (ZONE, "z2"): -3}  # d has no zone: its pod counts nowhere
    assert by_node == {"a": 17, "b": 17, "c": -3, "d": 0}


def test_two_replicas_preferring_different_hosts_go_to_different_hosts_where_packing_would_stack_them():
    apart = weighted(100, HOST, ("app", "In", "web"))
    with_term = Cluster.from_snapshot(snapshot(*hosts(node("n0").gpus(8), node("n1").gpus(8))))
    first = placed_on(with_term, pod("w0").gpus(1).labels(app="web").pod_anti_affinity_preferred(apart).spec())
    second = placed_on(with_term, pod("w1").gpus(1).labels(app="web").pod_anti_affinity_preferred(apart).spec())
    assert first != second
    without = Cluster.from_snapshot(snapshot(*hosts(node("n0").gpus(8), node("n1").gpus(8))))
    assert placed_on(without, pod("w0").gpus(1).labels(app="web").spec()) == \
        placed_on(without, pod("w1").gpus(1).labels(app="web").spec())


def test_a_pod_preferring_its_database_goes_to_its_host_over_a_fuller_one():
    views = snapshot(*hosts(node("full").gpus(8).busy(0, 1, 2, 3, 4, 5), node("db").gpus(8).pod_here(app="db")))
    near = weighted(50, HOST, ("app", "In", "db"))
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).spec()) == "full"
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).pod_affinity_preferred(near).spec()) == "db"


def test_the_gpu_sets_quality_comes_before_a_preference():
    # On "a" only GPUs 0 and 5 are free (SYS between them); "b" has an NVLink pair free.
    views = snapshot(*hosts(node("a").gpus(8).busy(1, 2, 3, 4, 6, 7).pod_here(app="db"), node("b").gpus(8)))
    p = pod("p").gpus(2).pod_affinity_preferred(weighted(100, HOST, ("app", "In", "db"))).spec()
    assert placed_on(Cluster.from_snapshot(views), p) == "b"


def test_a_preference_beyond_the_first_eight_feasible_nodes_is_still_found():
    # twelve fuller nodes come first in the packing order; the preferred one is emptiest
    views = snapshot(*hosts(*(node(f"f{i:02}").gpus(8).busy(0, 1, 2, 3) for i in range(12)),
                            node("z-db").gpus(8).pod_here(app="db")))
    p = pod("p").gpus(1).pod_affinity_preferred(weighted(1, HOST, ("app", "In", "db"))).spec()
    assert placed_on(Cluster.from_snapshot(views), p) == "z-db"


# -- the node's own preferences: PreferNoSchedule taints and preferred node affinity ------------
def test_a_node_with_an_untolerated_prefer_no_schedule_taint_ranks_below_one_without():
    views = snapshot(node("fuller").gpus(8).busy(0, 1, 2, 3).taint("spot", "yes", "PreferNoSchedule"), node("other").gpus(8))
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).spec()) == "other"
    tolerant = pod("p").gpus(1).tolerate("spot", "yes", effect="PreferNoSchedule").spec()
    assert placed_on(Cluster.from_snapshot(views), tolerant) == "fuller"  # tolerated: packing decides again


def test_preferred_node_affinity_ranks_the_heavier_match_first_and_an_empty_term_matches_every_node():
    views = snapshot(node("a").gpus(8).busy(0, 1, 2, 3).label("tier", "silver"), node("b").gpus(8).label("tier", "gold"))
    gold = WeightedNodeSelectorTerm(weight=10, term=NodeSelectorTerm(match_expressions=(
        NodeSelectorRequirement(key="tier", operator="In", values=("gold",)),)))
    silver = WeightedNodeSelectorTerm(weight=3, term=NodeSelectorTerm(match_expressions=(
        NodeSelectorRequirement(key="tier", operator="In", values=("silver",)),)))
    anything = WeightedNodeSelectorTerm(weight=50, term=NodeSelectorTerm())
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).spec()) == "a"  # packing
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).prefer_nodes(gold, silver).spec()) == "b"
    assert placed_on(Cluster.from_snapshot(views), pod("p").gpus(1).prefer_nodes(silver, anything).spec()) == "a"
