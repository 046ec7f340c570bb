"""Kubernetes scheduling state on the wire: what a pod asks of a node besides GPUs (carried
in ``MemberSpec``) and a node's Kubernetes state as its node agent reports it
(``NodeKubeState``, carried to the engine in ``NodeView.kube``).

Amounts are integers in the unit kube-scheduler compares: ``cpu`` in millicores, ``memory``,
``ephemeral-storage`` and ``hugepages-*`` in bytes, ``pods`` and every extended resource
(``example.com/foo``) as a count. Names and semantics follow the Kubernetes API
(``core/v1``): field names are snake_case here, values are the API's own strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

import msgspec

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
NodeSelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
Protocol = Literal["TCP", "UDP", "SCTP"]
ConditionStatus = Literal["True", "False", "Unknown"]
Amount = Annotated[int, msgspec.Meta(ge=0)]

# Bounds on what one pod carries (the API server has none this tight; a pod beyond them is
# refused by ``phalanx_kubeobjects.podspec`` with the bound's rule, and a wire value beyond them
# does not decode). They keep a gang's record and request within a message.
MAX_RESOURCES = 32
MAX_TOLERATIONS = 64
MAX_SELECTOR_LABELS = 64
MAX_TERMS = 16
MAX_REQUIREMENTS = 16
MAX_VALUES = 64
MAX_HOST_PORTS = 64
# Bounds on what one node reports.
MAX_NODE_RESOURCES = 256
MAX_NODE_LABELS = 1024
MAX_NODE_TAINTS = 256
MAX_NODE_HOST_PORTS = 4096
MAX_NODE_PODS = 4096
"""Pods one node reports at most (the kubelet's default limit is 110)."""
MAX_POD_LABELS = 256
"""Labels of one pod carried for pod (anti-)affinity (a pod with more is refused, the field named)."""
MAX_TERM_NAMESPACES = 64
"""Namespaces one pod (anti-)affinity term names at most."""
MAX_NODE_POD_LABELS = 16384
"""Labels of all the pods one node reports, together (``NodeKubeState.running``)."""

# Bounds on the strings a node reports (the API server's own: a qualified name's prefix is a
# DNS subdomain of at most 253 characters, its name part 63; a label value 63).
QualifiedName = Annotated[str, msgspec.Meta(max_length=317)]
LabelValue = Annotated[str, msgspec.Meta(max_length=63)]
PodKey = Annotated[str, msgspec.Meta(max_length=400)]
Namespace = Annotated[str, msgspec.Meta(max_length=63)]
SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
"""``<namespace>/<name>/<uid>``: 63 + 253 + a uid, with separators."""


class Taint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node taint (``spec.taints[*]``)."""

    key: QualifiedName
    value: LabelValue = ""
    effect: TaintEffect


class Toleration(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A pod toleration (``spec.tolerations[*]``). An empty ``key`` with ``Exists`` tolerates
    every taint; an empty ``effect`` matches every effect."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class NodeSelectorRequirement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``matchExpressions`` / ``matchFields`` entry of a node selector term."""

    key: str
    operator: NodeSelectorOperator
    values: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_VALUES)] = ()


