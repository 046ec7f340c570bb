"""The preemption planner's search: which victim sets to offer the engine, in which order, and
how many (docs/preemption.md, "The search and its bound"). Called by
``preempt.plan_preemption`` only.

Overview:

1. **Occupancy.** Which gang holds each GPU of each usable node, so that the GPUs a set of
   gangs would free are counted without the engine.
2. **Domains.** Where the preemptor could land: each node and, for a gang, each HyperNode,
   leaf switch and network-pod (the engine's own domains, ``decide.domain_of``), with the
   candidate gangs holding GPUs there (its *pool*). A domain where evicting its whole pool
   still breaks the slot bound is dropped.
3. **Victim sets per domain.** A domain whose pool (plus, when the preemptor's own queues
   need room, the candidates of its queue chain: *relief*) has at most ``exact_victims``
   gangs offers every subset that passes the slot bound and the quota rules; a larger one
   offers one node-filling greedy set per priority threshold, ``greedy_sets`` at most.
4. **Best first.** Sets are tried in the order of their *cost* — (highest victim priority,
   queue units, gangs), the plan order before the placement — and a domain is expanded only
   when a lower bound of what it can offer is below the cheapest set waiting. The first set
   the engine places fixes the cost; the other sets of that cost are tried for the best
   placement; the search ends at the first dearer set. ``trials`` engine decisions and
   ``domains`` expansions bound it.

**Slot bound.** A member of k whole GPUs needs one node with k free, so for every member
size k the domain's Σ ⌊free GPUs / k⌋ must reach the number of members of at least k GPUs.
It is necessary for the engine to place the gang in the domain, never sufficient (CPU,
RDMA NICs, MIG slots and the engine's packing order decide): only the engine says yes.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from phalanx_engine.decide import TIERS, Cluster, decide, domain_of
from phalanx_engine.framework import Member, Profile
from phalanx_engine.gpu_plugins import GpuTopology
from phalanx_engine.nodestate import NodeState
from phalanx_engine.preempt_rules import Rules, RunningGang
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import NoFit
from phalanx_proto.events import MemberSpec, RequestKind, pod_key
from phalanx_proto.queues import GPU_UNITS

Cost = tuple[int, int, int]
"""(highest victim priority, queue units evicted, gangs evicted): smaller is cheaper."""


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


@dataclass(frozen=True, slots=True)
class SearchStats:
    """What one plan's search did; ``exact`` when it proved its choice optimal (every domain
    it needed searched exhaustively, no bound reached)."""

    candidates: int = 0
    domains: int = 0
    sets: int = 0
    trials: int = 0
    exact: bool = True


@functools.total_ordering
class Desc:
    """A value that sorts larger first inside an ascending key."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Desc) and self.value == other.value

    def __lt__(self, other: Desc) -> bool:
        return self.value > other.value  # type: ignore[operator]

    def __hash__(self) -> int:
        return hash(self.value)


def plan_order(cost: Cost, rank: tuple, gpu_seconds: float, gang_ids: tuple[str, ...]) -> tuple:
    """The plan order, smallest first: the cost, then the best placement (``placement_rank``),
    then the fewest GPU-seconds of work lost, then the victims' gang ids."""
    return (cost, Desc(rank), gpu_seconds, gang_ids)


_TOPOLOGY = GpuTopology()


def placement_rank(cluster: Cluster, decision: Decision, members: Sequence[MemberSpec]) -> tuple:
    """How good a placement is, larger better, by the engine's own topology ranking: the
    smallest network tier that holds every member (one node, HyperNode, leaf switch,
    network-pod), then each member's GPU set as the ``GpuTopology`` score ranks it (RDMA
    level, slowest pair link, link sum), worst member first, then fewer nodes."""
    by_pod = {pod_key(m.pod): Member.of(m) for m in members}
    states = [cluster.nodes[n] for n in sorted({a.node for a in decision.assignments})]
    tier = next((i for i, t in enumerate(TIERS) if len({domain_of(s, t) for s in states}) <= 1), len(TIERS))
    scores = sorted(_TOPOLOGY.score(by_pod[pod_key(a.pod)], cluster.nodes[a.node], a) for a in decision.assignments)
    return (-tier, tuple(scores), -len(states))


