"""Hard topology spread (``spread``, the ``PodTopologySpread`` filter): hand-worked cases of
kube-scheduler v1.36's semantics (domains, counts, self-match, minDomains, node inclusion
policies), each node's whole status; and gangs whose members count each other within one
decision."""

from __future__ import annotations

import math

import pytest
from engine_builders import each_node, node, pod, snapshot, spread

from phalanx_engine import kube_plugins as kp
from phalanx_engine import podaffinity
from phalanx_engine import spread as sp
from phalanx_engine.cluster import Cluster
from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import Code, NoFit, Reason, Status
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.scheduling import RunningPod

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"

SKEW = Status(plugin="PodTopologySpread", reasons=(Reason(code=Code.TOPOLOGY_SPREAD, text=sp.R_SPREAD),),
              resolvable=True)
LABEL = Status(plugin="PodTopologySpread", reasons=(Reason(code=Code.TOPOLOGY_SPREAD_LABEL, text=sp.R_SPREAD_LABEL),),
               resolvable=False)
WEB = spread(ZONE, ("app", "In", "web"))


def nodes(a=(), c=(), *, taint_c=False, a_reserved=()):
    """a and b in zone z1, c in z2, d without a zone label; pods as (namespace, labels, terminating)."""
    na, nb, nc, nd = (node("a").label(ZONE, "z1"), node("b").label(ZONE, "z1"), node("c").label(ZONE, "z2"),
                      node("d"))
    for n, pods in ((na, a), (nc, c)):
        for ns, labels, terminating in pods:
            n.pod_here(ns, (), terminating, **labels)
    if taint_c:
        nc.taint("dedicated", "infra")
    for r in a_reserved:
        na.reserved(r)
    return (na, nb, nc, nd)


def verdicts(p, builders) -> dict[str, Status | None]:
    return each_node(kp.PodTopologySpread(), p, builders)


def each(a=None, b=None, c=None, d=LABEL) -> dict[str, Status | None]:
    return {"a": a, "b": b, "c": c, "d": d}


WEB_POD = ("default", {"app": "web"}, False)
WEB_ON_A = (WEB_POD,)


@pytest.mark.parametrize(("p", "builders", "expected"), [
    pytest.param(pod("p").labels(app="web").spread(WEB), nodes(a=WEB_ON_A), each(SKEW, SKEW),
                 id="z1 has one, z2 none: a second in z1 would skew by 2; a node without the key is refused"),
    pytest.param(pod("p").labels(app="web").spread(spread(ZONE, ("app", "In", "web"), max_skew=2)),
                 nodes(a=WEB_ON_A), each(), id="maxSkew 2 allows it"),
    pytest.param(pod("p").spread(WEB), nodes(a=WEB_ON_A), each(),
                 id="a pod its own selector does not match adds nothing to the skew"),
    pytest.param(pod("p").labels(app="web").spread(WEB), nodes(a=(("other", {"app": "web"}, False),)), each(),
                 id="only pods of the pod's namespace count"),
    pytest.param(pod("p").labels(app="web").spread(WEB), nodes(a=(("default", {"app": "web"}, True),)), each(),
                 id="a terminating pod does not count"),
    pytest.param(pod("p").labels(app="web").spread(spread(ZONE, match_none=True)), nodes(a=WEB_ON_A), each(),
                 id="no labelSelector: counts nothing, not even the pod itself"),
    pytest.param(pod("p").labels(app="web").spread(spread(ZONE)), nodes(a=WEB_ON_A * 3), each(),
                 id="labelSelector {}: the pods already there count none (kube-scheduler's empty selector)"),
    pytest.param(pod("p").labels(app="web").selector(**{ZONE: "z1"}).spread(WEB), nodes(a=WEB_ON_A), each(),
                 id="nodeAffinityPolicy Honor: only z1 is a domain, its count the least"),
    pytest.param(pod("p").labels(app="web").selector(**{ZONE: "z1"})
                 .spread(spread(ZONE, ("app", "In", "web"), honor_node_affinity=False)), nodes(a=WEB_ON_A),
                 each(SKEW, SKEW), id="nodeAffinityPolicy Ignore: z2 is a domain with none"),
    pytest.param(pod("p").labels(app="web").spread(WEB), nodes(a=WEB_ON_A, c=(WEB_POD,)), each(),
                 id="one in each zone: a second anywhere is a skew of 1"),
    pytest.param(pod("p").labels(app="web").spread(spread(ZONE, ("app", "In", "web"), min_domains=3)),
                 nodes(a=WEB_ON_A, c=(WEB_POD,)), each(SKEW, SKEW, SKEW),
                 id="minDomains 3 with two domains: the least is taken as 0"),
    pytest.param(pod("p").labels(app="web").spread(spread(ZONE, ("app", "In", "web"), honor_taints=True)),
                 nodes(a=WEB_ON_A, taint_c=True), each(),
                 id="nodeTaintsPolicy Honor: c's untolerated taint takes z2 out of the domains"),
    pytest.param(pod("p").labels(app="web").spread(WEB), nodes(a=WEB_ON_A, taint_c=True), each(SKEW, SKEW),
                 id="nodeTaintsPolicy Ignore (the default): z2 stays a domain"),
    pytest.param(pod("p").labels(app="web").spread(WEB),
                 nodes(a_reserved=(Assignment(pod=PodRef(namespace="default", name="w"), node="a",
                                              labels={"app": "web"}),)),
                 each(SKEW, SKEW), id="Phalanx's own reservation counts as a pod there"),
])
def test_pod_topology_spread(p, builders, expected):
    assert verdicts(p, builders) == expected


