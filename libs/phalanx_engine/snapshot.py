"""The placement engine's input: an immutable snapshot of the cluster, and its output.

``NodeView`` is one node as a decision sees it; the placement service keeps one per node in
its watch-fed cache (``services/phalanx_placement/cache.py``, which builds the views from KV
``phx-topology``, ``phx-heartbeat``, ``phx-ledger`` and ``phx-node-state`` and hands them to a
long-lived ``Cluster`` node by node). A ``Snapshot`` is a tuple of views, for a one-shot
decision (``phalanx place``, the simulator, the benchmarks). A decision works on its own
scratch copy of free capacity, never on the views (style rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx_engine.status import NoFit
from phalanx_proto.dra import DraPool
from phalanx_proto.events import Assignment, NodeTopologyReported
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NetworkTiers, NodeTopology


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as placement sees it."""

    name: str
    topology: NodeTopology
    enabled: bool = True
    fresh: bool = True
    """False when the node's discovery heartbeat is older than the bound."""
    tiers: NetworkTiers = NetworkTiers()
    unhealthy: tuple[int, ...] = ()
    """Indexes of the node's GPUs its agent reports unhealthy: no new work goes on them (the
    reservations already there stay counted until released)."""
    allocations: tuple[Assignment, ...] = ()
    """Every reservation on the node that the decision must respect."""
    revision: int = 0
    """Ledger revision the allocations were read at (0: no ledger entry yet)."""
    kube: NodeKubeState | None = None
    """The node's Kubernetes state (allocatable, taints, labels, cordon, Ready, what pods
    Phalanx did not place use); ``None`` while its node agent has not reported it."""
    dra: tuple[DraPool, ...] = ()
    """The DRA pools whose devices the node may reach (KV ``phx-dra``, docs/dra.md), with the
    devices ResourceClaims already hold in them."""
    invalid: str = ""
    """Why a record the node's agent wrote (its topology report, heartbeat or Kubernetes
    state) cannot be believed (``bucket: rule``); such a node takes nothing ("node report
    invalid") until its agent writes a good one."""


def reported(report: NodeTopologyReported, **rest: Any) -> NodeView:
    """The view of a node as its agent's report says it: topology, tiers, enablement and
    unhealthy GPUs; ``rest`` is what other records add (freshness, reservations, Kubernetes
    state). Placement's cache and ``phalanx sim --live`` both build their views here."""
    return NodeView(name=report.node, topology=report.topology, enabled=report.enabled, tiers=report.tiers,
                    unhealthy=report.unhealthy, **rest)


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """Every member placed, in the order the members were given."""

    assignments: tuple[Assignment, ...]
    unchecked: tuple[str, ...] = ()
    """Nodes of the decision whose Kubernetes state was not reported, so CPU, memory, taints,
    labels and ports were not checked there (only with a profile that lets them through)."""
    node_errors: tuple[tuple[str, str], ...] = ()
    """(node, error) for each node a plugin raised on during the decision (each was refused
    alone)."""


__all__ = ["Decision", "NoFit", "NodeView", "Snapshot", "reported"]
