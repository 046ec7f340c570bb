"""The network tiers a gang may span, the one rule for a node's domain at each (``domain_of``),
and the index a ``Cluster`` keeps of them (``Topology``): tier → domain → node names, with each
domain's free whole GPUs and whole-GPU capacity summed — the shape of Kueue's topology tree,
kept per cluster as nodes come, go and take work instead of rebuilt per decision.

Readers: the gang search (``decide._domains``, ``decide._no_fit``), the preemption planner
(``preempt_search``, ``preempt_order.placement_rank``) and the what-if probes (``probe_wait``,
``tier_of``). The ``Cluster`` owning the index builds it on its first read and is then its only
writer (``add``/``remove``, from its own indexing of each node state);
``tests/unit/test_topology_index.py`` holds it equal to a fresh scan of the nodes after random
changes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Set
from types import MappingProxyType

from phalanx_engine.nodestate import NodeState

TIERS = ("node", "hypernode", "leaf", "netpod")
TIER_NAMES = {"node": "node", "hypernode": "HyperNode", "leaf": "leaf switch", "netpod": "network-pod"}


def domain_of(state: NodeState, tier: str) -> str:
    """The network domain of ``state``'s node at ``tier`` (one of ``TIERS``), as gangs are
    placed: its own name at the node tier; a node that reports no domain at a tier is alone
    in it. Every reader of domains (the index, so the gang search, the preemption planner and
    the what-if probes) goes through this rule."""
    t = state.view.tiers
    value = {"node": state.view.name, "hypernode": t.hypernode, "leaf": t.leaf, "netpod": t.netpod}[tier]
    return value or f"node:{state.view.name}"


NETWORK_TIERS = TIERS[1:]
"""The tiers whose domains hold several nodes; at the node tier each node is its own domain."""


class Topology:
    """Tier → domain → the names of the usable nodes in it, and per domain the sum of its
    nodes' free whole GPUs (``len(free_whole())``) and whole-GPU capacity (``whole_capacity()``).
    The node tier is read from the nodes themselves (each node alone, ``domain_of``'s rule
    there); the network tiers are kept as sets and sums.

    Written only by the owning ``Cluster`` (``Cluster.topology``): ``add`` when a node state
    enters its index, ``remove`` when it leaves (a state that takes work leaves and enters
    again), so the sums are those of the states the cluster holds now. A domain with no node
    left is gone. Sets are unordered: a reader that needs an order sorts."""

    __slots__ = ("_members", "_sums", "_nodes", "_tiers")

    def __init__(self) -> None:
        self._members: dict[str, dict[str, set[str]]] = {t: {} for t in NETWORK_TIERS}
        self._sums: dict[str, dict[str, tuple[int, int]]] = {t: {} for t in NETWORK_TIERS}
        """Network tier → domain → (free whole GPUs, whole capacity) of its nodes."""
        self._nodes: dict[str, tuple[tuple[str, ...], int, int]] = {}
        """Node → (its domain per network tier, in ``NETWORK_TIERS`` order; its free and capacity)."""
        self._tiers = tuple((self._members[t], self._sums[t]) for t in NETWORK_TIERS)
        """Per network tier in order, its members and sums (the loops of ``add``/``remove``)."""

    def add(self, state: NodeState) -> None:
        """Count ``state``'s node in its domains (it must not be counted already)."""
        name = state.name
        where = tuple(domain_of(state, t) for t in NETWORK_TIERS)
        free, capacity = len(state.free_whole()), state.whole_capacity()
        self._nodes[name] = (where, free, capacity)
        for (members, sums), d in zip(self._tiers, where, strict=True):
            names = members.get(d)
            if names is None:
                members[d], sums[d] = {name}, (free, capacity)
            else:
                names.add(name)
                f, c = sums[d]
                sums[d] = (f + free, c + capacity)

    def remove(self, name: str) -> None:
        """Take the node out of its domains, with what it added; an unknown name is ignored."""
        got = self._nodes.pop(name, None)
        if got is None:
            return
        where, free, capacity = got
        for (members, sums), d in zip(self._tiers, where, strict=True):
            names = members[d]
            names.discard(name)
            if names:
                f, c = sums[d]
                sums[d] = (f - free, c - capacity)
            else:
                del members[d], sums[d]

    def copy(self) -> Topology:
        """An index equal to this one that changes independently of it."""
        other = Topology()
        for t in NETWORK_TIERS:
            other._members[t].update((d, set(names)) for d, names in self._members[t].items())
            other._sums[t].update(self._sums[t])
        other._nodes.update(self._nodes)
        return other

    # -- reading -----------------------------------------------------------------------------
    def domains(self, tier: str) -> Mapping[str, Set[str]]:
        """Domain → names of its usable nodes, at ``tier`` (a read-only view; the sets must not
        be changed, nor kept across a change of the cluster)."""
        if tier == "node":
            return _Alone(self._nodes)
        return MappingProxyType(self._members[tier])

    def domain(self, name: str, tier: str) -> str:
        """``domain_of`` of the usable node ``name`` at ``tier`` (KeyError for another name)."""
        where = self._nodes[name][0]
        return name if tier == "node" else where[NETWORK_TIERS.index(tier)]

    def free_whole_in(self, tier: str, domain: str) -> int:
        return self._nodes[domain][1] if tier == "node" else self._sums[tier][domain][0]

    def whole_capacity_in(self, tier: str, domain: str) -> int:
        return self._nodes[domain][2] if tier == "node" else self._sums[tier][domain][1]

    def sums(self, tier: str, avoid: Collection[str] = frozenset()) -> dict[str, tuple[int, int]]:
        """Per domain of ``tier`` with a node not in ``avoid``: (free whole GPUs, whole
        capacity) of those nodes. Costs the domains plus the avoided nodes, not the nodes."""
        if tier == "node":
            return {n: (f, c) for n, (_, f, c) in self._nodes.items() if n not in avoid}
        out = dict(self._sums[tier])
        t = NETWORK_TIERS.index(tier)
        left: dict[str, int] = {}
        for name in avoid:
            got = self._nodes.get(name)
            if got is None:
                continue
            where, free, capacity = got
            d = where[t]
            f, c = out[d]
            out[d] = (f - free, c - capacity)
            left[d] = left.get(d, len(self._members[tier][d])) - 1
        for d, count in left.items():
            if count == 0:
                del out[d]
        return out

    def tier_of(self, names: Iterable[str]) -> tuple[str, str]:
        """(tier, domain): the tightest tier one domain of which holds every node of ``names``
        (nodes the index does not hold are left out); ``("node", name)`` for one node (or
        ``("node", "")`` for none), ``("cluster", "")`` when no network-pod holds them all."""
        names = sorted(set(names))
        if len(names) <= 1:
            return "node", names[0] if names else ""
        known = [self._nodes[n][0] for n in names if n in self._nodes]
        for t, tier in enumerate(NETWORK_TIERS):
            values = {where[t] for where in known}
            if len(values) == 1:
                return tier, values.pop()
        return "cluster", ""


class _Alone(Mapping[str, Set[str]]):
    """The node tier's domains: every usable node alone in its own, named after it."""

    __slots__ = ("_nodes",)

    def __init__(self, nodes: Mapping[str, object]) -> None:
        self._nodes = nodes

    def __getitem__(self, name: str) -> Set[str]:
        if name not in self._nodes:
            raise KeyError(name)
        return frozenset((name,))

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)
