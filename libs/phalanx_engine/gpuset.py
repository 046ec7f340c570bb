"""Intra-node GPU choice (R6): which of a node's free GPUs a multi-GPU request gets.

Called by the placement service for every member that asks for more than one GPU on a node,
by ``phalanx place`` and by ``phalanx_engine.rdma`` (which narrows the candidates to GPUs
near an RDMA NIC). Pure: a topology snapshot and a free set in, a ``GpuChoice`` or a
``NoChoice`` out.

The objective, compared lexicographically (larger is better; docs/placement.md explains why):

a. **ring bottleneck** - the slowest link of the best ring (Hamiltonian cycle) over the set,
   as ``phalanx_topology.links.link_rank``: NVLink (more bonded links better, an NVSwitch
   fabric best) > PIX > PXB > PHB > NODE > SYS. For two GPUs it is their link; one GPU has
   no link and all single GPUs tie here.
b. **pair quality** of the set, summed over all pairs: first total NVLink count, then total
   link class (NVLINK=5 ... SYS=0), then the number of pairs on the same NUMA node (the
   tie-break between equal NVLink counts, e.g. on NVSwitch or all-SYS nodes).
c. **leftover quality** - the same sum over the free GPUs that are left, so that the next
   request still finds a well-connected set (keeps NVLink quads and NUMA halves intact).
d. **caller preference** - an optional per-GPU integer summed over the set (``rdma`` uses it
   to prefer GPUs nearer a NIC among otherwise equal sets); absent, it is 0 for every set.
e. **lowest indices** - the lexicographically smallest sorted index tuple.

Search is exact over all combinations when there are at most ``EXACT_LIMIT`` of them (every
count on a 16-GPU node: C(16,8) = 12,870). Beyond that a greedy grower seeded from every
candidate is used and the result says ``exact=False``. Results are cached per topology
object and (free, eligible, require, count); the cache holds frozen values only.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Set

import msgspec

from phalanx_proto.topology import Gpu, NodeTopology
from phalanx_topology.links import FABRIC_LINKS, LinkClass, link_rank

EXACT_LIMIT = 20_000
"""Most GPU sets ``choose_gpus`` scores exactly; above this it falls back to greedy growth."""

_CLASS_SHIFT = 12  # rank int = class << 12 | nvlinks  (nvlinks <= FABRIC_LINKS < 4096)
_NV_SHIFT = 40  # quality int = nvlinks << 40 | class << 20 | same_numa (sums never overflow a field)
_CLS_SHIFT = 20
_FIELD = (1 << 20) - 1
_SINGLE = 1 << 30  # "ring bottleneck" of one GPU: better than any link


class NoChoice(msgspec.Struct, frozen=True, kw_only=True):
    """No set fits. ``code`` is stable (for metrics and tests); ``reasons`` are for people."""

    code: str
    reasons: tuple[str, ...]


class GpuSetScore(msgspec.Struct, frozen=True, kw_only=True):
    """The objective of one GPU set, component by component (see the module docstring).

    ``ring_link`` names the bottleneck: ``NV2``, ``NVSWITCH``, ``PIX``, ... ``SYS``; empty
    for a single GPU.
    """

    ring_link: str
    pair_nvlinks: int
    pair_class_sum: int
    pair_same_numa: int
    leftover_nvlinks: int
    leftover_class_sum: int
    leftover_same_numa: int


class GpuChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The chosen GPU indices (ascending), one ring over them achieving the bottleneck
    (starting at the lowest index), the score, and whether the search was exact."""

    gpus: tuple[int, ...]
    ring: tuple[int, ...]
    score: GpuSetScore
    exact: bool = True


