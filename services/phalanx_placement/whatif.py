"""Counterfactual probes in placement: for a gang that does not fit, what would start it now
(``phalanx_engine.whatif.what_if``, docs/whatif.md), sent in its ``PlacementFailed.whatif``.

Called by ``service.Placement`` in the scheduling cycle, synchronously, on the same cluster
view as the decision (the cache, the gang's own reservations excluded). Reads only the cache:
the holders of reservations come from the ledger mirror (``Allocation.gang_id``) and the gang
records mirror (queue, priority, when the attempt started); no bucket is read per cycle.

Bounded so that scheduling is not slowed by more than a few percent (docs/whatif.md has the
measurement):

* **A share of placement's time** (``ProbeBudget``): a bucket of seconds filled at ``share``
  seconds per second of wall time, up to ``burst_s``; a gang's probes run only when the bucket
  holds ``gang_s``, get that much, and what they spend is taken out. Otherwise they are skipped
  (the reply carries no answers); so over any window probes take about ``share`` of it, plus
  one burst, plus what a run overshoots its time (the engine's deadline is checked between
  decisions: docs/whatif.md has the measured share).
* **The preempt probe** (``Relaxed``) runs only when placement's own preemption refused (its
  reason in hand): the same planner with the refusing rules lifted — the gang's priority above
  every running gang's, its ``preemptionPolicy`` the default, its queue preempting within itself
  and reclaiming — under tighter search bounds; its victims, with the real refusal as the
  reason it is not done, go to ``phalanx explain`` (an answer that does not start the gang is
  never the pending reason's line).
* **Answers are kept** (``Probes.answer``) per gang while its request, its refusal and the
  cluster view (``ClusterCache.generation``, the queues' revisions) stand still: a gang that
  fails again on an unchanged cluster costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import msgspec

from phalanx_engine.decide import Cluster
from phalanx_engine.framework import Profile
from phalanx_engine.preempt import Plan, Preemptor, RunningGang, SearchBounds, plan_preemption
from phalanx_engine.whatif import PreemptPlan, ProbeContext, QueueView, Running, what_if
from phalanx_placement.cache import ClusterCache
from phalanx_placement.queues import PlacementQueues
from phalanx_proto.events import MemberSpec, PodRef, WhatIf
from phalanx_proto.kubeapi import PREEMPT_LOWER_PRIORITY
from phalanx_proto.queues import QueueSpec
from phalanx_proto.state import GangState
from phalanx_rules.preemption import confined
from phalanx_rules.queueorder import queue_of
from phalanx_rules.queues import QueueTree
from phalanx_telemetry import warn

KEPT = 4096
"""Gangs whose last answers are kept (the oldest forgotten first)."""


@dataclass
class ProbeBudget:
    """Seconds the probes may spend: filled at ``share`` per second of ``clock``, at most
    ``burst_s``; ``grant`` says how much one gang's probes may take, ``spend`` takes it out."""

    share: float = 0.03
    burst_s: float = 0.05
    gang_s: float = 0.02
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens, self.at = self.burst_s, self.clock()

    def grant(self) -> float:
        """Seconds the next gang's probes may spend: ``gang_s`` once the bucket holds that much,
        else 0 (none now: a run on a sliver of time is cut before its first answer)."""
        now = self.clock()
        self.tokens = min(max(self.burst_s, self.gang_s), self.tokens + (now - self.at) * self.share)
        self.at = now
        return self.gang_s if self.share > 0 and self.tokens >= self.gang_s else 0.0

    def spend(self, seconds: float) -> None:
        self.tokens -= seconds


PROBE_BOUNDS = SearchBounds(exact_victims=6, trials=16, domains=32, greedy_sets=2, ties=0)
"""The preempt probe's search: an answer for ``phalanx explain``, not a plan to act on."""


@dataclass(frozen=True)
class Relaxed:
    """The preempt probe's planner (``phalanx_engine.whatif.Preemptor``): which gangs the
    planner would evict for ``preemptor`` were the rules that refused it lifted, answered with
    ``why_not`` (placement's refusal) as the reason it is not done. The quotas and limits still
    hold: a victim set that breaks one is no answer."""

    preemptor: Preemptor
    running: tuple[RunningGang, ...]
    tree: QueueTree
    held_by: Mapping[str, int]
    why_not: str
    avoid: frozenset[str] = frozenset()
    profile: Profile | None = None
    now: float | None = None
    retry_at: float = 0.0
    within: frozenset[str] | None = None
    """The nodes a repair attempt is confined to (``plan_preemption``'s ``within``); None: all."""
    """When the planner refused only because its victims are too young (``NoPlan`` code
    ``min-runtime``): the time they may go; ``why_not`` says so. 0: not so."""

    def __call__(self, cluster: Cluster, members: tuple[MemberSpec, ...], *,
                 holders: Mapping[PodRef, Running]) -> PreemptPlan | None:
        running = self.running if self.within is None else confined(self.running, self.within)
        if not running:
            return None
        top = max(g.priority for g in running)
        lifted = msgspec.structs.replace(self.tree.get(self.preemptor.queue) or QueueSpec(name=self.preemptor.queue),
                                         within_queue="LowerPriority", reclaim="Any")
        # and no gang is too young to be a victim (the refusal may be that)
        tree = QueueTree.of(msgspec.structs.replace(s, preempt_min_runtime_s=0.0, reclaim_min_runtime_s=0.0)
                            for s in [*(s for n, s in self.tree.specs.items() if n != lifted.name), lifted])
        who = replace(self.preemptor, members=members, priority=max(self.preemptor.priority, top + 1),
                      preemption_policy=PREEMPT_LOWER_PRIORITY)
        extra = {} if self.profile is None else {"profile": self.profile}
        plan = plan_preemption(cluster, who, self.running, tree, held_by=self.held_by, avoid=self.avoid,
                               now=self.now, bounds=PROBE_BOUNDS, within=self.within, **extra)
        if not isinstance(plan, Plan) or not plan.victims:
            return None
        return PreemptPlan(victims=tuple(v.gang_id for v in plan.victims), allowed=False, why_not=self.why_not)


