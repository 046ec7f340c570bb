"""Counterfactual probes: for a gang that does not fit, the smallest changes that would let it
start now (docs/whatif.md). Pure; called by placement after a ``NoFit`` (the top answer goes at
the end of the pending reason), by ``phalanx sim`` for the gangs still pending, and by tests.

Every probe changes one thing — the capacity running gangs hold, the queue's headroom, the
network tier, the GPU model, the request, the member count — and asks the same engine
(``decide.decide`` with the caller's ``Profile``) on the same cluster view; an answer carries
that decision. The probes, in the order their answers are listed (``PROBES``):

1. ``queue-limit`` / ``queue-quota`` — the queue's limit (or, while a queue below its quota is
   owed the free GPUs, its quota) lacks headroom: how much;
2. ``wait`` — which GPUs would have to be free, and which running gangs hold them;
3. ``preempt`` — which gangs a preemption planner would evict, and why it does not (a hook:
   ``Preemptor``);
4. ``tier`` — a looser network tier, only as loose as the gang's constraints allow;
5. ``model`` — another GPU model, where the gang pins one by a node selector;
6. ``smaller`` — smaller per-member requests (GPUs, core %, GPU memory, CPU, memory, ...);
7. ``fewer`` — fewer members.

The first answers need no change to the gang (the queue's numbers, time, someone else's
gang), the later ones change what it asks for. Each probe searches for its minimal change
(``whatif_search``) and all of them share one time budget: a probe that runs out is listed in
``WhatIf.cut`` with every probe after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import msgspec

from phalanx_engine import queueorder
from phalanx_engine.decide import DEFAULT_PROFILE, Cluster, decide
from phalanx_engine.framework import Profile
from phalanx_engine.nodestate import NodeState
from phalanx_engine.queues import QueueTree
from phalanx_engine.snapshot import Decision
from phalanx_engine.topology import TIER_NAMES, TIERS
from phalanx_proto.events import Assignment, MemberSpec, PodRef, RequestKind
from phalanx_proto.queues import GPU_UNITS, shown
from phalanx_proto.whatif import PROBES, Answer, Holder, WhatIf

DEFAULT_BUDGET_S = 0.05
"""Time all probes of one gang share unless the caller says otherwise (docs/whatif.md has the
cost measured at 1,000 nodes)."""


@dataclass(frozen=True, slots=True)
class Running:
    """The gang a reservation belongs to, as the caller knows it (placement: the ledger's
    ``Allocation.gang_id`` and the gang's record; the simulator: its own books)."""

    gang_id: str
    queue: str = ""
    priority: int = 0
    since: float = 0.0
    """When its reservation was made (unix or virtual seconds; 0 unknown)."""


@dataclass(frozen=True)
class QueueView:
    """The gang's queue as the decision saw it: the tree, what each queue holds (units; a
    limited queue's by its usage record), units the same commit would give back, and the
    queues below quota the free GPUs are kept for (non-empty: the borrow gate held the gang)."""

    tree: QueueTree
    held: Mapping[str, int]
    releasing: Mapping[str, int] = field(default_factory=dict)
    owed: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreemptPlan:
    """What a preemption planner would do for the gang: evict ``victims`` (gang ids); whether
    Phalanx would (``allowed``) and, if not, why (priority, queue policy)."""

    victims: tuple[str, ...]
    allowed: bool = False
    why_not: str = ""


class Preemptor(Protocol):
    """The preemption planner's hook (``phalanx_engine.preempt`` plugs in here): the plan that
    would start ``members`` on ``cluster``, or None. Must not change ``cluster``."""

    def __call__(self, cluster: Cluster, members: tuple[MemberSpec, ...], *,
                 holders: Mapping[PodRef, Running]) -> PreemptPlan | None: ...


@dataclass(frozen=True)
class ProbeContext:
    """What the probes know besides the cluster and the gang (every field optional)."""

    holders: Mapping[PodRef, Running] = field(default_factory=dict)
    now: float = 0.0
    queue: QueueView | None = None
    avoid: frozenset[str] = frozenset()
    """Nodes kept for a gang ahead (the decision's ``avoid``): no probe uses them."""
    loosest: str = "netpod"
    """The widest tier the decision allowed the gang (R8: a network-pod)."""
    permitted: str = "netpod"
    """The widest tier the gang's constraints allow; the tier probe looks between the two."""
    preempt: Preemptor | None = None


class OutOfTime(Exception):
    """The probes' budget is spent."""


class Probing:
    """One gang's probes in progress: the cluster, the gang, the context and the deadline.
    ``decide`` is the only way a probe asks the engine (it keeps the deadline)."""

    def __init__(self, cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile,
                 ctx: ProbeContext, deadline: float, clock: Callable[[], float],
                 max_decisions: int | None = None) -> None:
        self.cluster, self.members, self.profile, self.ctx = cluster, members, profile, ctx
        self.deadline, self.clock, self.max_decisions = deadline, clock, max_decisions
        self.decisions = 0
        self._built: dict[tuple[str, tuple[PodRef, ...]], NodeState] = {}
        """Node states without some reservations, built once per probe run (decisions copy
        the states they change, so one state serves every released cluster it is part of)."""

    def decide(self, members: tuple[MemberSpec, ...], cluster: Cluster | None = None, *,
               loosest: str | None = None) -> Decision | None:
        """The engine's decision on ``cluster`` (default: the gang's), or None when nothing fits."""
        if self.clock() > self.deadline or (self.max_decisions is not None and self.decisions >= self.max_decisions):
            raise OutOfTime
        self.decisions += 1
        got = decide(self.cluster if cluster is None else cluster, members, self.profile, explain=False,
                     avoid=self.ctx.avoid, loosest=loosest or self.ctx.loosest)
        return got if isinstance(got, Decision) else None

    def queue_lets(self, members: tuple[MemberSpec, ...]) -> bool:
        """Would the gang's queue let ``members`` be placed (limit, and the borrow gate)?"""
        q = self.ctx.queue
        if q is None:
            return True
        if queueorder.refusal(q.tree, members, q.held, q.releasing):
            return False
        queue = queueorder.queue_of(members)
        return not (q.owed and queueorder.borrowing(q.tree, members, q.held, q.releasing.get(queue, 0)))

    def starts(self, members: tuple[MemberSpec, ...], cluster: Cluster | None = None, *,
               loosest: str | None = None) -> Decision | None:
        """The decision when ``members`` fit and their queue lets them, else None."""
        if not self.queue_lets(members):
            return None
        return self.decide(members, cluster, loosest=loosest)

    def released(self, names, pods: frozenset[PodRef]) -> Cluster:
        """A cluster of the nodes ``names`` as they would be without the reservations of ``pods``
        (a node's reservations are read from its view, which placement's cache keeps current)."""
        nodes: dict[str, NodeState] = {}
        for n in names:
            st = self.cluster.nodes[n]
            gone = tuple(a.pod for a in st.view.allocations if a.pod in pods)
            if gone:
                key = (n, gone)
                built = self._built.get(key)
                if built is None:
                    view = replace(st.view, allocations=tuple(a for a in st.view.allocations if a.pod not in pods))
                    built = self._built[key] = NodeState(view)
                st = built
            nodes[n] = st
        return Cluster(nodes=nodes, total=len(nodes))

    def holder(self, pod: PodRef) -> Running:
        return self.ctx.holders.get(pod) or Running(gang_id=f"{pod.namespace}/{pod.name}")


def what_if(cluster: Cluster, members: tuple[MemberSpec, ...], profile: Profile = DEFAULT_PROFILE,
            ctx: ProbeContext = ProbeContext(), *, budget_s: float = DEFAULT_BUDGET_S,
            clock: Callable[[], float] = time.perf_counter, max_decisions: int | None = None) -> WhatIf:
    """Every probe's answer for a gang that did not fit ``cluster`` (which is not changed), in
    ``PROBES`` order, within ``budget_s`` seconds of ``clock`` and at most ``max_decisions``
    engine decisions (a budget in decisions gives the same answers on any machine: the
    simulator's). Never raises for a gang the engine can decide; a probe out of budget is named
    in ``cut``, with every probe after it."""
    from phalanx_engine import whatif_search as search

    started = clock()
    p = Probing(cluster, members, profile, ctx, started + budget_s, clock, max_decisions)
    steps: tuple[tuple[str, Callable[[Probing], list[Answer]]], ...] = (
        ("queue", probe_queue), ("wait", search.probe_wait), ("preempt", probe_preempt), ("tier", probe_tier),
        ("model", search.probe_model), ("smaller", search.probe_smaller), ("fewer", search.probe_fewer))
    answers: list[Answer] = []
    cut: list[str] = []
    for i, (_name, probe) in enumerate(steps):
        try:
            answers.extend(probe(p))
        except OutOfTime:
            cut = [n for n, _ in steps[i:]]
            break
    answers.sort(key=lambda a: PROBES.index(a.probe))
    return WhatIf(answers=tuple(answers), spent_ms=round((clock() - started) * 1000, 3), decisions=p.decisions,
                  cut=tuple(cut))


def top_line(result: WhatIf) -> str:
    """The line placement appends to the pending reason (``...; would start if ...``)."""
    return result.top()


# --- the probes that need no search ----------------------------------------------------------


def probe_queue(p: Probing) -> list[Answer]:
    """The queue's limit (nearest on its chain first) or, under the borrow gate, its quota:
    the headroom lacking. ``starts`` when that alone stands between the gang and a place."""
    q = p.ctx.queue
    if q is None:
        return []
    tree, queue, need = q.tree, queueorder.queue_of(p.members), queueorder.units(p.members)
    if tree.problem(queue):
        return []  # the reason names the broken queue; no amount of headroom helps
    short = []
    for name in tree.chain(queue):
        spec = tree.specs[name]
        held = q.held.get(name, 0) - q.releasing.get(name, 0)
        if spec.limit is not None and held + need > spec.limit:
            short.append((name, spec.limit, held))
    if short:
        name, limit, held = short[0]
        lack = held + need - limit
        fits = p.decide(p.members)
        starts = fits is not None and len(short) == 1 and not q.owed
        text = (f"would start if queue {name} had {shown(lack)} more GPUs under its limit {shown(limit)} "
                f"(it holds {shown(held)}, the gang needs {shown(need)})")
        if fits is None:
            text = f"needs {shown(lack)} more GPUs of headroom under queue {name}'s limit {shown(limit)}, and room in the cluster"
        return [Answer(probe="queue-limit", text=text, starts=starts, queue=name, lacking_gpus=lack / GPU_UNITS,
                       assignments=fits.assignments if fits else (), **_where(p, fits))]
    spec = tree.get(queue)
    if q.owed and spec is not None and queueorder.borrowing(tree, p.members, q.held, q.releasing.get(queue, 0)):
        held = q.held.get(queue, 0) - q.releasing.get(queue, 0)
        lack = held + need - spec.quota
        fits = p.decide(p.members)
        text = (f"would start if queue {queue}'s quota were {shown(lack)} GPUs higher (it would borrow beyond "
                f"{shown(spec.quota)} while queue(s) {', '.join(q.owed)}, below quota, wait)")
        return [Answer(probe="queue-quota", text=text, starts=fits is not None, queue=queue,
                       lacking_gpus=lack / GPU_UNITS, assignments=fits.assignments if fits else (),
                       **_where(p, fits))]
    return []


def probe_preempt(p: Probing) -> list[Answer]:
    """The planner's victims, checked: the gang must fit once their reservations are gone."""
    if p.ctx.preempt is None:
        return []
    plan = p.ctx.preempt(p.cluster, p.members, holders=p.ctx.holders)
    if plan is None or not plan.victims:
        return []
    victims = set(plan.victims)
    pods = frozenset(a.pod for st in p.cluster.nodes.values() for a in st.view.allocations
                     if p.holder(a.pod).gang_id in victims)
    fits = p.decide(p.members, p.released(p.cluster.nodes, pods))
    if fits is None:
        return []
    names = ", ".join(sorted(victims)[:3]) + (f" and {len(victims) - 3} more" if len(victims) > 3 else "")
    text = f"would start if gang(s) {names} were preempted"
    if not plan.allowed:
        text += f"; not done: {plan.why_not or 'preemption does not allow it'}"
    holders = _holders(p, pods, fits.assignments)
    return [Answer(probe="preempt", text=text, starts=plan.allowed and p.queue_lets(p.members), holders=holders,
                   gpus=busy_gpus(p.cluster, fits.assignments), assignments=fits.assignments, **_where(p, fits))]


def probe_tier(p: Probing) -> list[Answer]:
    """The next looser tier up to ``ctx.permitted`` where the gang fits (none when the gang may
    already span as far as its constraints allow — R8's network-pod, for every gang today)."""
    lo, hi = TIERS.index(p.ctx.loosest), TIERS.index(p.ctx.permitted)
    for tier in TIERS[lo + 1:hi + 1]:
        fits = p.starts(p.members, loosest=tier)
        if fits is not None:
            text = (f"would start if it could span one {TIER_NAMES[tier]} instead of one "
                    f"{TIER_NAMES[p.ctx.loosest]}")
            return [Answer(probe="tier", text=text, change=f"{p.ctx.loosest} -> {tier}",
                           assignments=fits.assignments, **_where(p, fits))]
    return []


# --- shared helpers ------------------------------------------------------------------------------


def tier_of(cluster: Cluster, assignments: tuple[Assignment, ...]) -> tuple[str, str]:
    """(tier, domain): the tightest network tier one domain of which holds every node of
    ``assignments`` (``Topology.tier_of``: ``domain_of``'s rule, so nodes that report no domain
    at a tier never share one there); ``("cluster", "")`` when no network-pod holds them all."""
    return cluster.topology.tier_of(a.node for a in assignments)


def _where(p: Probing, fits: Decision | None) -> dict[str, str]:
    if fits is None:
        return {}
    tier, domain = tier_of(p.cluster, fits.assignments)
    return {"tier": tier, "domain": domain}


def busy_gpus(cluster: Cluster, assignments: tuple[Assignment, ...]) -> int:
    """GPUs that would have to be freed for ``assignments``: per node, the whole GPUs they take
    beyond those free now, and the shared or MIG GPUs they take that cannot take them now."""
    n = 0
    whole: dict[str, int] = {}
    for a in assignments:
        st = cluster.nodes.get(a.node)
        if st is None:
            continue
        if a.kind is RequestKind.WHOLE:
            whole[a.node] = whole.get(a.node, 0) + len(a.gpus)
            continue
        for g in a.gpus:
            n += g in st.whole or g in st.mig_inst or st.core.get(g, 0) + a.core_pct > 100
    return n + sum(max(0, k - len(cluster.nodes[name].free_whole())) for name, k in whole.items())


def _holders(p: Probing, pods: frozenset[PodRef], assignments: tuple[Assignment, ...]) -> tuple[Holder, ...]:
    """The gangs owning ``pods``, each with the GPUs it holds on the decision's nodes, most first."""
    where = {a.node for a in assignments}
    gpus: dict[str, int] = {}
    info: dict[str, Running] = {}
    for n in where:
        for a in p.cluster.nodes[n].view.allocations if n in p.cluster.nodes else ():
            if a.pod in pods:
                r = p.holder(a.pod)
                info[r.gang_id] = r
                gpus[r.gang_id] = gpus.get(r.gang_id, 0) + len(a.gpus)
    for pod in pods:
        r = p.holder(pod)
        info.setdefault(r.gang_id, r)
    out = [Holder(gang_id=g, queue=r.queue, priority=r.priority, gpus=gpus.get(g, 0),
                  age_s=round(max(0.0, p.ctx.now - r.since), 3) if r.since else 0.0) for g, r in info.items()]
    return tuple(sorted(out, key=lambda h: (-h.gpus, h.gang_id)))


def names_text(holders: tuple[Holder, ...], most: int = 3) -> str:
    shown_ = ", ".join(h.gang_id for h in holders[:most])
    return shown_ + (f" and {len(holders) - most} more" if len(holders) > most else "")


def replace_members(members: tuple[MemberSpec, ...], **changes) -> tuple[MemberSpec, ...]:
    return tuple(msgspec.structs.replace(m, **changes) for m in members)