class Trials:
    """The engine's decision for the preemptor on the cluster without a set of gangs' pods:
    the only test of whether a victim set helps. Works on its own shallow copy of the cluster
    (the caller's is never changed): a node a set touches is rebuilt from its view without the
    victims' reservations for the decision and put back after it. Assumes, as placement's cache
    keeps them, that each node's state is built from its view."""

    def __init__(self, cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile,
                 avoid: Collection[str], gangs: Mapping[str, RunningGang]) -> None:
        self.scratch = Cluster(nodes=dict(cluster.nodes), total=cluster.total, excluded=cluster.excluded)
        self.members, self.profile, self.avoid = members, profile, frozenset(avoid)
        self.pods: dict[str, dict[str, set[str]]] = {}
        for g in gangs.values():
            for a in g.assignments:
                self.pods.setdefault(g.gang_id, {}).setdefault(a.node, set()).add(pod_key(a.pod))
        self.done: dict[frozenset[str], Decision | None] = {}
        self.calls = 0

    def decide(self, victims: frozenset[str]) -> Decision | None:
        """The preemptor's placement once ``victims`` are gone, or None (remembered per set)."""
        if victims not in self.done:
            self.calls += 1
            got = self._without(victims, lambda: decide(self.scratch, self.members, self.profile, explain=False,
                                                        avoid=self.avoid))
            self.done[victims] = got if isinstance(got, Decision) else None
        return self.done[victims]

    def explain(self, victims: frozenset[str]) -> Decision | NoFit:
        """The engine's full answer once ``victims`` are gone (with every node's status)."""
        return self._without(victims, lambda: decide(self.scratch, self.members, self.profile, avoid=self.avoid))

    def _without(self, victims: frozenset[str], run: Callable[[], Decision | NoFit]) -> Decision | NoFit:
        gone: dict[str, set[str]] = defaultdict(set)
        for g in victims:
            for node, pods in self.pods.get(g, {}).items():
                gone[node] |= pods
        saved = []
        try:
            for node, pods in sorted(gone.items()):
                st = self.scratch.nodes.get(node)
                if st is None:
                    continue
                keep = tuple(a for a in st.view.allocations if pod_key(a.pod) not in pods)
                saved.append(st)
                self.scratch.put(NodeState(dataclasses.replace(st.view, allocations=keep)))
            return run()
        finally:
            for st in saved:
                self.scratch.put(st)


class Occupancy:
    """Which holders (gang ids; ``pod <key>`` for a reservation of no running gang, never a
    victim) hold each whole-capable GPU of each usable node, and what a set of gangs frees."""

    def __init__(self, cluster: Cluster, gangs: Mapping[str, RunningGang]) -> None:
        owner = {pod_key(a.pod): g.gang_id for g in gangs.values() for a in g.assignments}
        self.free: dict[str, int] = {}
        self.held: dict[str, tuple[frozenset[str], ...]] = {}
        self.on: dict[str, dict[str, int]] = defaultdict(dict)
        """Gang id → node → whole-capable GPUs it holds there."""
        for name, st in cluster.nodes.items():
            self.free[name] = len(st.free_whole())
            by_gpu: dict[int, set[str]] = defaultdict(set)
            for a in st.view.allocations:
                holder = owner.get(pod_key(a.pod), "pod " + pod_key(a.pod))
                for g in a.gpus:
                    if g in st.gpus and not st.gpus[g].mig_enabled:
                        by_gpu[g].add(holder)
            self.held[name] = tuple(frozenset(h) for _, h in sorted(by_gpu.items()))
            for holders in by_gpu.values():
                for h in holders:
                    if h in gangs:
                        self.on[h][name] = self.on[h].get(name, 0) + 1

    def free_after(self, node: str, victims: frozenset[str]) -> int:
        """Whole GPUs free on ``node`` once ``victims`` are gone."""
        return self.free[node] + sum(1 for holders in self.held[node] if holders <= victims)


@dataclass
class Domain:
    """Where the preemptor could land, with what evicting there costs at least (``bound``)."""

    tier: int
    name: str
    nodes: frozenset[str]
    pool: tuple[str, ...]
    slots: dict[int, int]
    bound: Cost = (0, 0, 0)