class NodeSelectorTerm(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One term of required node affinity: every expression (on labels) and every field
    (``metadata.name``) must match. A term with neither matches no node."""

    match_expressions: Annotated[tuple[NodeSelectorRequirement, ...], msgspec.Meta(max_length=MAX_REQUIREMENTS)] = ()
    match_fields: Annotated[tuple[NodeSelectorRequirement, ...], msgspec.Meta(max_length=MAX_REQUIREMENTS)] = ()


class WeightedNodeSelectorTerm(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One preferred node affinity term (``preferredDuringSchedulingIgnoredDuringExecution``): a
    node it matches scores ``weight``. Unlike a required term, an empty one matches every node."""

    weight: Annotated[int, msgspec.Meta(ge=1, le=100)]
    term: NodeSelectorTerm


class HostPort(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A port on the node's network a pod binds (``hostPort``; with ``hostNetwork`` every
    ``containerPort``). An empty ``host_ip`` means every address (``0.0.0.0``)."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    protocol: Protocol = "TCP"
    host_ip: str = ""


class LabelSelectorRequirement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One requirement of a pod label selector (``matchLabels`` entries are ``In`` with one value)."""

    key: QualifiedName
    operator: SelectorOperator
    values: Annotated[tuple[LabelValue, ...], msgspec.Meta(max_length=MAX_VALUES)] = ()


def selector_matches(selector: Iterable[LabelSelectorRequirement], labels: Mapping[str, str]) -> bool:
    """``labels.Selector.Matches``: every requirement holds (an empty selector matches all).
    For pods (pod affinity, spread) and namespaces (a term's ``namespaceSelector``) alike."""
    for r in selector:
        has = r.key in labels
        match r.operator:
            case "In":
                ok = has and labels[r.key] in r.values
            case "NotIn":
                ok = not has or labels[r.key] not in r.values
            case "Exists":
                ok = has
            case "DoesNotExist":
                ok = not has
            case _:
                ok = False
        if not ok:
            return False
    return True


class PodAffinityTerm(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One required pod (anti-)affinity term (``requiredDuringSchedulingIgnoredDuringExecution``
    of ``podAffinity``/``podAntiAffinity``) as kube-scheduler's InterPodAffinity reads it: the
    pods it selects run on nodes whose ``topology_key`` label has the value the term's node has.

    ``selector``: every requirement must hold (``matchLabels``, ``matchExpressions`` and the
    pod's own ``matchLabelKeys``/``mismatchLabelKeys`` merged in, as ``In``/``NotIn``); an
    empty selector (``labelSelector: {}``) selects every pod, ``match_none`` (no
    ``labelSelector``) none. Namespaces: ``all_namespaces`` (``namespaceSelector: {}``), else
    ``namespaces``, else (both empty) the namespace of the pod that carries the term.
    """

    topology_key: QualifiedName
    selector: Annotated[tuple[LabelSelectorRequirement, ...], msgspec.Meta(max_length=MAX_REQUIREMENTS)] = ()
    match_none: bool = False
    namespaces: Annotated[tuple[Namespace, ...], msgspec.Meta(max_length=MAX_TERM_NAMESPACES)] = ()
    all_namespaces: bool = False
    namespace_selector: Annotated[tuple[LabelSelectorRequirement, ...], msgspec.Meta(max_length=MAX_REQUIREMENTS)] = ()
    """A ``namespaceSelector`` by labels, not resolved yet: gang-coordinator, which follows the
    namespaces, replaces it by the namespaces it selects (``namespaces``) when it admits the
    pod; placement never evaluates a term that still has one (docs/placement.md)."""


class WeightedPodAffinityTerm(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One preferred pod (anti-)affinity term (``preferredDuringSchedulingIgnoredDuringExecution``):
    a node whose domain holds pods the term selects scores ``weight`` per such pod (affinity)
    or loses it (anti-affinity), as kube-scheduler's InterPodAffinity score counts."""

    weight: Annotated[int, msgspec.Meta(ge=1, le=100)]
    term: PodAffinityTerm


class SpreadConstraint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``topologySpreadConstraints`` entry with ``whenUnsatisfiable: DoNotSchedule``, as
    kube-scheduler's PodTopologySpread filter reads it: placing the pod must not make the pods
    the selector matches (in the pod's namespace) in the node's ``topology_key`` domain exceed
    the least-loaded eligible domain's count by more than ``max_skew``.

    ``selector`` as in ``PodAffinityTerm`` (``matchLabelKeys`` merged in as ``In``);
    ``match_none`` when the constraint has no ``labelSelector``. ``min_domains``: with fewer
    eligible domains than this, the least count is taken as 0. Which nodes are domains:
    ``honor_node_affinity`` (``nodeAffinityPolicy: Honor``, the default) only nodes the pod's
    nodeSelector and required node affinity match; ``honor_taints`` (``nodeTaintsPolicy:
    Honor``; default Ignore) only nodes whose NoSchedule/NoExecute taints the pod tolerates.
    """

    topology_key: QualifiedName
    max_skew: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    selector: Annotated[tuple[LabelSelectorRequirement, ...], msgspec.Meta(max_length=2 * MAX_REQUIREMENTS)] = ()
    match_none: bool = False
    min_domains: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 1
    honor_node_affinity: bool = True
    honor_taints: bool = False


class RunningPod(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A pod bound to a node, as pod (anti-)affinity sees it: its namespace, its labels and its
    own required anti-affinity terms (which keep other pods out of its domain)."""

    namespace: Namespace
    labels: Annotated[dict[QualifiedName, LabelValue], msgspec.Meta(max_length=MAX_POD_LABELS)] = {}
    anti_affinity: Annotated[tuple[PodAffinityTerm, ...], msgspec.Meta(max_length=MAX_TERMS)] = ()
    unread: Annotated[str, msgspec.Meta(max_length=512)] = ""
    """Why the agent could not report this pod's labels or terms (too many, a malformed term):
    such a pod is counted as matching every anti-affinity term of an incoming pod and no
    affinity term (it keeps more pods apart, never fewer); its own terms are not known. One
    such pod never takes the whole node's state away. Topology spread counts it nowhere."""
    terminating: bool = False
    """Its deletion has begun (``metadata.deletionTimestamp``): topology spread does not count
    it, as kube-scheduler does not; pod (anti-)affinity still does."""


class NodeKubeState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node's Kubernetes state as its node agent reports it, for the filters kube-scheduler
    runs: NodeResourcesFit, NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts.

    ``requested``, ``pods`` and ``host_ports`` count only the pods on the node that Phalanx
    did **not** place (the ones without a Phalanx assignment): Phalanx's own pods are in the
    ledger with their requests (``Assignment.requests``), and counting them here too would
    book them twice.
    """

    allocatable: Annotated[dict[QualifiedName, Amount], msgspec.Meta(max_length=MAX_NODE_RESOURCES)] = {}
    """``status.allocatable`` in the units above; a resource that is absent is 0."""
    labels: Annotated[dict[QualifiedName, LabelValue], msgspec.Meta(max_length=MAX_NODE_LABELS)] = {}
    taints: Annotated[tuple[Taint, ...], msgspec.Meta(max_length=MAX_NODE_TAINTS)] = ()
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)."""
    ready: ConditionStatus = "Unknown"
    """The ``Ready`` condition's status. Not ``True``: placement treats the node as tainted
    ``node.kubernetes.io/not-ready`` (``False``) or ``node.kubernetes.io/unreachable``
    (``Unknown``) with ``NoSchedule``, as the node lifecycle controller would."""
    requested: Annotated[dict[QualifiedName, Amount], msgspec.Meta(max_length=MAX_NODE_RESOURCES)] = {}
    """Resources requested by the running pods Phalanx did not place."""
    pods: Amount = 0
    """How many such pods there are (for allocatable ``pods``)."""
    host_ports: Annotated[tuple[HostPort, ...], msgspec.Meta(max_length=MAX_NODE_HOST_PORTS)] = ()
    """Host ports those pods bind."""
    phalanx_pods: Annotated[tuple[PodKey, ...], msgspec.Meta(max_length=MAX_NODE_PODS)] = ()
    """The pods Phalanx placed (or a Phalanx scheduler name names) that are bound to the node
    and not terminal, as ``<namespace>/<name>/<uid>``, sorted: what runs there. Placement
    never frees a reservation of a pod listed here, and adopts a reservation only for one
    (docs/security.md, "A stolen coordinator credential")."""
    running: Annotated[tuple[RunningPod, ...], msgspec.Meta(max_length=MAX_NODE_PODS)] = ()
    """The pods Phalanx did not place that are bound to the node and not terminal (the ones
    ``pods`` counts), for pod (anti-)affinity: their namespaces, labels and required
    anti-affinity terms, sorted. At most ``MAX_NODE_POD_LABELS`` labels in all."""
