"""What every what-if probe shares (docs/whatif.md): the context the caller gives
(``ProbeContext``, ``QueueView``, ``Running``, the ``Preemptor`` hook), one gang's probes in
progress (``Probing``: the only way a probe asks the engine, within the budget), and the
helpers that describe an answer — where it lands (``tier_of``, ``where``), which GPUs it needs
freed (``busy_gpus``) and who holds them (``holders``, ``names_text``). Imported by ``probes``,
``search`` and the package's ``what_if``; it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypedDict

from phalanx_engine.decide import Cluster, decide
from phalanx_engine.framework import Profile
from phalanx_engine.nodestate import NodeState
from phalanx_engine.snapshot import Decision
from phalanx_proto.events import Assignment, MemberSpec, PodRef, RequestKind
from phalanx_proto.whatif import Holder
from phalanx_rules import queueorder
from phalanx_rules.queues import QueueTree


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

    def released(self, names: Iterable[str], pods: frozenset[PodRef]) -> Cluster:
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


def tier_of(cluster: Cluster, assignments: tuple[Assignment, ...]) -> tuple[str, str]:
    """(tier, domain): the tightest network tier one domain of which holds every node of
    ``assignments`` (``Topology.tier_of``: ``domain_of``'s rule, so nodes that report no domain
    at a tier never share one there); ``("cluster", "")`` when no network-pod holds them all."""
    return cluster.topology.tier_of(a.node for a in assignments)


class Where(TypedDict, total=False):
    """An answer's ``tier`` and ``domain`` (``Answer``'s fields: ``Answer(..., **where(p, fits))``)."""

    tier: str
    domain: str


def where(p: Probing, fits: Decision | None) -> Where:
    """An answer's ``tier`` and ``domain`` fields for the decision ``fits`` (none without one)."""
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


def holders(p: Probing, pods: frozenset[PodRef], assignments: tuple[Assignment, ...]) -> tuple[Holder, ...]:
    """The gangs owning ``pods``, each with the GPUs it holds on the decision's nodes, most first."""
    nodes = {a.node for a in assignments}
    gpus: dict[str, int] = {}
    info: dict[str, Running] = {}
    for n in nodes:
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
    """The first ``most`` holders' gang ids, and how many more."""
    shown_ = ", ".join(h.gang_id for h in holders[:most])
    return shown_ + (f" and {len(holders) - most} more" if len(holders) > most else "")
