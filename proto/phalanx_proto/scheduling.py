"""Kubernetes scheduling state on the wire: what a pod asks of a node besides GPUs (carried
in ``MemberSpec``) and a node's Kubernetes state as its node agent reports it
(``NodeKubeState``, carried to the engine in ``NodeView.kube``).

Amounts are integers in the unit kube-scheduler compares: ``cpu`` in millicores, ``memory``,
``ephemeral-storage`` and ``hugepages-*`` in bytes, ``pods`` and every extended resource
(``example.com/foo``) as a count. Names and semantics follow the Kubernetes API
(``core/v1``): field names are snake_case here, values are the API's own strings.
"""

from __future__ import annotations

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


class Taint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node taint (``spec.taints[*]``)."""

    key: str
    value: str = ""
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
    values: tuple[str, ...] = ()


class NodeSelectorTerm(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One term of required node affinity: every expression (on labels) and every field
    (``metadata.name``) must match. A term with neither matches no node."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


class HostPort(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A port on the node's network a pod binds (``hostPort``; with ``hostNetwork`` every
    ``containerPort``). An empty ``host_ip`` means every address (``0.0.0.0``)."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    protocol: Protocol = "TCP"
    host_ip: str = ""


class NodeKubeState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node's Kubernetes state as its node agent reports it, for the filters kube-scheduler
    runs: NodeResourcesFit, NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts.

    ``requested``, ``pods`` and ``host_ports`` count only the pods on the node that Phalanx
    did **not** place (the ones without a Phalanx assignment): Phalanx's own pods are in the
    ledger with their requests (``Assignment.requests``), and counting them here too would
    book them twice.
    """

    allocatable: dict[str, Amount] = {}
    """``status.allocatable`` in the units above; a resource that is absent is 0."""
    labels: dict[str, str] = {}
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)."""
    ready: ConditionStatus = "Unknown"
    """The ``Ready`` condition's status. Not ``True``: placement treats the node as tainted
    ``node.kubernetes.io/not-ready`` (``False``) or ``node.kubernetes.io/unreachable``
    (``Unknown``) with ``NoSchedule``, as the node lifecycle controller would."""
    requested: dict[str, Amount] = {}
    """Resources requested by the running pods Phalanx did not place."""
    pods: Amount = 0
    """How many such pods there are (for allocatable ``pods``)."""
    host_ports: tuple[HostPort, ...] = ()
    """Host ports those pods bind."""
