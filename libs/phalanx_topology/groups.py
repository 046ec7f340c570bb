"""Views of one node's model that a person or a placement plugin asks for: the NVLink groups
(connected components and maximal cliques), the GPUs closest to each NIC, the NUMA layout.

Pure functions of a ``NodeTopology``; ``phalanx topology show`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_proto.topology import NodeTopology
from phalanx_topology.links import LinkClass, classify, link_rank


def _nvlink_neighbours(topo: NodeTopology) -> dict[str, set[str]]:
    names = [g.name for g in topo.gpus]
    return {a: {b for b in names if b != a and classify(topo.relations[a][b]) is LinkClass.NVLINK}
            for a in names}


def nvlink_components(topo: NodeTopology) -> tuple[tuple[str, ...], ...]:
    """GPUs that reach each other over NVLink (possibly through other GPUs), each group in
    the node's GPU order; a GPU without NVLink is a group of its own."""
    adj = _nvlink_neighbours(topo)
    seen: set[str] = set()
    groups = []
    for g in topo.gpus:
        if g.name in seen:
            continue
        stack, found = [g.name], set()
        while stack:
            cur = stack.pop()
            if cur not in found:
                found.add(cur)
                stack.extend(adj[cur] - found)
        seen |= found
        groups.append(tuple(x.name for x in topo.gpus if x.name in found))
    return tuple(groups)


def nvlink_cliques(topo: NodeTopology) -> tuple[tuple[str, ...], ...]:
    """Maximal sets of two or more GPUs in which every pair has a direct NVLink (an NVSwitch
    fabric is one clique of all GPUs), largest first, then in GPU order.

    Bron–Kerbosch with pivoting; a node has at most a few dozen GPUs, so this is instant."""
    adj = _nvlink_neighbours(topo)
    order = {g.name: i for i, g in enumerate(topo.gpus)}
    found: list[frozenset[str]] = []

    def expand(r: frozenset[str], p: set[str], x: set[str]) -> None:
        if not p and not x:
            if len(r) >= 2:
                found.append(r)
            return
        pivot = max(p | x, key=lambda v: len(adj[v] & p))
        for v in sorted(p - adj[pivot], key=order.__getitem__):
            expand(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    expand(frozenset(), set(adj), set())
    cliques = [tuple(sorted(c, key=order.__getitem__)) for c in found]
    return tuple(sorted(cliques, key=lambda c: (-len(c), [order[n] for n in c])))


def closest_gpus(topo: NodeTopology, nic: str) -> tuple[str, tuple[str, ...]]:
    """The best relation from NIC ``nic`` to any GPU, and the GPUs at that relation (GPU
    order); ``("", ())`` on a node without GPUs."""
    if not topo.gpus:
        return "", ()
    best = max((topo.relations[nic][g.name] for g in topo.gpus), key=link_rank)
    return best, tuple(g.name for g in topo.gpus if topo.relations[nic][g.name] == best)


@dataclass(frozen=True, slots=True)
class NumaDomain:
    """The devices of one NUMA domain; ``id`` -1 collects devices whose domain is unknown."""

    id: int
    gpus: tuple[str, ...]
    nics: tuple[str, ...]


def numa_layout(topo: NodeTopology) -> tuple[NumaDomain, ...]:
    """The NUMA domains in id order (unknown, -1, last), each with its GPUs and NICs."""
    ids = sorted({d.numa for d in (*topo.gpus, *topo.nics)}, key=lambda i: (i < 0, i))
    return tuple(NumaDomain(id=i,
                            gpus=tuple(g.name for g in topo.gpus if g.numa == i),
                            nics=tuple(n.name for n in topo.nics if n.numa == i)) for i in ids)