def choose_gpus(
    topology: NodeTopology,
    free: Set[int],
    count: int,
    require: Set[int] = frozenset(),
    *,
    eligible: Set[int] | None = None,
    prefer: Mapping[int, int] | None = None,
) -> GpuChoice | NoChoice:
    """The best set of ``count`` GPUs (by ``Gpu.index``) among ``free`` that contains ``require``.

    ``eligible`` (default: all of ``free``) limits which free GPUs the set may use; the
    leftover score (c) is still measured over all of ``free``. ``prefer`` maps GPU index to
    a tie-break bonus (d), higher better, missing GPUs 0. Returns ``NoChoice`` when not
    enough eligible free GPUs exist or a required GPU is not free/eligible. Raises
    ``ValueError`` for a count below 1 or an index the node does not have (caller bugs).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    graph = _graph(topology)
    free_mask = graph.mask(free, "free")
    req_mask = graph.mask(require, "require")
    elig_mask = free_mask if eligible is None else graph.mask(eligible, "eligible") & free_mask
    bonus = tuple(sorted((graph.pos[i], v) for i, v in (prefer or {}).items() if v and i in graph.pos))
    key = (free_mask, elig_mask, req_mask, count, bonus)
    hit = graph.cache.get(key)
    if hit is None:
        hit = _choose(graph, free_mask, elig_mask, req_mask, count, dict(bonus))
        graph.remember(key, hit)
    return hit


def ranked_sets(topology: NodeTopology, free: Set[int], count: int, *,
                eligible: Set[int] | None = None) -> Iterator[tuple[int, ...]]:
    """Every set of ``count`` eligible free GPUs, best first: ``choose_gpus``'s choice first,
    then the others by the same objective (a-c, then lowest indices). For callers that must
    try sets until one passes checks of their own (``phalanx_engine.dra.rank``). Lazy: only
    the first set is computed until a second is asked for; the order is exact up to
    ``EXACT_LIMIT`` sets, beyond that the greedy candidates come first (by the objective), then
    every other set in index order. Nothing when too few GPUs are eligible and free."""
    first = choose_gpus(topology, free, count, eligible=eligible)
    if isinstance(first, NoChoice):
        return
    yield first.gpus
    graph = _graph(topology)
    free_mask = graph.mask(free, "free")
    elig_mask = free_mask if eligible is None else graph.mask(eligible, "eligible") & free_mask
    key = (free_mask, elig_mask, count)
    order = graph.ranked.get(key)
    if order is None:
        order = _ranked(graph, free_mask, elig_mask, count)
        graph.ranked[key] = order
        if len(graph.ranked) > graph.RESULTS:
            graph.ranked.popitem(last=False)
    else:
        graph.ranked.move_to_end(key)
    idx = graph.index
    seen = {first.gpus}
    for members in order:
        gpus = tuple(idx[p] for p in members)
        if gpus not in seen:
            seen.add(gpus)
            yield gpus
    if not math.comb(len(graph.positions(elig_mask)), count) <= EXACT_LIMIT:
        for members in itertools.combinations(graph.positions(elig_mask), count):
            gpus = tuple(idx[p] for p in members)
            if gpus not in seen:
                yield gpus


def score_set(topology: NodeTopology, gpus: Iterable[int], free: Set[int] | None = None) -> GpuSetScore:
    """The score ``choose_gpus`` gives ``gpus`` (leftover measured over ``free``, default the
    set itself, i.e. nothing left). For explaining and comparing placements."""
    graph = _graph(topology)
    s_mask = graph.mask(set(gpus), "gpus")
    if not s_mask:
        raise ValueError("score_set needs at least one GPU")
    f_mask = s_mask if free is None else graph.mask(free, "free") | s_mask
    members = graph.positions(s_mask)
    bottleneck = graph.ring_bottleneck(members, lower=-1)
    return graph.score(members, bottleneck, f_mask)


# --- internals ------------------------------------------------------------------------------


def _same_numa(a: Gpu, b: Gpu) -> int:
    if a.numa >= 0 and b.numa >= 0:
        return int(a.numa == b.numa)
    return int(bool(a.cpu_affinity) and a.cpu_affinity == b.cpu_affinity)


def _link_name(rank: int, nvswitch: bool) -> str:
    if rank == _SINGLE:
        return ""
    cls, nv = LinkClass(rank >> _CLASS_SHIFT), rank & ((1 << _CLASS_SHIFT) - 1)
    if cls is LinkClass.NVLINK:
        return "NVSWITCH" if nv == FABRIC_LINKS else f"NV{nv}"
    return cls.name


class _Graph:
    """Integer matrices of one topology, indexed by position (GPUs sorted by index)."""

    RESULTS = 4096

    def __init__(self, topology: NodeTopology) -> None:
        gpus = sorted(topology.gpus, key=lambda g: g.index)
        self.nvswitch = topology.nvswitch
        self.index = [g.index for g in gpus]
        self.pos = {g.index: p for p, g in enumerate(gpus)}
        n = len(gpus)
        self.rank = [[_SINGLE] * n for _ in range(n)]
        self.qual = [[0] * n for _ in range(n)]
        for p, q in itertools.combinations(range(n), 2):
            cls, nv = link_rank(topology.relation(gpus[p].name, gpus[q].name), nvswitch=topology.nvswitch)
            r = cls << _CLASS_SHIFT | nv
            w = nv << _NV_SHIFT | cls << _CLS_SHIFT | _same_numa(gpus[p], gpus[q])
            self.rank[p][q] = self.rank[q][p] = r
            self.qual[p][q] = self.qual[q][p] = w
        self.cache: OrderedDict[tuple, GpuChoice | NoChoice] = OrderedDict()
        self.ranked: OrderedDict[tuple, tuple[tuple[int, ...], ...]] = OrderedDict()

    def remember(self, key: tuple, value: GpuChoice | NoChoice) -> None:
        self.cache[key] = value
        if len(self.cache) > self.RESULTS:
            self.cache.popitem(last=False)

    def mask(self, indices: Iterable[int], what: str) -> int:
        m = 0
        for i in indices:
            if i not in self.pos:
                raise ValueError(f"{what}: GPU index {i} is not on this node (has {self.index})")
            m |= 1 << self.pos[i]
        return m

    def positions(self, mask: int) -> list[int]:
        return [p for p in range(len(self.index)) if mask >> p & 1]

    def pair_sum(self, members: list[int]) -> int:
        q = self.qual
        return sum(q[a][b] for a, b in itertools.combinations(members, 2))

    def ring_bottleneck(self, members: list[int], lower: int) -> int:
        """Best ring bottleneck over ``members``, or -1 if it cannot reach ``lower``."""
        k = len(members)
        if k == 1:
            return _SINGLE
        r = self.rank
        if k == 2:
            return r[members[0]][members[1]]
        # Every vertex has two ring edges: its second-best edge bounds the ring from above;
        # the worst edge of the set bounds it from below.
        upper = min(sorted((r[v][u] for u in members if u != v), reverse=True)[1] for v in members)
        if upper < lower:
            return -1
        links = {r[a][b] for a, b in itertools.combinations(members, 2)}
        worst = min(links)
        for t in sorted(links, reverse=True):
            if t > upper:
                continue
            if t < lower:
                return -1
            # At the worst link every pair qualifies: a complete graph always has a ring.
            if t == worst or self.ring_at(members, t) is not None:
                return t
        raise AssertionError("unreachable: the worst link always admits a ring")

    def ring_at(self, members: list[int], t: int) -> list[int] | None:
        """A Hamiltonian cycle using only links ranked >= t (lexicographically first), or None."""
        k = len(members)
        if k <= 2:
            return list(members)
        local = {p: i for i, p in enumerate(members)}
        adj = [0] * k
        for a, b in itertools.combinations(members, 2):
            if self.rank[a][b] >= t:
                adj[local[a]] |= 1 << local[b]
                adj[local[b]] |= 1 << local[a]
        full = (1 << k) - 1
        dead: set[tuple[int, int]] = set()
        path = [0]

        def extend(seen: int, last: int) -> bool:
            if seen == full:
                return bool(adj[last] & 1)
            if (seen, last) in dead:
                return False
            nxt = adj[last] & ~seen
            while nxt:
                low = nxt & -nxt
                v = low.bit_length() - 1
                path.append(v)
                if extend(seen | low, v):
                    return True
                path.pop()
                nxt ^= low
            dead.add((seen, last))
            return False

        return [members[i] for i in path] if extend(1, 0) else None

    def score(self, members: list[int], bottleneck: int, free_mask: int) -> GpuSetScore:
        inside = self.pair_sum(members)
        free = self.positions(free_mask)
        mset = set(members)
        left = self.pair_sum([p for p in free if p not in mset])
        return GpuSetScore(
            ring_link=_link_name(bottleneck, self.nvswitch),
            pair_nvlinks=inside >> _NV_SHIFT,
            pair_class_sum=inside >> _CLS_SHIFT & _FIELD,
            pair_same_numa=inside & _FIELD,
            leftover_nvlinks=left >> _NV_SHIFT,
            leftover_class_sum=left >> _CLS_SHIFT & _FIELD,
            leftover_same_numa=left & _FIELD,
        )


_GRAPHS: OrderedDict[tuple, tuple[tuple, dict, _Graph]] = OrderedDict()
_GRAPHS_MAX = 256


def _graph(topology: NodeTopology) -> _Graph:
    # Keyed by the identity of the GPU tuple and relation matrix (nodes built from one parsed
    # topology share them, whatever their names), holding both so an id is never reused
    # while cached.
    key = (id(topology.gpus), id(topology.relations), topology.nvswitch)
    hit = _GRAPHS.get(key)
    if hit is not None and hit[0] is topology.gpus and hit[1] is topology.relations:
        _GRAPHS.move_to_end(key)
        return hit[2]
    graph = _Graph(topology)
    _GRAPHS[key] = (topology.gpus, topology.relations, graph)
    if len(_GRAPHS) > _GRAPHS_MAX:
        _GRAPHS.popitem(last=False)
    return graph


def _choose(
    graph: _Graph, free_mask: int, elig_mask: int, req_mask: int, count: int, bonus: dict[int, int]
) -> GpuChoice | NoChoice:
    """Overview: validate, enumerate candidate sets (exact or greedy), keep the best key
    (bottleneck, pair sum, leftover sum, preference) with the first-seen set winning ties; enumeration
    runs in ascending index order, so the first seen is the lowest-indexed."""
    idx = graph.index
    not_free = req_mask & ~free_mask
    if not_free:
        return NoChoice(code="required-gpu-not-free",
                     reasons=(f"required GPUs {[idx[p] for p in graph.positions(not_free)]} are not free",))
    not_elig = req_mask & ~elig_mask
    if not_elig:
        return NoChoice(code="required-gpu-not-eligible",
                     reasons=(f"required GPUs {[idx[p] for p in graph.positions(not_elig)]} are not eligible",))
    required = graph.positions(req_mask)
    if len(required) > count:
        return NoChoice(code="too-many-required",
                     reasons=(f"{len(required)} GPUs required but only {count} asked for",))
    pool = graph.positions(elig_mask & ~req_mask)
    need = count - len(required)
    if need > len(pool):
        have = len(pool) + len(required)
        return NoChoice(code="not-enough-free-gpus",
                     reasons=(f"{count} GPUs asked, {have} free{' and eligible' if elig_mask != free_mask else ''}",))

    free = graph.positions(free_mask)
    deg = {p: sum(graph.qual[p][q] for q in free) for p in free}
    free_sum = graph.pair_sum(free)
    exact = math.comb(len(pool), need) <= EXACT_LIMIT
    sets: Iterable[tuple[int, ...]] = (
        itertools.combinations(pool, need) if exact else _greedy_sets(graph, pool, required, need)
    )
    best_key: tuple[int, int, int, int] | None = None
    best: list[int] = []
    for extra in sets:
        members = sorted((*required, *extra))
        bottleneck = graph.ring_bottleneck(members, lower=-1 if best_key is None else best_key[0])
        if bottleneck < 0:
            continue
        inside = graph.pair_sum(members)
        leftover = free_sum - sum(deg[p] for p in members) + inside
        key = (bottleneck, inside, leftover, sum(bonus.get(p, 0) for p in members))
        if best_key is None or key > best_key:
            best_key, best = key, members
    assert best_key is not None  # pool has at least `need` members, so one set was scored
    ring = graph.ring_at(best, best_key[0]) if len(best) > 2 else best
    assert ring is not None
    return GpuChoice(
        gpus=tuple(idx[p] for p in best),
        ring=tuple(idx[p] for p in ring),
        score=graph.score(best, best_key[0], free_mask),
        exact=exact,
    )


def _ranked(graph: _Graph, free_mask: int, elig_mask: int, count: int) -> tuple[tuple[int, ...], ...]:
    """Candidate sets (positions) sorted by the objective (a-c), best first, lowest indices
    first among equals: all of them when exact, else the greedy ones."""
    pool = graph.positions(elig_mask)
    free = graph.positions(free_mask)
    deg = {p: sum(graph.qual[p][q] for q in free) for p in free}
    free_sum = graph.pair_sum(free)
    exact = math.comb(len(pool), count) <= EXACT_LIMIT
    sets = itertools.combinations(pool, count) if exact else _greedy_sets(graph, pool, [], count)
    keyed = []
    for members in sets:
        inside = graph.pair_sum(list(members))
        leftover = free_sum - sum(deg[p] for p in members) + inside
        keyed.append((-graph.ring_bottleneck(list(members), lower=-1), -inside, -leftover, members))
    keyed.sort()
    return tuple(k[3] for k in keyed)


def _greedy_sets(graph: _Graph, pool: list[int], required: list[int], need: int) -> list[tuple[int, ...]]:
    """Candidate sets for big searches: from each seed, add the GPU with the best
    (weakest link to the set, pair quality to the set); deduplicated, in index order."""
    seeds = [(p,) for p in pool] if need else [()]
    out: set[tuple[int, ...]] = set()
    for seed in seeds:
        chosen = list(seed)
        rest = [p for p in pool if p not in chosen]
        while len(chosen) < need:
            members = required + chosen

            def gain(c: int, members: list[int] = members) -> tuple[int, int, int]:
                if not members:
                    return (0, 0, -c)
                return (min(graph.rank[c][m] for m in members), sum(graph.qual[c][m] for m in members), -c)

            pick = max(rest, key=gain)
            chosen.append(pick)
            rest.remove(pick)
        out.add(tuple(sorted(chosen)))
    return sorted(out)
