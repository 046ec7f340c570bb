"""Required inter-pod affinity and anti-affinity (``podaffinity``, the ``InterPodAffinity``
filter): hand-worked cases of kube-scheduler v1.36's semantics, each node's whole status; and
gangs whose members see each other within one decision (JobSet's exclusive placement)."""

from __future__ import annotations

import pytest
from engine_builders import each_node, node, pod, snapshot, term

from phalanx_engine import kube_plugins as kp
from phalanx_engine import podaffinity
from phalanx_engine.cluster import Cluster
from phalanx_engine.decide import decide
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import Code, NoFit, Reason, Status
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.scheduling import RunningPod

ZONE = "topology.kubernetes.io/zone"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
LEAF = "example.com/leaf"


def status(code: Code, text: str, resolvable: bool) -> Status:
    return Status(plugin="InterPodAffinity", reasons=(Reason(code=code, text=text),), resolvable=resolvable)


AFF = status(Code.POD_AFFINITY, podaffinity.R_AFFINITY, False)
ANTI = status(Code.POD_ANTI_AFFINITY, podaffinity.R_ANTI_AFFINITY, True)
EXISTING = status(Code.EXISTING_POD_ANTI_AFFINITY, podaffinity.R_EXISTING_ANTI_AFFINITY, True)

DB = term(ZONE, ("app", "In", "db"))
WEB = term(ZONE, ("app", "In", "web"))


def nodes(a=(), c=(), d=(), a_reserved=()):
    """a and b in zone z1, c in z2, d without a zone label; pods given as NodeBuilder.pod_here args."""
    na, nb, nc, nd = (node("a").label(ZONE, "z1"), node("b").label(ZONE, "z1"), node("c").label(ZONE, "z2"),
                      node("d"))
    for n, pods in ((na, a), (nc, c), (nd, d)):
        for ns, labels, anti in pods:
            n.pod_here(ns, anti, **labels)
    for r in a_reserved:
        na.reserved(r)
    return (na, nb, nc, nd)


def verdicts(p, builders) -> dict[str, Status | None]:
    return each_node(kp.InterPodAffinity(), p, builders)


def each(a=None, b=None, c=None, d=None) -> dict[str, Status | None]:
    return {"a": a, "b": b, "c": c, "d": d}


DB_ON_A = (("default", {"app": "db"}, ()),)
WEB_ON_A = (("default", {"app": "web"}, ()),)
PHALANX_WEB_ON_A = (Assignment(pod=PodRef(namespace="default", name="w"), node="a", labels={"app": "web"}),)


