"""The rules of preemption (docs/preemption.md, "The contract"): which running gangs a waiting
gang may evict and under which rule, and whether a whole set of victims keeps every queue's
quota and limit. Pure; the planner (``phalanx_engine.preempt``) asks them of every gang and
every victim set it considers.

* A gang whose pods say ``preemptionPolicy: Never`` never preempts.
* **priority**: a gang of the preemptor's own queue with a strictly lower priority, when the
  queue's ``spec.preemption.withinQueue`` is ``LowerPriority``.
* **reclaim**: a gang of another queue, whatever its priority, when the preemptor's queue has
  ``spec.preemption.reclaim: Any`` and holds less than its quota now.
* Nominations in force count as what they will be (``with_nominations``): the GPUs another
  preemptor's nomination keeps for it count toward its queue's line, and the gangs it names
  as victims count as gone from theirs. Preemptors deciding together (in one cycle, or on two
  replicas: the nomination's batch rewrites the queues' usage records, so the later one
  decides again on the first's nomination) therefore never reclaim past a quota between them.
* **Minimum runtime** (``min_runtime``): a gang that started less than its queue's
  ``preemptMinRuntime`` ago is no victim of the priority rule, less than its
  ``reclaimMinRuntime`` ago none of reclaim (a queue without the setting takes its parent's;
  none on the line: 0). It becomes one at ``started_at + minimum`` (``Rules.protected_until``);
  the planner then says when the preemptor may preempt, and it is retried then.
* A set of victims must leave, once the preemptor is placed and the victims are gone:
  every queue on the preemptor's chain within its limit; with reclaim victims, every queue on
  the preemptor's chain that the units enter from outside its subtree within its quota
  ("receiving"); and every queue the units leave ("giving": on a victim's chain, not on the
  preemptor's) at or above its quota. Queues that hold both ends of a move (the common
  ancestors) see no change from it and are not checked for it.

Amounts are queue units (``phalanx_proto.queues``: 700 per whole GPU). What a queue holds
includes its subtree's gangs, as ``queues.held_by_queue`` sums it from ``Allocation.queues``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from phalanx_proto.events import Assignment, MemberSpec, PodRef
from phalanx_proto.kubeapi import NEVER, PREEMPT_LOWER_PRIORITY
from phalanx_proto.queues import DEFAULT_QUEUE, QueueSpec, shown, units_of_assignment, units_of_member
from phalanx_proto.state import NodeLedger, names_victim
from phalanx_rules.queues import QueueTree

Rule = Literal["priority", "reclaim"]
PRIORITY: Rule = "priority"
RECLAIM: Rule = "reclaim"


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The gang that waits: the members placement could not place, its priority (the pods'
    ``spec.priority``; the members agree), its queue, and its pods' ``preemptionPolicy``
    (``PreemptLowerPriority``, Kubernetes' default, or ``Never``)."""

    gang_id: str
    members: tuple[MemberSpec, ...]
    priority: int = 0
    queue: str = DEFAULT_QUEUE
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"

    @property
    def units(self) -> int:
        return sum(units_of_member(m) for m in self.members)


@dataclass(frozen=True, slots=True)
class RunningGang:
    """A gang holding reservations: every member's assignment (from the ledger), its priority,
    the queues its reservations are charged to (``Allocation.queues``: its own queue first,
    then the ancestors), and when it started (unix seconds; None when unknown). Also one extra
    member of an elastic gang, a victim of its own (``gang_id``: ``state.victim_unit``), which
    its gang may give up while its minimum keeps running."""

    gang_id: str
    assignments: tuple[Assignment, ...]
    priority: int = 0
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    started_at: float | None = None

    @property
    def queue(self) -> str:
        return self.queues[0] if self.queues else DEFAULT_QUEUE

    @property
    def units(self) -> int:
        return sum(units_of_assignment(a) for a in self.assignments)

    @property
    def pods(self) -> tuple[PodRef, ...]:
        return tuple(a.pod for a in self.assignments)


def min_runtime(tree: QueueTree, queue: str, rule: Rule) -> float:
    """How long a gang of ``queue`` must have run before it may be a victim under ``rule``: the
    queue's ``preempt_min_runtime_s`` (rule priority) or ``reclaim_min_runtime_s`` (reclaim),
    else the nearest ancestor's that sets it, else 0."""
    for q in tree.chain(queue) or (queue,):
        spec = tree.get(q)
        if spec is None:
            continue
        value = spec.preempt_min_runtime_s if rule == PRIORITY else spec.reclaim_min_runtime_s
        if value is not None:
            return value
    return 0.0


MIN_RUNTIME_FIELD = {"priority": "preemptMinRuntime", "reclaim": "reclaimMinRuntime"}


