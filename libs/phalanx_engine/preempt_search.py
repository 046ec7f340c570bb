"""The preemption planner's search: which victim sets to offer the engine, in which order, and
how many (docs/preemption.md, "The search and its bound"). Called by
``preempt.plan_preemption`` only; each set is judged by ``preempt_order``.

Overview:

1. **Domains.** Where the preemptor could land: each node and, for a gang, each HyperNode,
   leaf switch and network-pod (the engine's own domains, ``topology.domain_of``) that could
   hold it empty, with the candidate gangs holding GPUs there (the domain's *pool*), each
   with a cheap lower bound of the cost of what it can offer.
2. **Bounds, lazily.** Domains wait in a heap by bound; the one at the head gets its exact
   bound (which reads who holds each GPU of its nodes, ``Occupancy``) before it is expanded,
   and is dropped when even its whole pool leaves the slot bound unmet.
3. **Victim sets per domain.** A domain whose pool (plus, when the preemptor's own queues
   need room, the candidates of its queue chain: *relief*) has at most ``exact_victims``
   gangs offers every subset that passes the slot bound and the rules; a larger one offers
   one node-filling greedy set per priority threshold, ``greedy_sets`` at most.
4. **Best first.** Sets are tried in the order of their *cost* — (highest victim priority,
   queue units, gangs), the plan order before the placement — and a domain is expanded only
   while its bound is below the cheapest set waiting. The first set the engine places fixes
   the cost; up to ``ties`` more sets of that cost are tried for the best placement (then
   GPU-seconds); the search ends at the first dearer set. ``trials`` engine decisions and
   ``domains`` expansions bound it.

**Slot bound.** A member of k whole GPUs needs one node with k free, so for every member
size k the domain's Σ ⌊free GPUs / k⌋ must reach the number of members of at least k GPUs,
and its Σ free GPUs the gang's whole GPUs. It is necessary for the engine to place the gang in
the domain, never sufficient (CPU, RDMA NICs, MIG slots and the engine's packing order
decide): only the engine says yes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Set
from dataclasses import dataclass

from phalanx_engine.decide import Cluster
from phalanx_engine.preempt_order import Cost, Trials, plan_order
from phalanx_engine.snapshot import Decision
from phalanx_engine.topology import TIERS
from phalanx_proto.events import RequestKind, pod_key
from phalanx_proto.queues import GPU_UNITS
from phalanx_rules.preemption import Rules, RunningGang


@dataclass(frozen=True, slots=True)
class SearchBounds:
    """What bounds one plan's time (docs/preemption.md measures it)."""

    exact_victims: int = 10
    """A domain with at most this many candidate gangs offers all their subsets (2^10 = 1,024)."""
    trials: int = 64
    """Engine decisions at most, the check without victims included."""
    domains: int = 256
    """Domains expanded at most."""
    greedy_sets: int = 3
    """Greedy sets a larger domain offers (one per priority threshold, lowest first)."""
    ties: int = 16
    """Engine decisions spent, once a plan is found, on other sets of its cost."""


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What one plan's search did; ``exact`` when it proved its choice optimal (every domain
    it needed searched exhaustively, no bound reached)."""

    candidates: int = 0
    domains: int = 0
    sets: int = 0
    trials: int = 0
    exact: bool = True


def _per(free: int, k: int) -> int:
    """What ``free`` GPUs on a node count for slot key ``k``: members of k GPUs, or GPUs (k = 0)."""
    return free if k == 0 else free // k


class Occupancy:
    """Who holds the whole-capable GPUs of each usable node, read from a node's view the first
    time it is asked; and what a set of victims frees. A victim is a running gang or one extra
    member of an elastic gang (``state.victim_unit``), so one pod may belong to two victims (its
    gang, and itself as an extra): a GPU is freed when every pod on it belongs to a victim of
    the set. A reservation of no running gang is never freed."""

    def __init__(self, cluster: Cluster, gangs: Mapping[str, RunningGang]) -> None:
        self.cluster = cluster
        owners: dict[str, set[str]] = defaultdict(set)
        for g in gangs.values():
            for a in g.assignments:
                owners[pod_key(a.pod)].add(g.gang_id)
        self.owner = {k: frozenset(v) for k, v in owners.items()}
        """Pod key → the victims it belongs to."""
        self.free = {name: len(st.free_whole()) for name, st in cluster.nodes.items()}
        self.on: dict[str, dict[str, int]] = defaultdict(dict)
        """Victim id → usable node → GPUs it holds there."""
        for g in gangs.values():
            for a in g.assignments:
                if a.node in self.free:
                    self.on[g.gang_id][a.node] = self.on[g.gang_id].get(a.node, 0) + len(a.gpus)
        self._held: dict[str, tuple[tuple[frozenset[str], ...], ...]] = {}

    def holders_of(self, node: str) -> tuple[tuple[frozenset[str], ...], ...]:
        """Per whole-capable GPU of ``node`` that something holds: for each pod on it, the
        victims it belongs to (none: never freed)."""
        if node not in self._held:
            st = self.cluster.nodes[node]
            by_gpu: dict[int, list[frozenset[str]]] = {}
            for a in st.view.allocations:
                owners = self.owner.get(pod_key(a.pod), frozenset())
                for g in a.gpus:
                    by_gpu.setdefault(g, []).append(owners)
            self._held[node] = tuple(tuple(h) for g, h in by_gpu.items()
                                     if g in st.gpus and not st.gpus[g].mig_enabled)
        return self._held[node]

    def free_after(self, node: str, victims: Set[str]) -> int:
        """Whole GPUs free on ``node`` once ``victims`` are gone."""
        return self.free[node] + sum(1 for pods in self.holders_of(node)
                                     if all(not owners.isdisjoint(victims) for owners in pods))


@dataclass
class Domain:
    """Where the preemptor could land, with a cost no set it offers is below (``bound``)."""

    tier: int
    name: str
    nodes: frozenset[str]
    pool: tuple[str, ...]
    slots: dict[int, int]
    inside: dict[str, int]
    """Pool gang → GPUs it holds in the domain."""
    bound: Cost = (0, 0, 0)
    exact: bool = False
    """Whether ``bound`` is the exact one (the slot bound checked) or the cheap one."""


class Slots:
    """The slot bound of one domain, kept while victims are added and removed one at a time."""

    def __init__(self, occ: Occupancy, dom: Domain, need: Mapping[int, int]) -> None:
        self.occ, self.dom, self.need = occ, dom, need
        self.slots = dict(dom.slots)
        self.after: dict[str, int] = {}
        self.chosen: set[str] = set()

    def _move(self, g: str) -> None:
        for n in self.occ.on.get(g, {}):
            if n in self.dom.nodes:
                old, new = self.after.get(n, self.occ.free[n]), self.occ.free_after(n, self.chosen)
                self.after[n] = new
                for k in self.slots:
                    self.slots[k] += _per(new, k) - _per(old, k)

    def add(self, g: str) -> None:
        self.chosen.add(g)
        self._move(g)

    def remove(self, g: str) -> None:
        self.chosen.discard(g)
        self._move(g)

    def ok(self) -> bool:
        return all(self.slots[k] >= count for k, count in self.need.items())


def fits(occ: Occupancy, dom: Domain, need: Mapping[int, int], victims: Iterable[str]) -> bool:
    """The slot bound in ``dom`` once ``victims`` are gone."""
    slots = Slots(occ, dom, need)
    for g in victims:
        slots.add(g)
    return slots.ok()


class Search:
    """One best-first search for one preemptor (module docstring)."""

    def __init__(self, rules: Rules, trials: Trials, cluster: Cluster, gangs: Mapping[str, RunningGang],
                 units: Mapping[str, int], candidates: Collection[str], bounds: SearchBounds,
                 now: float | None) -> None:
        self.rules, self.trials, self.cluster, self.gangs, self.bounds, self.now = rules, trials, cluster, gangs, bounds, now
        self.units = units
        self.candidates = sorted(candidates, key=self._cheap)
        self.occ = Occupancy(cluster, gangs)
        sizes = [m.gpus for m in trials.members if m.kind is RequestKind.WHOLE and m.gpus]
        self.need = {k: sum(1 for s in sizes if s >= k) for k in sorted(set(sizes))}
        if sizes:
            self.need[0] = sum(sizes)
        self.relief = ([g for g in self.candidates if set(gangs[g].queues) & set(rules.chain)]
                       if rules.tight() else [])
        self.offered: set[frozenset[str]] = set()
        self.expanded = 0
        self.exact = True

    def _cheap(self, g: str) -> tuple:
        return (self.gangs[g].priority, self.units[g], g)

    def cost(self, victims: frozenset[str]) -> Cost:
        return (max(self.gangs[g].priority for g in victims), sum(self.units[g] for g in victims), len(victims))

    def gpu_seconds(self, victims: frozenset[str]) -> float:
        """GPU-seconds of work the victims lose (0 for a gang without a start time)."""
        if self.now is None:
            return 0.0
        return sum(self.units[g] / GPU_UNITS * max(0.0, self.now - s)
                   for g in sorted(victims) if (s := self.gangs[g].started_at) is not None)

    def run(self) -> tuple[frozenset[str], Decision] | None:
        """The best victim set the bounds allow and the engine's placement after it, or None."""
        domains = self._domains()
        waiting = [(d.bound, d.tier, d.name, i) for i, d in enumerate(domains)]
        heapq.heapify(waiting)
        heap: list[tuple] = []
        best: tuple | None = None  # (order, victims, decision)
        ties = self.bounds.ties

        def due(bound: Cost) -> bool:
            if best is not None:  # only ties are of interest now, those already offered first
                return bound <= best[0][0] and (not heap or heap[0][0] > best[0][0])
            return not heap or bound < heap[0][0]

        while True:
            while waiting and due(waiting[0][0]) and (ties > 0 or best is None):
                *_, i = heapq.heappop(waiting)
                dom = domains[i]
                if not dom.exact:  # refine the bound, then let it queue again
                    bound = self._bound(dom)
                    if bound is not None:
                        dom.bound, dom.exact = bound, True
                        heapq.heappush(waiting, (dom.bound, dom.tier, dom.name, i))
                    continue
                if self.expanded >= self.bounds.domains:
                    self.exact, waiting = False, []
                    break
                for victims in self._offer(dom):
                    if victims:  # the empty set was tried first (plan_preemption): it did not fit
                        heapq.heappush(heap, (self.cost(victims), dom.tier, i, tuple(sorted(victims)), victims))
            if not heap or (best is not None and heap[0][0] > best[0][0]):
                break
            if (ties <= 0 and best is not None) or self.trials.calls >= self.bounds.trials:
                self.exact = False
                break
            cost, *_, ids, victims = heapq.heappop(heap)
            got = self.trials.decide(victims)
            ties -= best is not None
            if got is None:
                continue
            order = plan_order(cost, self.trials.rank(got), self.gpu_seconds(victims), ids)
            if best is None or order < best[0]:
                best = (order, victims, got)
        if best is not None and ties <= 0 and waiting and waiting[0][0] <= best[0][0]:
            self.exact = False
        return None if best is None else (best[1], best[2])

    # -- domains ---------------------------------------------------------------------------------
    def _domains(self) -> list[Domain]:
        """Every domain the preemptor could land in with evictions, with its cheap bound; from
        the cluster's topology index, by tier and then domain name. Without relief victims only
        the domains holding a candidate's GPUs outside ``avoid`` can offer a set, so only those
        are looked at."""
        tiers = TIERS if len(self.trials.members) > 1 else TIERS[:1]
        avoid = self.trials.avoid
        topology = self.cluster.topology
        pools: dict[str, dict[str, int]] = defaultdict(dict)  # node → candidate → GPUs it holds there
        for g in self.candidates:
            for n, count in self.occ.on.get(g, {}).items():
                pools[n][g] = count
        seen: set[frozenset[str]] = set()
        out = []
        for t, tier in enumerate(tiers):
            domains = topology.domains(tier)
            names = (sorted(domains) if self.relief else
                     sorted({topology.domain(n, tier) for n, pool in pools.items() if pool and n not in avoid}))
            for name in names:
                nodes = sorted(n for n in domains[name] if n not in avoid)
                key = frozenset(nodes)
                if not nodes or key in seen:
                    continue
                seen.add(key)
                capacity = [self.cluster.nodes[n].whole_capacity() for n in nodes]
                if any(sum(_per(c, k) for c in capacity) < count for k, count in self.need.items()):
                    continue  # too small even empty
                inside: dict[str, int] = defaultdict(int)
                for n in nodes:
                    for g, count in pools[n].items():
                        inside[g] += count
                slots = {k: sum(_per(self.occ.free[n], k) for n in nodes) for k in self.need}
                dom = Domain(t, name, key, tuple(sorted(inside, key=self._cheap)), slots, dict(inside))
                dom.bound = self._cover(dom, min(self.gangs[g].priority for g in (*dom.pool, *self.relief)))
                out.append(dom)
        return out

    def _cover(self, dom: Domain, top: int) -> Cost:
        """(top, units, gangs) with the units of a fractional cover, by the pool's gangs of
        priority up to ``top``, of the whole GPUs the domain lacks, and the fewest such gangs
        that could cover them (each counted with every GPU it holds in the domain)."""
        missing = max(0, self.need.get(0, 0) - dom.slots.get(0, 0))
        cover = [(self.units[g], dom.inside[g]) for g in dom.pool if self.gangs[g].priority <= top and dom.inside[g]]
        units, left = 0.0, missing
        for u, f in sorted(cover, key=lambda c: c[0] / c[1]):
            if left <= 0:
                break
            units, left = units + u * min(f, left) / f, left - min(f, left)
        gangs, left = 0, missing
        for _, f in sorted(cover, key=lambda c: -c[1]):
            if left <= 0:
                break
            gangs, left = gangs + 1, left - f
        return (top, math.floor(units + 1e-9), max(1, gangs))

    def _bound(self, dom: Domain) -> Cost | None:
        """The exact bound: the lowest priority threshold at which the pool passes the slot
        bound, covered as ``_cover`` does; a domain with room already (victims only for a
        queue's limit) is bounded by its cheapest victim. None: the pool never passes."""
        slots = Slots(self.occ, dom, self.need)
        if slots.ok():
            return (min(self.gangs[g].priority for g in (*dom.pool, *self.relief)), 0, 1)
        for g in dom.pool:  # in priority order: the first threshold at which the slots suffice
            slots.add(g)
            if slots.ok():
                return self._cover(dom, self.gangs[g].priority)
        return None

    # -- victim sets -----------------------------------------------------------------------------
    def _offer(self, dom: Domain) -> list[frozenset[str]]:
        """The domain's victim sets that pass the slot bound and the rules, not offered before."""
        self.expanded += 1
        items = list(dom.pool) + [g for g in self.relief if g not in dom.pool]
        if len(items) <= self.bounds.exact_victims:
            sets: Iterable[frozenset[str]] = (frozenset(c) for r in range(1, len(items) + 1)
                                              for c in itertools.combinations(items, r))
            sets = (s for s in sets if fits(self.occ, dom, self.need, s))
        else:
            self.exact = False
            sets = self._greedy(dom)
        out = []
        for s in sets:
            if s not in self.offered:
                self.offered.add(s)
                if not self._breaks(s):
                    out.append(s)
        return out

    def _breaks(self, victims: frozenset[str]) -> str:
        return self.rules.breaks((self.gangs[g] for g in sorted(victims)), self.units)

    def _greedy(self, dom: Domain) -> list[frozenset[str]]:
        """Per priority threshold (lowest first) at which the pool passes the slot bound: empty
        the cheapest nodes (highest priority to evict, then units) until it passes, drop every
        victim it does not need (highest priority, then largest, first), then add relief
        victims (cheapest first) until the rules hold."""
        out = []
        for top in sorted({self.gangs[g].priority for g in dom.pool}):
            on_node: dict[str, list[str]] = defaultdict(list)
            for g in dom.pool:
                if self.gangs[g].priority <= top:
                    for n in self.occ.on[g]:
                        if n in dom.nodes:
                            on_node[n].append(g)
            slots = Slots(self.occ, dom, self.need)
            for n in sorted(on_node, key=lambda n: (max(self.gangs[g].priority for g in on_node[n]),
                                                    sum(self.units[g] for g in on_node[n]), n)):
                for g in on_node[n]:
                    if g not in slots.chosen:
                        slots.add(g)
                if slots.ok():
                    break
            if not slots.ok():
                continue
            for g in sorted(slots.chosen, key=lambda g: (-self.gangs[g].priority, -self.units[g], g)):
                slots.remove(g)
                if not slots.ok():
                    slots.add(g)
            chosen = set(slots.chosen)
            for more in [None, *(r for r in self.relief if r not in chosen)]:
                if more is not None:
                    chosen.add(more)
                if not self._breaks(frozenset(chosen)):
                    out.append(frozenset(chosen))
                    break
            if len(out) >= self.bounds.greedy_sets:
                break
        return out
