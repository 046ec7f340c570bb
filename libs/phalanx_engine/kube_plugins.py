"""The filters kube-scheduler runs that are not about GPUs, with its plugin names, reason texts
and resolvability (kube-scheduler v1.36): NodeUnschedulable, NodeName, TaintToleration,
NodeAffinity, NodePorts, NodeResourcesFit, PodTopologySpread (``DoNotSchedule`` constraints,
``spread``), InterPodAffinity (required terms, ``podaffinity``); pod affinity selecting
namespaces by label is refused explicitly;
NodeStateReported says when a node's Kubernetes state is missing.

They read ``NodeView.kube`` (``phalanx_proto.scheduling.NodeKubeState``). A node without it
fails ``NodeStateReported`` when the profile requires node state; otherwise the other filters
pass it unchecked and the decision names it in ``Decision.unchecked`` (docs/placement.md,
"Nodes without Kubernetes state").
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx_engine import podaffinity, spread
from phalanx_engine.framework import Filter, Member, Score
from phalanx_engine.matching import (
    node_selector_matches,
    ports_conflict,
    preference_matches,
    readiness_taints,
    tolerates,
    untolerated,
)
from phalanx_engine.nodestate import NodeState, port_key
from phalanx_engine.status import Code, Reason, Status, refuse
from phalanx_proto.events import Assignment
from phalanx_proto.kubeapi import UNSCHEDULABLE_TAINT as UNSCHEDULABLE
from phalanx_proto.scheduling import CPU, EPHEMERAL_STORAGE, MEMORY, PODS, Taint

R_NOT_REPORTED = "node state not reported"
R_UNSCHEDULABLE = "node(s) were unschedulable"
R_NODE_NAME = "node(s) didn't match the requested node name"
R_TAINT = "node(s) had untolerated taint(s)"
R_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
R_PORTS = "node(s) didn't have free ports for the requested pod ports"
R_TOO_MANY_PODS = "Too many pods"
_UNSCHEDULABLE_TAINT = Taint(key=UNSCHEDULABLE, effect="NoSchedule")
_FIRST = (CPU, MEMORY, EPHEMERAL_STORAGE)


class NodeStateReported:
    """With ``required``, a node whose agent has not reported its Kubernetes state takes
    nothing: without it no other Kubernetes filter can say yes honestly. Resolvable: the
    report may still come."""

    name = "NodeStateReported"

    def applies(self, member: Member) -> bool:
        return self.required

    def __init__(self, required: bool = True) -> None:
        self.required = required

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if node.view.kube is not None or not self.required:
            return None
        return refuse(self.name, Code.NODE_STATE_NOT_REPORTED, R_NOT_REPORTED, resolvable=True)


class NodeUnschedulable:
    """A cordoned node takes only pods that tolerate ``node.kubernetes.io/unschedulable``."""

    name = "NodeUnschedulable"

    def applies(self, member: Member) -> bool:
        return True

    def filter(self, member: Member, node: NodeState) -> Status | None:
        kube = node.view.kube
        if kube is None or not kube.unschedulable:
            return None
        if any(tolerates(t, _UNSCHEDULABLE_TAINT) for t in member.spec.tolerations):
            return None
        return refuse(self.name, Code.NODE_UNSCHEDULABLE, R_UNSCHEDULABLE, resolvable=False)


class NodeName:
    """``spec.nodeName``: only the named node."""

    name = "NodeName"

    def applies(self, member: Member) -> bool:
        return bool(member.spec.node_name)

    def filter(self, member: Member, node: NodeState) -> Status | None:
        wanted = member.spec.node_name
        if not wanted or wanted == node.name:
            return None
        return refuse(self.name, Code.NODE_NAME, R_NODE_NAME, resolvable=False, detail=wanted)


class TaintToleration:
    """Every ``NoSchedule``/``NoExecute`` taint must be tolerated; a node whose ``Ready``
    condition is not ``True`` carries the not-ready/unreachable taint."""

    name = "TaintToleration"

    def applies(self, member: Member) -> bool:
        return True

    def filter(self, member: Member, node: NodeState) -> Status | None:
        kube = node.view.kube
        if kube is None:
            return None
        taint = untolerated(readiness_taints(kube.ready, kube.taints), member.spec.tolerations)
        if taint is None:
            return None
        return refuse(self.name, Code.UNTOLERATED_TAINT, R_TAINT, resolvable=False,
                      detail=f"{{{taint.key}: {taint.value}}}")


class NodeAffinity:
    """``spec.nodeSelector`` and required node affinity (every operator, ``matchFields`` on
    ``metadata.name``)."""

    name = "NodeAffinity"

    def applies(self, member: Member) -> bool:
        return bool(member.spec.node_selector) or member.spec.node_affinity is not None

    def filter(self, member: Member, node: NodeState) -> Status | None:
        spec, kube = member.spec, node.view.kube
        if kube is None or (not spec.node_selector and spec.node_affinity is None):
            return None
        if node_selector_matches(spec.node_selector, spec.node_affinity, kube.labels, node.name):
            return None
        return refuse(self.name, Code.NODE_AFFINITY, R_AFFINITY, resolvable=False)


class NodePorts:
    """Host ports: none the pod binds may be bound on the node already (by pods Phalanx did not
    place, or by Phalanx's reservations there)."""

    name = "NodePorts"

    def applies(self, member: Member) -> bool:
        return bool(member.spec.host_ports)

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if not member.spec.host_ports or (node.view.kube is None and not node.ports):
            return None
        for p in member.spec.host_ports:
            want = port_key(p)
            if ports_conflict(want, node.ports):
                return refuse(self.name, Code.NODE_PORTS, R_PORTS, resolvable=True,
                              detail=f"{want[1]}/{want[2]} on {want[0]}")
        return None


class NodeResourcesFit:
    """Allocatable minus what is requested on the node must cover the pod's requests: pods,
    cpu, memory, ephemeral-storage, then every other resource (by name). Every shortfall is a
    reason, as in kube-scheduler. Resolvable when the pod would fit the node's allocatable."""

    name = "NodeResourcesFit"

    def applies(self, member: Member) -> bool:
        return True

    def filter(self, member: Member, node: NodeState) -> Status | None:
        kube = node.view.kube
        if kube is None or resources_fit(member, node):  # no Kubernetes state: resources_fit passes it
            return None
        alloc, used = kube.allocatable, node.requested
        short: list[Reason] = []
        allowed = alloc.get(PODS, 0)
        if node.pods + 1 > allowed:
            short.append(Reason(Code.TOO_MANY_PODS, R_TOO_MANY_PODS, PODS, 1, allowed - node.pods, allowed))
        asks = member.spec.requests
        for r in (*[r for r in _FIRST if r in asks], *sorted(r for r in asks if r not in _FIRST)):
            q = asks[r]
            if q > 0 and q > alloc.get(r, 0) - used.get(r, 0):
                short.append(Reason(Code.INSUFFICIENT_RESOURCE, f"Insufficient {r}", r, q,
                                    alloc.get(r, 0) - used.get(r, 0), alloc.get(r, 0)))
        if not short:
            return None
        return Status(self.name, tuple(short), all(x.requested <= x.capacity for x in short))


def resources_fit(member: Member, node: NodeState) -> bool:
    """``NodeResourcesFit``'s verdict without its status: True exactly when its filter passes the
    node (no Kubernetes state, or a pod slot free and every request covered). The engine asks it
    first to pass over the nodes that filter would refuse without building their status."""
    kube = node.view.kube
    if kube is None:
        return True
    alloc, used = kube.allocatable, node.requested
    if node.pods + 1 > alloc.get(PODS, 0):
        return False
    for r, q in member.spec.requests.items():
        if q > 0 and q > alloc.get(r, 0) - used.get(r, 0):
            return False
    return True


_POD_AFFINITY = {podaffinity.AFFINITY: (Code.POD_AFFINITY, podaffinity.R_AFFINITY, False),
                 podaffinity.ANTI: (Code.POD_ANTI_AFFINITY, podaffinity.R_ANTI_AFFINITY, True),
                 podaffinity.EXISTING: (Code.EXISTING_POD_ANTI_AFFINITY, podaffinity.R_EXISTING_ANTI_AFFINITY, True)}


class PodTopologySpread:
    """Hard topology spread (``spread``): over the pods and nodes of the decision under way
    (``podaffinity.current``). A node without a constraint's topology label is refused
    unresolvably; a skew too large can be resolved by preemption (kube-scheduler's statuses)."""

    name = "PodTopologySpread"

    def applies(self, member: Member) -> bool:
        return bool(member.spec.spread)

    def filter(self, member: Member, node: NodeState) -> Status | None:
        spec = member.spec
        if not spec.spread:
            return None
        pods = _decision_pods()
        why = spread.verdict(spec, spread.counts_in(pods, spec), _labels(node))
        if not why:
            return None
        if why == spread.MISSING_LABEL:
            return refuse(self.name, Code.TOPOLOGY_SPREAD_LABEL, spread.R_SPREAD_LABEL, resolvable=False)
        return refuse(self.name, Code.TOPOLOGY_SPREAD, spread.R_SPREAD, resolvable=True)


class InterPodAffinity:
    """Required pod affinity and anti-affinity, the member's own and the existing pods'
    (``podaffinity``): over the pods of the decision under way (``podaffinity.current``: the
    cluster's, Phalanx's reservations and the members placed before this one). Affinity is not
    resolvable by preemption, anti-affinity is (kube-scheduler's statuses)."""

    name = "InterPodAffinity"

    def applies(self, member: Member) -> bool:
        return True  # an existing pod's anti-affinity may select any member

    def filter(self, member: Member, node: NodeState) -> Status | None:
        spec, pods = member.spec, podaffinity.current()
        if pods is None:
            if not (spec.pod_affinity or spec.pod_anti_affinity):
                return None
            pods = podaffinity.Pods((), ())  # outside a decision: no other pod is known
        if not pods.relevant(spec):
            return None
        why = podaffinity.verdict(spec, pods.counts(spec), _labels(node))
        if not why:
            return None
        code, text, resolvable = _POD_AFFINITY[why]
        return refuse(self.name, code, text, resolvable=resolvable)


class TaintPreference:
    """kube-scheduler's TaintToleration score: a node with fewer ``PreferNoSchedule`` taints the
    member does not tolerate ranks higher (negated count: larger is better)."""

    name = "TaintToleration"

    def score(self, member: Member, node: NodeState, assignment: Assignment) -> int:
        kube = node.view.kube
        if kube is None:
            return 0
        tolerations = member.spec.tolerations
        return -sum(1 for t in kube.taints if t.effect == "PreferNoSchedule"
                    and not any(tolerates(x, t) for x in tolerations if x.effect in ("", "PreferNoSchedule")))


class NodeAffinityPreference:
    """kube-scheduler's NodeAffinity score: the sum of the weights of the member's preferred
    node affinity terms the node matches (an empty term matches every node)."""

    name = "NodeAffinity"

    def score(self, member: Member, node: NodeState, assignment: Assignment) -> int:
        terms = member.spec.preferred_node_affinity
        kube = node.view.kube
        if not terms or kube is None:
            return 0
        return sum(w.weight for w in terms if preference_matches(w.term, kube.labels, node.name))


class PodAffinityPreference:
    """The score of the member's preferred pod (anti-)affinity terms on a node
    (``podaffinity.preference``), over the pods of the decision under way; 0 for a member
    without them. kube-scheduler normalises its InterPodAffinity scores to 0–100 over the
    feasible nodes; Phalanx compares scores per plugin, so the raw sum orders nodes alike."""

    name = "InterPodAffinity"

    def score(self, member: Member, node: NodeState, assignment: Assignment) -> int:
        spec = member.spec
        if not (spec.preferred_affinity or spec.preferred_anti_affinity):
            return 0
        pods = _decision_pods()
        return podaffinity.preferred_score(pods.preference(spec), _labels(node))


class SpreadPreference:
    """The score of the member's ``ScheduleAnyway`` spread constraints on a node
    (``spread.soft_score``: fewer matching pods in its domains ranks higher); 0 for a member
    without them."""

    name = "PodTopologySpread"

    def score(self, member: Member, node: NodeState, assignment: Assignment) -> float:
        spec = member.spec
        if not spec.soft_spread:
            return 0
        pods = _decision_pods()
        return spread.soft_score(spec, spread.soft_counts_in(pods, spec), _labels(node))


class PodAffinityRefused:
    """Terms Phalanx does not evaluate (pod (anti-)affinity terms that select namespaces by
    their labels): a pod with them is refused with that reason, never placed as if they were
    not there."""

    name = "InterPodAffinity"

    def applies(self, member: Member) -> bool:
        return bool(member.spec.unsupported)

    def filter(self, member: Member, node: NodeState) -> Status | None:
        terms = member.spec.unsupported
        if not terms:
            return None
        return refuse(self.name, Code.POD_AFFINITY_REFUSED, f"Phalanx does not evaluate {', '.join(terms)}",
                      resolvable=False)


def _decision_pods() -> podaffinity.Pods:
    """The pods of the decision under way; outside a decision no other pod is known."""
    return podaffinity.current() or podaffinity.Pods((), ())


def _labels(node: NodeState) -> Mapping[str, str]:
    """The node's labels as its agent reported them ({} before it has)."""
    kube = node.view.kube
    return kube.labels if kube is not None else {}


def kube_scores() -> tuple[Score, ...]:
    """The Kubernetes scores Phalanx ranks by, in this order (after the GPU set's quality:
    ``decide``): untolerated ``PreferNoSchedule`` taints (kube-scheduler weighs this one
    highest), preferred node affinity, preferred pod (anti-)affinity, ``ScheduleAnyway``
    spread."""
    return (TaintPreference(), NodeAffinityPreference(), PodAffinityPreference(), SpreadPreference())


def kube_filters(require_node_state: bool) -> tuple[Filter, ...]:
    """The Kubernetes filters in kube-scheduler's order (the first that refuses decides the
    node's status, so the order decides the reason a node shows). Typed as ``Filter``s, so the
    type checker holds each to the protocol here."""
    return (NodeStateReported(require_node_state), NodeUnschedulable(), NodeName(), TaintToleration(),
            NodeAffinity(), NodePorts(), NodeResourcesFit(), PodTopologySpread(), InterPodAffinity(),
            PodAffinityRefused())