class Rules:
    """The contract for one preemptor on one view of the queues (``held_by``: units each queue
    holds, its subtree included) at ``now`` (unix seconds; None: no gang is too young)."""

    def __init__(self, preemptor: Preemptor, tree: QueueTree, held_by: Mapping[str, int],
                 now: float | None = None) -> None:
        self.preemptor = preemptor
        self.tree = tree
        self.held = held_by
        self.now = now
        self.chain = tree.chain(preemptor.queue) or (preemptor.queue,)
        self.spec = tree.get(preemptor.queue) or QueueSpec(name=preemptor.queue)
        self.need = preemptor.units

    def _quota(self, queue: str) -> int:
        spec = self.tree.get(queue)
        return spec.quota if spec is not None else 0

    def refusal(self) -> tuple[str, str] | None:
        """(code, reason) when the preemptor may not preempt at all, else None."""
        if self.preemptor.preemption_policy == NEVER:
            return "preemption-policy-never", "its pods' preemptionPolicy is Never: it waits and never preempts"
        problem = self.tree.problem(self.preemptor.queue)
        if problem:
            return "queue-problem", problem
        return None

    @property
    def reclaims(self) -> bool:
        """The preemptor's queue may take from other queues: reclaim Any and below its quota now."""
        return self.spec.reclaim != NEVER and self.held.get(self.preemptor.queue, 0) < self.spec.quota

    def rule_for(self, gang: RunningGang, units: int) -> Rule | None:
        """The rule under which ``gang`` (holding ``units``) may be a victim, or None. For reclaim
        this checks the gang alone against its queues' quotas, a condition every set holding it
        must also meet (more victims only take more)."""
        if gang.gang_id == self.preemptor.gang_id or units <= 0:
            return None
        if gang.queue == self.preemptor.queue:
            lower = gang.priority < self.preemptor.priority
            return PRIORITY if lower and self.spec.within_queue != NEVER else None
        if not self.reclaims:
            return None
        if any(q not in self.chain and self.held.get(q, 0) - units < self._quota(q) for q in gang.queues):
            return None
        return RECLAIM

    def protected_until(self, gang: RunningGang, rule: Rule) -> float | None:
        """When ``gang`` becomes a victim under ``rule`` if it is too young to be one now (its
        start plus its queue's minimum runtime for the rule), else None (old enough, no
        minimum, or its start unknown: an unknown start protects nothing)."""
        if self.now is None or gang.started_at is None:
            return None
        minimum = min_runtime(self.tree, gang.queue, rule)
        until = gang.started_at + minimum
        return until if minimum > 0 and self.now < until else None

    def too_young(self, young: Mapping[str, tuple[Rule, float]], gangs: Mapping[str, RunningGang]) -> str:
        """The gangs of a plan that are too young yet, each with its queue's minimum:
        ``a/x (queue b, reclaimMinRuntime 10m)``."""
        return ", ".join(f"{g} (queue {gangs[g].queue}, {MIN_RUNTIME_FIELD[r]} "
                         f"{duration_text(min_runtime(self.tree, gangs[g].queue, r))})"
                         for g, (r, _) in sorted(young.items()))

    def breaks(self, victims: Iterable[RunningGang], units: Mapping[str, int]) -> str:
        """Which quota or limit the set breaks, as a sentence ("" when it keeps them all).
        ``units``: each victim's units by gang id."""
        victims = list(victims)
        lost: dict[str, int] = defaultdict(int)
        for v in victims:
            for q in v.queues:
                lost[q] += units[v.gang_id]

        def after(q: str) -> int:
            return self.held.get(q, 0) - lost[q] + (self.need if q in self.chain else 0)

        for q in self.chain:
            spec = self.tree.get(q)
            if spec is not None and spec.limit is not None and after(q) > spec.limit:
                return (f"queue {q} would pass its limit {shown(spec.limit)} (it would hold {shown(after(q))} "
                        "GPUs with this gang)")
        reclaimed = [v for v in victims if v.queue != self.preemptor.queue]
        for q in self.chain:
            receives = any(q not in v.queues for v in reclaimed)
            if receives and after(q) > self._quota(q):
                return (f"queue {q} would pass its quota {shown(self._quota(q))} (it would hold {shown(after(q))} "
                        "GPUs with this gang): reclaim takes back only up to the quota")
        for q in sorted({q for v in victims for q in v.queues if q not in self.chain}):
            if after(q) < self._quota(q):
                return (f"queue {q} would go below its quota {shown(self._quota(q))} (it would hold "
                        f"{shown(after(q))} GPUs): reclaim takes only what a queue holds beyond its quota")
        return ""

    def tight(self) -> bool:
        """Whether the preemptor's own chain may need victims for its accounting alone (a limit it
        would pass, or a quota it would pass while reclaiming): then gangs that free no GPU where
        it lands may still be needed, to make room in its queues."""
        for q in self.chain:
            spec = self.tree.get(q)
            held = self.held.get(q, 0) + self.need
            if spec is not None and spec.limit is not None and held > spec.limit:
                return True
            if self.reclaims and held > self._quota(q):
                return True
        return False

    def nobody(self, confined_to: int | None = None) -> str:
        """Why no running gang may be preempted, both rules named; ``confined_to``: the number of
        nodes the preemptor is confined to (a repair attempt, ``confined``), None: not confined."""
        p, q = self.preemptor, self.preemptor.queue
        there = "" if confined_to is None else " there"
        if self.spec.within_queue == NEVER:
            within = f"queue {q} does not preempt within itself (spec.preemption.withinQueue: Never)"
        else:
            within = f"no gang of queue {q} with a priority below {p.priority} holds GPUs{there}"
        held = self.held.get(q, 0)
        if self.spec.reclaim == NEVER:
            reclaim = f"queue {q} does not reclaim (spec.preemption.reclaim: Never)"
        elif held >= self.spec.quota:
            reclaim = (f"queue {q} is at or above its quota ({shown(held)} of {shown(self.spec.quota)} GPUs): "
                       "it does not reclaim")
        else:
            reclaim = "no other queue holds a gang it could give up without going below its quota"
        where = "" if confined_to is None else f" on the {confined_to} node(s) it is confined to"
        return f"no running gang{where} may be preempted: {within}; {reclaim}"