def test_a_pod_the_agent_could_not_read_counts_nowhere():
    unread = node("a").label(ZONE, "z1")
    unread._k().update(pods=1, running=(RunningPod(namespace="default", unread="pod default/x: metadata.labels …"),))
    others = (node("b").label(ZONE, "z1"), node("c").label(ZONE, "z2"), node("d"))
    assert verdicts(pod("p").labels(app="web").spread(spread(ZONE, ("app", "Exists"))), (unread, *others)) == each()


def hosts(n: int):
    return snapshot(*(node(f"n{i}").gpus(8).label(HOST, f"n{i}").tiers(leaf="l", netpod="p") for i in range(n)))


def spread_gang(n: int, skew: int = 1) -> tuple:
    c = spread(HOST, ("app", "In", "x"), max_skew=skew)
    return tuple(pod(f"m{i}").gpus(1).labels(app="x").spread(c).spec() for i in range(n))


def test_a_gang_spread_over_hosts_counts_its_own_members_as_placed():
    got = decide(Cluster.from_snapshot(hosts(4)), spread_gang(4))
    assert isinstance(got, Decision), got
    assert sorted(a.node for a in got.assignments) == ["n0", "n1", "n2", "n3"]


def test_a_fifth_member_over_four_hosts_goes_where_the_least_is_matched():
    got = decide(Cluster.from_snapshot(hosts(4)), spread_gang(5))
    assert isinstance(got, Decision), got
    used = [a.node for a in got.assignments]
    assert sorted(used.count(n) for n in set(used)) == [1, 1, 1, 2]


def test_a_single_pod_goes_to_the_zone_with_fewest_and_waits_with_the_reason_where_none_will_do():
    views = snapshot(node("a").gpus(8).label(ZONE, "z1").pod_here(app="web"), node("c").gpus(8).label(ZONE, "z2"))
    p = pod("p").gpus(1).labels(app="web").spread(WEB).spec()
    got = decide(Cluster.from_snapshot(views), (p,))
    assert isinstance(got, Decision), got
    assert [a.node for a in got.assignments] == ["c"]
    only_a = snapshot(node("a").gpus(8).label(ZONE, "z1").pod_here(app="web"), node("c").gpus(8).label(ZONE, "z2"),
                      node("e").gpus(8).label(ZONE, "z2").pod_here(app="web").pod_here(app="web"))
    refused = decide(Cluster.from_snapshot(only_a), (pod("p").gpus(1).labels(app="web")
                                                     .spread(spread(ZONE, ("app", "In", "web"), min_domains=3)).spec(),))
    assert isinstance(refused, NoFit), refused
    assert dict(refused.reasons) == {sp.R_SPREAD: 3}
    assert refused.resolvable


# -- ScheduleAnyway --------------------------------------------------------------------------
def soft_scores(p, builders) -> dict[str, float]:
    cluster = Cluster.from_snapshot(snapshot(*builders))
    with podaffinity.trial(cluster.affinity_pods()) as pods:
        counts = sp.soft_counts_in(pods, p.spec())
        return {name: sp.soft_score(p.spec(), counts, st.view.kube.labels) for name, st in sorted(cluster.nodes.items())}


def test_the_soft_score_counts_matching_pods_per_domain_weighted_by_the_domains():
    # zone: z1 (a, b) has two web pods, z2 (c) none; d has no zone. Two domains: weight log(4).
    got = soft_scores(pod("p").labels(app="web").soft_spread(spread(ZONE, ("app", "In", "web"), max_skew=2)),
                      nodes(a=WEB_ON_A * 2))
    w = math.log(4)
    assert got == {"a": -round(2 * w + 1), "b": -round(2 * w + 1), "c": -round(0 * w + 1), "d": -math.inf}


def test_a_replica_spreading_softly_over_hosts_goes_to_the_host_with_fewest():
    c = spread(HOST, ("app", "In", "web"))
    views = snapshot(*(node(f"n{i}").gpus(8).label(HOST, f"n{i}") for i in range(3)))
    cluster = Cluster.from_snapshot(views)
    used = []
    for i in range(3):
        got = decide(cluster, (pod(f"w{i}").gpus(1).labels(app="web").soft_spread(c).spec(),))
        assert isinstance(got, Decision), got
        cluster.assume(got.assignments)
        used.append(got.assignments[0].node)
    assert sorted(used) == ["n0", "n1", "n2"]
    # without it, packing stacks them
    packed = Cluster.from_snapshot(views)
    nodes_ = []
    for i in range(3):
        got = decide(packed, (pod(f"w{i}").gpus(1).labels(app="web").spec(),))
        packed.assume(got.assignments)
        nodes_.append(got.assignments[0].node)
    assert len(set(nodes_)) == 1


def test_soft_spread_never_refuses_a_node():
    views = snapshot(node("a").gpus(8).label(ZONE, "z1").pod_here(app="web").pod_here(app="web"))
    got = decide(Cluster.from_snapshot(views), (pod("p").gpus(1).labels(app="web")
                                                 .soft_spread(spread(ZONE, ("app", "In", "web"))).spec(),))
    assert isinstance(got, Decision) and got.assignments[0].node == "a"