class Search:
    """One best-first search for one preemptor (module docstring)."""

    def __init__(self, rules: Rules, trials: Trials, cluster: Cluster, gangs: Mapping[str, RunningGang],
                 candidates: Collection[str], bounds: SearchBounds, now: float | None) -> None:
        self.rules, self.trials, self.cluster, self.gangs, self.bounds, self.now = rules, trials, cluster, gangs, bounds, now
        self.units = {g: gangs[g].units for g in candidates}
        self.candidates = sorted(candidates, key=self._cheap)
        self.occ = Occupancy(cluster, gangs)
        sizes = [m.gpus for m in trials.members if m.kind is RequestKind.WHOLE and m.gpus]
        self.need = {k: sum(1 for s in sizes if s >= k) for k in sorted(set(sizes))}
        self.whole_need = sum(sizes)
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
        heap: list[tuple] = []
        best: tuple | None = None  # (order, victims, decision)
        at = 0

        def due(d: Domain) -> bool:
            if best is not None:
                return d.bound <= best[0][0]
            return not heap or d.bound < heap[0][0]

        while True:
            while at < len(domains) and due(domains[at]):
                if self.expanded >= self.bounds.domains:
                    self.exact, at = False, len(domains)
                    break
                for victims in self._offer(domains[at]):
                    heapq.heappush(heap, (self.cost(victims), domains[at].tier, at, tuple(sorted(victims)), victims))
                at += 1
            if not heap:
                break
            cost, *_, ids, victims = heapq.heappop(heap)
            if best is not None and cost > best[0][0]:
                break
            if self.trials.calls >= self.bounds.trials:
                self.exact = False
                break
            got = self.trials.decide(victims)
            if got is None:
                continue
            rank = placement_rank(self.trials.scratch, got, self.trials.members)
            order = plan_order(cost, rank, self.gpu_seconds(victims), ids)
            if best is None or order < best[0]:
                best = (order, victims, got)
        return None if best is None else (best[1], best[2])

    # -- domains ---------------------------------------------------------------------------------
    def _domains(self) -> list[Domain]:
        """Every domain the preemptor could land in with evictions, cheapest bound first."""
        tiers = TIERS if len(self.trials.members) > 1 else TIERS[:1]
        usable = [st for name, st in sorted(self.cluster.nodes.items()) if name not in self.trials.avoid]
        pools: dict[str, set[str]] = defaultdict(set)
        for g in self.candidates:
            for n in self.occ.on.get(g, {}):
                pools[n].add(g)
        seen: set[frozenset[str]] = set()
        out = []
        for t, tier in enumerate(tiers):
            groups: dict[str, list[str]] = defaultdict(list)
            for st in usable:
                groups[domain_of(st, tier)].append(st.name)
            for name, nodes in sorted(groups.items()):
                key = frozenset(nodes)
                pool = sorted({g for n in nodes for g in pools[n]}, key=self._cheap)
                if key in seen or not (pool or self.relief):
                    continue
                seen.add(key)
                dom = Domain(t, name, key, tuple(pool), {k: sum(self.occ.free[n] // k for n in nodes) for k in self.need})
                bound = self._bound(dom)
                if bound is not None:
                    dom.bound = bound
                    out.append(dom)
        out.sort(key=lambda d: (d.bound, d.tier, d.name))
        return out

    def _in(self, g: str, dom: Domain) -> int:
        return sum(c for n, c in self.occ.on.get(g, {}).items() if n in dom.nodes)

    def _bound(self, dom: Domain) -> Cost | None:
        """A cost no set the domain offers is below (its local part must pass the slot bound):
        the lowest priority threshold at which the pool can, the units of a fractional cover
        of the missing GPUs, the fewest gangs that could cover them. None: it never can. A
        domain with room already (victims only for a limit) is bounded by its cheapest victim."""
        if self._fits(dom, frozenset()):  # room already: only the queues' accounting needs victims
            return (min(self.gangs[g].priority for g in (*dom.pool, *self.relief)), 0, 1)
        top = next((p for p in sorted({self.gangs[g].priority for g in dom.pool})
                    if self._fits(dom, frozenset(g for g in dom.pool if self.gangs[g].priority <= p))), None)
        if top is None:
            return None
        missing = max(0, self.whole_need - sum(self.occ.free[n] for n in dom.nodes))
        cover = [(self.units[g], self._in(g, dom)) for g in dom.pool if self.gangs[g].priority <= top]
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

    def _fits(self, dom: Domain, victims: frozenset[str]) -> bool:
        """The slot bound in ``dom`` once ``victims`` are gone."""
        if not self.need:
            return True
        after = {n: self.occ.free_after(n, victims)
                 for n in {n for g in victims for n in self.occ.on.get(g, {}) if n in dom.nodes}}
        return all(dom.slots[k] + sum(a // k - self.occ.free[n] // k for n, a in after.items()) >= count
                   for k, count in self.need.items())

    # -- victim sets -----------------------------------------------------------------------------
    def _offer(self, dom: Domain) -> list[frozenset[str]]:
        """The domain's victim sets that pass the slot bound and the rules, not offered before."""
        self.expanded += 1
        items = list(dom.pool) + [g for g in self.relief if g not in dom.pool]
        if len(items) <= self.bounds.exact_victims:
            sets = (frozenset(c) for r in range(1, len(items) + 1) for c in itertools.combinations(items, r))
            sets = (s for s in sets if self._fits(dom, s))
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
            allowed = [g for g in dom.pool if self.gangs[g].priority <= top]
            if not self._fits(dom, frozenset(allowed)):
                continue
            on_node: dict[str, list[str]] = defaultdict(list)
            for g in allowed:
                for n in self.occ.on[g]:
                    if n in dom.nodes:
                        on_node[n].append(g)
            chosen: set[str] = set()
            for n in sorted(on_node, key=lambda n: (max(self.gangs[g].priority for g in on_node[n]),
                                                    sum(self.units[g] for g in on_node[n]), n)):
                chosen.update(on_node[n])
                if self._fits(dom, frozenset(chosen)):
                    break
            for g in sorted(chosen, key=lambda g: (-self.gangs[g].priority, -self.units[g], g)):
                if self._fits(dom, frozenset(chosen - {g})):
                    chosen.discard(g)
            for g in [None, *(r for r in self.relief if r not in chosen)]:
                if g is not None:
                    chosen.add(g)
                if not self._breaks(frozenset(chosen)):
                    out.append(frozenset(chosen))
                    break
            if len(out) >= self.bounds.greedy_sets:
                break
        return out