@pytest.mark.parametrize(("p", "builders", "expected"), [
    pytest.param(pod("p").pod_affinity(DB), nodes(a=DB_ON_A), each(c=AFF, d=AFF),
                 id="affinity: the zone of a matching pod; a node without the zone label is in no zone"),
    pytest.param(pod("p").pod_affinity(DB), nodes(), each(AFF, AFF, AFF, AFF),
                 id="affinity: no matching pod anywhere and the pod does not match its own term"),
    pytest.param(pod("p").labels(app="db").pod_affinity(DB), nodes(), each(d=AFF),
                 id="affinity: the first pod of a group (matches its own term) goes to any node with the key"),
    pytest.param(pod("p").labels(app="db").pod_affinity(DB), nodes(c=DB_ON_A), each(AFF, AFF, None, AFF),
                 id="affinity: once one exists, the first-pod rule no longer applies"),
    pytest.param(pod("p").pod_affinity(DB), nodes(d=DB_ON_A), each(AFF, AFF, AFF, AFF),
                 id="affinity: a matching pod on a node without the key counts nowhere"),
    pytest.param(pod("p").labels(app="db").pod_affinity(DB), nodes(d=DB_ON_A), each(d=AFF),
                 id="affinity: ... so the first-pod rule still applies"),
    pytest.param(pod("p").pod_affinity(DB), nodes(c=(("other", {"app": "db"}, ()),)), each(AFF, AFF, AFF, AFF),
                 id="affinity: no namespaces means the pod's own; a pod in another namespace does not match"),
    pytest.param(pod("p").pod_affinity(term(ZONE, ("app", "In", "db"), namespaces=("other",))),
                 nodes(c=(("other", {"app": "db"}, ()),)), each(AFF, AFF, None, AFF), id="affinity: named namespaces"),
    pytest.param(pod("p").pod_affinity(term(ZONE, ("app", "In", "db"), all_namespaces=True)),
                 nodes(c=(("other", {"app": "db"}, ()),)), each(AFF, AFF, None, AFF),
                 id="affinity: namespaceSelector {} is every namespace"),
    pytest.param(pod("p").pod_affinity(DB, term(ZONE, ("tier", "Exists"))),
                 nodes(a=DB_ON_A, c=(("default", {"tier": "x"}, ()),)), each(AFF, AFF, AFF, AFF),
                 id="affinity: one pod must match every term (two pods matching one each do not)"),
    pytest.param(pod("p").pod_affinity(term(ZONE, match_none=True)), nodes(a=DB_ON_A), each(AFF, AFF, AFF, AFF),
                 id="affinity: no labelSelector selects no pod"),
    pytest.param(pod("p").pod_affinity(term(ZONE)), nodes(c=DB_ON_A), each(AFF, AFF, None, AFF),
                 id="affinity: labelSelector {} selects every pod of the namespace"),
    pytest.param(pod("p").pod_anti_affinity(WEB), nodes(a=WEB_ON_A), each(ANTI, ANTI, None, None),
                 id="anti-affinity: the whole zone of a matching pod; a node without the key is in no zone"),
    pytest.param(pod("p").pod_anti_affinity(WEB), nodes(a_reserved=PHALANX_WEB_ON_A), each(ANTI, ANTI, None, None),
                 id="anti-affinity: Phalanx's own reservation counts as a pod there"),
    pytest.param(pod("p").pod_anti_affinity(term(ZONE, ("app", "NotIn", "web"))), nodes(a=WEB_ON_A),
                 each(), id="anti-affinity: NotIn"),
    pytest.param(pod("p").labels(app="web"), nodes(c=(("default", {"app": "db"}, (WEB,)),)), each(c=EXISTING),
                 id="existing anti-affinity: a running pod's term that selects the incoming pod keeps its zone"),
    pytest.param(pod("p").labels(app="web").namespace("other"), nodes(c=(("default", {"app": "db"}, (WEB,)),)),
                 each(), id="existing anti-affinity: its term's namespace is the existing pod's"),
    pytest.param(pod("p").labels(app="db"), nodes(c=(("default", {"app": "db"}, (WEB,)),)), each(),
                 id="existing anti-affinity: a term that does not select the pod"),
    pytest.param(pod("p").labels(app="web").pod_anti_affinity(WEB),
                 nodes(a=WEB_ON_A, c=(("default", {"app": "db"}, (WEB,)),)), each(ANTI, ANTI, EXISTING, None),
                 id="the pod's own anti-affinity is checked before the existing pods'"),
    pytest.param(pod("p").labels(app="db").pod_affinity(DB).pod_anti_affinity(WEB),
                 nodes(a=DB_ON_A + WEB_ON_A, c=DB_ON_A), each(ANTI, ANTI, None, AFF),
                 id="affinity and anti-affinity together"),
])
def test_inter_pod_affinity(p, builders, expected):
    assert verdicts(p, builders) == expected


def job(name: str, members: int, gpus: int, key: str = LEAF) -> tuple:
    """A JobSet job with exclusive placement per ``key``: the terms JobSet's pod webhook injects
    (pkg/webhooks/pod_mutating_webhook.go)."""
    aff = term(key, (JOB_KEY, "In", name), all_namespaces=True)
    anti = term(key, (JOB_KEY, "Exists"), (JOB_KEY, "NotIn", name), all_namespaces=True)
    return tuple(pod(f"{name}-{i}").gpus(gpus).labels(**{JOB_KEY: name, "index": str(i)})
                 .pod_affinity(aff).pod_anti_affinity(anti).spec() for i in range(members))


def two_leaves():
    return snapshot(*(node(f"{leaf}-{i}").gpus(8).label(LEAF, leaf).tiers(leaf=leaf, netpod="pod")
                      for leaf in ("l1", "l2") for i in range(2)))


def leaves_of(d) -> set[str]:
    assert isinstance(d, Decision), d
    return {a.node.split("-")[0] for a in d.assignments}


def test_exclusive_jobs_take_a_leaf_each_and_a_third_waits_for_anti_affinity():
    cluster = Cluster.from_snapshot(two_leaves())
    first = decide(cluster, job("a", 2, 4))
    assert leaves_of(first) == {"l1"}
    cluster.assume(first.assignments)
    second = decide(cluster, job("b", 4, 2))
    assert leaves_of(second) == {"l2"}
    cluster.assume(second.assignments)
    third = decide(cluster, job("c", 1, 1))
    assert isinstance(third, NoFit)
    assert dict(third.reasons) == {podaffinity.R_ANTI_AFFINITY: 4}
    assert third.resolvable


def test_a_gang_with_exclusive_terms_stays_in_one_leaf_even_where_another_leaf_has_room():
    """Eight 2-GPU members: the search's first domain is a single node (16 GPUs are more than
    a node's 8), so the gang goes to one leaf; the members see each other as placed."""
    cluster = Cluster.from_snapshot(two_leaves())
    got = decide(cluster, job("a", 8, 2))
    assert leaves_of(got) == {"l1"}
    assert isinstance(decide(cluster, job("b", 9, 2)), NoFit)