def confined(running: Iterable[RunningGang], within: Collection[str]) -> tuple[RunningGang, ...]:
    """The running gangs a preemptor confined to the nodes ``within`` (a repair attempt: the
    nodes of its repair's domain, docs/repair.md) may choose victims from: those holding a
    reservation on one of those nodes. A gang elsewhere frees no GPU it may use, so it is never
    evicted for it, not even to make room in its queues' limits; a gang holding GPUs both inside
    and outside goes whole, as every victim does."""
    inside = frozenset(within)
    return tuple(g for g in running if any(a.node in inside for a in g.assignments))


def with_nominations(held_by: Mapping[str, int], ledgers: Iterable[NodeLedger], tree: QueueTree, now: float,
                     but: str = "") -> dict[str, int]:
    """Units each queue holds (``held_by``: its reservations, subtree included) once every
    nomination in force at ``now`` counts as what it will be: its assignment's units added to
    the nominating gang's queue and its ancestors, and the reservations of the gangs it names as
    victims (while they still hold them) taken off theirs. The nominations of ``but`` (the
    preemptor deciding again: its new plan replaces them) are left out."""
    out = dict(held_by)
    victims: set[str] = set()
    for ledger in ledgers:
        for n in ledger.nominations.values():
            if n.gang_id == but or not n.active(now):
                continue
            units = units_of_assignment(n.assignment)
            for q in tree.chain(n.queue) or (n.queue,):
                out[q] = out.get(q, 0) + units
            victims.update(n.victims)
    victims.discard(but)
    if victims:
        for ledger in ledgers:
            for a in ledger.allocations.values():
                if names_victim(victims, a.gang_id, a.assignment.pod.name):
                    units = units_of_assignment(a.assignment)
                    for q in a.queues:
                        out[q] = out.get(q, 0) - units
    return out


def preemptor_of(gang_id: str, members: tuple[MemberSpec, ...], queue: str) -> Preemptor | str:
    """The gang as the planner's ``Preemptor``, or why it may not preempt: a gang preempts with
    one priority, its members' ``spec.priority`` (they must agree); a member whose
    ``preemptionPolicy`` is ``Never`` makes the whole gang ``Never`` (the planner then answers
    that it waits). ``members``: those the attempt places."""
    priorities = sorted({m.priority for m in members})
    if len(priorities) > 1:
        return (f"its members disagree on spec.priority ({', '.join(map(str, priorities))}): a gang preempts "
                "only when all its pods have one priority (one PriorityClass)")
    policy: Literal["PreemptLowerPriority", "Never"] = NEVER if any(m.preemption_policy == NEVER for m in members) else PREEMPT_LOWER_PRIORITY
    return Preemptor(gang_id=gang_id, members=members, priority=priorities[0] if priorities else 0, queue=queue,
                     preemption_policy=policy)


def may_preempt(preemptor: Preemptor, tree: QueueTree, held_by: Mapping[str, int],
                running_priorities: Mapping[str, Iterable[int]]) -> bool:
    """Could any plan with victims exist? A necessary condition of ``Rules.rule_for``, cheap (a
    caller with many gangs to place asks it before the planner, to save the planner's work):
    the preemptor may preempt at all, and some queue's running gangs (``running_priorities``:
    the priorities of each queue's running gangs) hold a gang some rule could take — one of its
    own queue with a lower priority (its queue preempting within itself), or, its queue
    reclaiming (below its quota), one of another queue on its own line (an ancestor's gang: its
    units stay within the ancestors) or of a queue holding more than its quota (a victim's own
    queue must keep its quota without it)."""
    rules = Rules(preemptor, tree, held_by)
    if rules.refusal() is not None:
        return False
    own = running_priorities.get(preemptor.queue) or ()
    if rules.spec.within_queue != NEVER and any(p < preemptor.priority for p in own):
        return True
    if not rules.reclaims:
        return False
    return any(q != preemptor.queue and running_priorities.get(q) and (q in rules.chain or held_by.get(q, 0) > qs.quota)
               for q, qs in tree.specs.items())


def duration_text(seconds: float) -> str:
    """A duration as a Queue object writes it: ``90s``, ``10m``, ``1h30m``, ``1.5s``."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    out, left = "", int(seconds)
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0s"


def when_text(t: float) -> str:
    """A unix time for a reason: ``2026-12-06T10:35:12Z`` (UTC, to the second; a fraction
    rounds up, so the time said is never before the time meant)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(t)))
