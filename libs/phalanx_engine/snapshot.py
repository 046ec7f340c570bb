"""The placement engine's input: an immutable snapshot of the cluster, and its output.

The placement service builds a ``Snapshot`` from KV ``phx-topology``, ``phx-heartbeat`` and
``phx-ledger``, with each node's ``NodeKubeState`` from ``phx-node-state``; ``phalanx place`` and
the benchmarks build one by hand. A decision works on
its own scratch copy of free capacity, never on the snapshot (style rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_engine.status import NoFit
from phalanx_proto.events import Assignment
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
    allocations: tuple[Assignment, ...] = ()
    """Every reservation on the node that the decision must respect."""
    revision: int = 0
    """Ledger revision the allocations were read at (0: no ledger entry yet)."""
    kube: NodeKubeState | None = None
    """The node's Kubernetes state (allocatable, taints, labels, cordon, Ready, what pods
    Phalanx did not place use); ``None`` while its node agent has not reported it."""


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


__all__ = ["Decision", "NoFit", "NodeView", "Snapshot"]
