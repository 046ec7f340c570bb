"""placement's copy of every DRA pool (KV ``phx-dra``, written by gang-coordinator from the
ResourceSlices and ResourceClaims it watches; docs/dra.md) and which nodes each concerns.

``DraPools`` mirrors the bucket and answers ``of(node)``: the pools a decision on that node
must see (``NodeView.dra``) — those with a slice or device naming the node, and every pool whose
slices reach nodes by selector or all nodes (the engine decides, from the node's labels, which of
their devices it can use: ``phalanx_engine.dra``). A pool change marks only the nodes it
concerns, before and after, for the cache to rebuild (``on_change`` with each node's key); a
pool reaching nodes by selector marks every node. A pool whose value does not decode or breaks
its rule is left out (``KvMirror`` isolates it), so its devices are not given: nothing it holds
can be double-booked because it was misread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import anyio

from phalanx_bus import Bus, KvMirror
from phalanx_proto import subjects as S
from phalanx_proto.dra import DraPool

EVERY_NODE = "*"
"""The node set of a pool that reaches nodes by selector or all nodes."""


def nodes_of(pool: DraPool) -> frozenset[str]:
    """The node names a pool's slices and devices name; ``EVERY_NODE`` among them when any
    reaches nodes another way (all nodes, a selector)."""
    out: set[str] = set()
    for s in pool.slices:
        selections = [d.nodes for d in s.devices if d.nodes is not None] if s.per_device_nodes else [s.nodes]
        for sel in selections:
            out.add(sel.node_name or EVERY_NODE)
        if s.shared_counters and not s.devices:
            out.add(EVERY_NODE)  # a counters-only slice serves devices of other slices: every node may need it
    return frozenset(out)


class DraPools:
    """The mirror of ``phx-dra`` indexed by node (module docstring)."""

    def __init__(self, bus: Bus, *, on_change: Callable[[str], object], every_node: Callable[[], Iterable[str]]) -> None:
        """``on_change``: called with a node's key when the pools it sees changed;
        ``every_node``: the keys of every node known (for pools that reach nodes by selector)."""
        self.on_change = on_change
        self.every_node = every_node
        self._nodes: dict[str, frozenset[str]] = {}
        """Pool key → the node names it concerns (``nodes_of``)."""
        self._by_node: dict[str, set[str]] = {}
        """Node name (or ``EVERY_NODE``) → the keys of the pools concerning it."""
        self.mirror: KvMirror[DraPool] = KvMirror.of_bucket(bus, S.KV_DRA, on_put=self._put, on_delete=self._gone)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the bucket until cancelled; started once it is listed."""
        await self.mirror.run(task_status=task_status)

    def of(self, node: str) -> tuple[DraPool, ...]:
        """The pools a decision on ``node`` sees, in key order (empty: no DRA devices)."""
        keys = self._by_node.get(node, set()) | self._by_node.get(EVERY_NODE, set())
        out = []
        for key in sorted(keys):
            entry = self.mirror.get(key)
            if entry is not None:
                out.append(entry.value)
        return tuple(out)

    def _put(self, entry, previous) -> None:
        self._index(entry.key, nodes_of(entry.value))

    def _gone(self, previous) -> None:
        self._index(previous.key, frozenset())

    def _index(self, key: str, now: frozenset[str]) -> None:
        before = self._nodes.pop(key, frozenset())
        if now:
            self._nodes[key] = now
        for name in before - now:
            keys = self._by_node.get(name)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_node[name]
        for name in now:
            self._by_node.setdefault(name, set()).add(key)
        touched = before | now
        if EVERY_NODE in touched:
            for node_key in list(self.every_node()):
                self.on_change(node_key)
        else:
            for name in touched:
                self.on_change(S.token(name))
