"""A node view as placement's decision log carries it (``phalanx_proto.events.RecordedNode``),
and back: the one place both sides of a replay agree on (docs/whatif.md, "Replay").

A node's topology report and Kubernetes state are the bulk of its view and rarely change, so a
record leaves each out when the log's previous record of that node carried the same one
(``same``). ``Memory`` is what one side remembers to do that: the recorder to leave them out,
the replay to put them back. Both forget everything at a base record.
"""

from __future__ import annotations

from typing import Literal

from phalanx_engine.snapshot import NodeView
from phalanx_proto.events import RecordedNode
from phalanx_proto.scheduling import NodeKubeState
from phalanx_proto.topology import NodeTopology


class Memory:
    """The topology and Kubernetes state last carried for each node since the last base."""

    def __init__(self) -> None:
        self._topology: dict[str, NodeTopology] = {}
        self._kube: dict[str, NodeKubeState | None] = {}

    def clear(self) -> None:
        self._topology.clear()
        self._kube.clear()

    def record(self, view: NodeView) -> RecordedNode:
        """``view`` as a record, leaving out what this memory says was carried already."""
        same: list[Literal["topology", "kube"]] = []
        topology: NodeTopology | None = view.topology
        if _same(self._topology.get(view.name), view.topology):
            same.append("topology")
            topology = None
        else:
            self._topology[view.name] = view.topology
        kube = view.kube
        if view.name in self._kube and _same(self._kube[view.name], view.kube):
            same.append("kube")
            kube = None
        else:
            self._kube[view.name] = view.kube
        return RecordedNode(name=view.name, topology=topology, enabled=view.enabled, fresh=view.fresh,
                            tiers=view.tiers, unhealthy=view.unhealthy, allocations=view.allocations, revision=view.revision, kube=kube,
                            invalid=view.invalid, same=tuple(same))

    def removed(self, name: str) -> RecordedNode:
        self._topology.pop(name, None)
        self._kube.pop(name, None)
        return RecordedNode(name=name, removed=True)

    def view(self, rec: RecordedNode) -> NodeView:
        """The view a record stands for. ``KeyError`` if it says "same" of something this memory
        never saw (a log read from the middle, not from a base)."""
        if "topology" in rec.same:
            topology = self._topology[rec.name]
        else:
            topology = rec.topology if rec.topology is not None else NodeTopology(node=rec.name)
            self._topology[rec.name] = topology
        if "kube" in rec.same:
            kube = self._kube[rec.name]
        else:
            kube = rec.kube
            self._kube[rec.name] = kube
        return NodeView(name=rec.name, topology=topology, enabled=rec.enabled, fresh=rec.fresh, tiers=rec.tiers,
                        unhealthy=rec.unhealthy, allocations=rec.allocations, revision=rec.revision, kube=kube, invalid=rec.invalid)

    def forget(self, name: str) -> None:
        self._topology.pop(name, None)
        self._kube.pop(name, None)


def _same(a: object, b: object) -> bool:
    """The same object (the cache builds views from the mirror's values, so unchanged ones are
    identical), or equal."""
    return a is b or (a is not None and a == b)