def test_a_gang_whose_members_keep_apart_goes_one_per_node():
    spread = term("kubernetes.io/hostname", ("app", "In", "x"))
    members = tuple(pod(f"m{i}").gpus(1).labels(app="x").pod_anti_affinity(spread).spec() for i in range(3))
    views = snapshot(*(node(f"n{i}").gpus(8).label("kubernetes.io/hostname", f"n{i}").tiers(leaf="l", netpod="p")
                       for i in range(3)))
    got = decide(Cluster.from_snapshot(views), members)
    assert isinstance(got, Decision)
    assert sorted(a.node for a in got.assignments) == ["n0", "n1", "n2"]
    assert isinstance(decide(Cluster.from_snapshot(views), (*members, pod("m3").gpus(1).labels(app="x")
                                                            .pod_anti_affinity(spread).spec())), NoFit)


def test_a_single_pod_keeps_off_the_node_of_a_pod_its_anti_affinity_selects():
    host = "kubernetes.io/hostname"
    views = snapshot(node("n0").gpus(8).label(host, "n0").pod_here(app="web"), node("n1").gpus(8).label(host, "n1"))
    p = pod("p").gpus(8).pod_anti_affinity(term(host, ("app", "In", "web"))).spec()
    got = decide(Cluster.from_snapshot(views), (p,))
    assert isinstance(got, Decision)
    assert [a.node for a in got.assignments] == ["n1"]
    assert got.assignments[0].anti_affinity == p.pod_anti_affinity


def test_the_reservation_carries_labels_and_anti_affinity_so_later_decisions_respect_it():
    host = "kubernetes.io/hostname"
    views = snapshot(node("n0").gpus(8).label(host, "n0"), node("n1").gpus(8).label(host, "n1"))
    cluster = Cluster.from_snapshot(views)
    keeper = pod("k").gpus(1).labels(app="keeper").pod_anti_affinity(term(host, ("app", "In", "web"))).spec()
    first = decide(cluster, (keeper,))
    assert isinstance(first, Decision)
    cluster.assume(first.assignments)
    kept_on = first.assignments[0].node
    for i in range(3):  # the memo of a node's answer per shape must not outlive the rule's inputs
        got = decide(cluster, (pod(f"w{i}").gpus(1).labels(app="web").spec(),))
        assert isinstance(got, Decision)
        assert got.assignments[0].node != kept_on
        cluster.assume(got.assignments)


def test_a_pod_the_agent_could_not_read_keeps_anti_affinity_pods_away_and_satisfies_no_affinity():
    # Its labels are unknown (RunningPod.unread): the side that keeps pods apart is taken, so a
    # pod with anti-affinity stays out of its zone and a pod with affinity is not satisfied by it.
    unread = node("a").label(ZONE, "z1")
    unread._k().update(pods=1, running=(RunningPod(namespace="default", unread="pod default/x: metadata.labels …"),))
    others = (node("b").label(ZONE, "z1"), node("c").label(ZONE, "z2"), node("d"))
    assert verdicts(pod("p").pod_anti_affinity(WEB), (unread, *others)) == each(ANTI, ANTI, None, None)
    assert verdicts(pod("p").pod_affinity(DB), (unread, *others)) == each(AFF, AFF, AFF, AFF)
    assert verdicts(pod("p").labels(app="web"), (unread, *others)) == each()  # its own terms are unknown: none


def test_a_member_whose_answer_comes_from_the_memo_of_an_equal_shape_carries_its_own_labels():
    """Members without terms of their own share a node's answer per shape; the assignment must
    still be theirs: another pod's labels in it would let anti-affinity terms selecting this
    pod miss it (and the decision log would not replay)."""
    views = snapshot(node("n0").gpus(8))
    cluster = Cluster.from_snapshot(views)
    first = decide(cluster, (pod("a").gpus(1).labels(app="a").spec(),))
    assert isinstance(first, Decision)
    second = decide(cluster, (pod("b").gpus(1).labels(app="b").spec(),))
    assert isinstance(second, Decision)
    assert second.assignments == (Assignment(pod=PodRef(namespace="default", name="b"), node="n0",
                                             gpus=second.assignments[0].gpus, gpu_uuids=("",),
                                             labels={"app": "b"}),)


def test_members_that_differ_only_in_labels_no_term_reads_share_one_reason():
    """A JobSet's pods differ in their index labels; where no pod (anti-)affinity term can tell
    them apart, the reason names them together, as before labels were read."""
    views = snapshot(node("n0").gpus(2))
    members = tuple(pod(f"w-{i}").gpus(2).labels(index=str(i)).spec() for i in range(2))
    got = decide(Cluster.from_snapshot(views), members)
    assert isinstance(got, NoFit) and [f.what for f in got.failures] == ["w-0 and 1 more (2 GPUs)"], got