class Holders(Mapping[PodRef, Running]):
    """Pod → the running gang its reservation belongs to, from the cache (built on first use,
    once per ``ClusterCache.generation``; each gang's record read once)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._gang_of: dict[PodRef, str] | None = None
        self._running: dict[str, Running] = {}

    def _index(self) -> dict[PodRef, str]:
        if self._gang_of is None:
            out: dict[PodRef, str] = {}
            for key in self.cache.views:
                ledger = self.cache.ledger_of(key)
                for a in ledger.allocations.values() if ledger is not None else ():
                    out[a.assignment.pod] = a.gang_id
            self._gang_of = out
        return self._gang_of

    def running(self, gang_id: str) -> Running:
        got = self._running.get(gang_id)
        if got is None:
            record = self.cache.gang(gang_id)
            if isinstance(record, GangState):
                got = Running(gang_id=gang_id, queue=queue_of(record.members), priority=record.priority,
                              since=record.attempt_started_at or record.created_at)
            else:
                got = Running(gang_id=gang_id)
            self._running[gang_id] = got
        return got

    def __getitem__(self, pod: PodRef) -> Running:
        return self.running(self._index()[pod])

    def __iter__(self) -> Iterator[PodRef]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())


class Probes:
    """The probes of one placement replica: its budget, the answers it keeps, its counters.

    A probe's time is placement's own CPU time (``clock``: the thread's, where the probes run),
    not the wall clock: on a loaded machine a probe descheduled for a while is not cut short for
    time it did not use, and the budget bounds what the probes take of placement's work."""

    def __init__(self, cache: ClusterCache, queues: PlacementQueues, budget: ProbeBudget,
                 clock: Callable[[], float] = time.thread_time, now: Callable[[], float] = time.time) -> None:
        self.cache, self.queues, self.budget, self.clock, self.now = cache, queues, budget, clock, now
        self._kept: dict[str, tuple[tuple, WhatIf]] = {}
        self._holders: tuple[int, Holders] | None = None
        self.spent_s = 0.0
        """Seconds spent probing so far (the scale benchmark reports its share)."""
        self.runs = self.reused = self.skipped = 0

    def holders(self) -> Holders:
        if self._holders is None or self._holders[0] != self.cache.generation:
            self._holders = (self.cache.generation, Holders(self.cache))
        return self._holders[1]

    def answer(self, gang_id: str, members: tuple[MemberSpec, ...], cluster: Cluster, profile: Profile, *,
               refusal: str, avoid: frozenset[str] = frozenset(), keep: frozenset[str] = frozenset(),
               owed: tuple[str, ...] = (), preempt: Relaxed | None = None) -> WhatIf | None:
        """What would start the gang on ``cluster`` (the view its decision refused, ``refusal``
        being the reason given), within the wire's bounds; the answers kept from last time when
        nothing they depend on changed; None when the budget is spent. ``keep``: allocation keys
        of the gang's members left running (their units are not given back). Never raises: a
        probe that breaks is logged and the reply goes without answers. ``preempt``: the preempt
        probe's planner, when placement's own preemption refused."""
        # The members by count and first and last pod (uids included: a recreated gang is another),
        # not by a digest of all: a gang of thousands skipped for want of budget costs nothing.
        key = (len(members), members[0].pod if members else None, members[-1].pod if members else None, refusal,
               avoid, owed, preempt.why_not if preempt is not None else None, self.cache.generation, self.cache.queues.revision, self.cache.usage.revision)
        kept = self._kept.get(gang_id)
        if kept is not None and kept[0] == key:
            self.reused += 1
            return kept[1]
        grant = self.budget.grant()
        if grant <= 0:
            self.skipped += 1
            return None
        started = self.clock()
        try:
            ctx = ProbeContext(holders=self.holders(), now=self.now(), avoid=avoid, preempt=preempt,
                               queue=self._queue_view(gang_id, members, keep, owed))
            got = what_if(cluster, members, profile, ctx, budget_s=grant, clock=self.clock).bounded()
        except Exception as e:  # noqa: BLE001 - an answer is a courtesy; the reply goes without it
            warn("what-if probes failed", gang=gang_id, error=repr(e)[:300])
            got = None
        finally:
            spent = self.clock() - started
            self.budget.spend(spent)
            self.spent_s += spent
            self.runs += 1
        if got is not None:
            self._kept.pop(gang_id, None)
            self._kept[gang_id] = (key, got)
            while len(self._kept) > KEPT:
                del self._kept[next(iter(self._kept))]
        return got

    def _queue_view(self, gang_id: str, members: tuple[MemberSpec, ...], keep: frozenset[str],
                    owed: tuple[str, ...]) -> QueueView:
        q = self.queues
        chain = q.chain(members)
        held = {name: q.units_held(name) for name in chain}
        held.update(q.limited_held(chain))
        return QueueView(tree=q.tree(), held=held, releasing=q._replaced(gang_id, keep), owed=owed)
