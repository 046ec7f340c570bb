"""The preemption planner: which running gangs a waiting gang should evict, whole, so that the
engine can place it, and where it then goes (docs/preemption.md). Pure and deterministic: a
cluster view, the preemptor, the running gangs and the queue tree in; a ``Plan`` or a
``NoPlan`` naming the rule out. Placement calls it for a gang the engine could not place.

* **The rules** (``preempt_rules``): ``preemptionPolicy: Never`` never preempts; within a
  queue, strictly lower priority (``withinQueue: LowerPriority``); across queues, reclaim by
  a queue below its quota from queues above theirs, never below them (``reclaim: Any``).
* **The order** (``preempt_order.plan_order``): the lowest highest-victim priority, then the
  fewest queue units evicted (GPUs × 700), then the fewest gangs, then the best placement for
  the preemptor (the engine's topology ranking), then the fewest GPU-seconds lost, then gang ids.
* **The test** of a victim set is a real decision by the same engine and profile on the
  cluster without the victims' reservations; the search (``preempt_search``) only chooses
  which sets to ask about, in cost order, within ``SearchBounds``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from phalanx_engine.decide import DEFAULT_PROFILE, Cluster
from phalanx_engine.framework import Profile
from phalanx_engine.preempt_order import Trials, placement_rank, plan_order
from phalanx_engine.preempt_search import Search, SearchBounds, SearchStats
from phalanx_engine.snapshot import Decision
from phalanx_engine.status import NoFit
from phalanx_proto.events import PodRef, pod_key
from phalanx_proto.queues import DEFAULT_QUEUE, GPU_UNITS, shown
from phalanx_proto.state import NodeLedger, victim_of
from phalanx_rules.preemption import (
    PRIORITY,
    RECLAIM,
    Preemptor,
    Rule,
    Rules,
    RunningGang,
    confined,
    when_text,
)
from phalanx_rules.queues import QueueTree

DEFAULT_BOUNDS = SearchBounds()


@dataclass(frozen=True, slots=True)
class Victim:
    """A gang to evict, whole (every pod of it), or one extra member of an elastic gang
    (``gang_id`` is then ``state.victim_unit``: the gang keeps running its minimum); the rule
    that allows it, what it holds."""

    gang_id: str
    queue: str
    priority: int
    rule: Rule
    units: int
    pods: tuple[PodRef, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """Evict ``victims`` (by gang id), then ``placement`` is where the engine puts the
    preemptor. No victims: it fits as the cluster is."""

    victims: tuple[Victim, ...]
    placement: Decision
    units: int = 0
    """Queue units evicted (700 per whole GPU)."""
    gpu_seconds: float = 0.0
    """Work the victims lose, for those whose start time is known (with ``now``)."""
    search: SearchStats = field(default=SearchStats(), compare=False)

    @property
    def gpus(self) -> float:
        return self.units / GPU_UNITS


@dataclass(frozen=True, slots=True)
class NoPlan:
    """No preemption helps: ``code`` (stable) and ``reason`` (for the pods' events) name the rule."""

    code: str
    reason: str
    search: SearchStats = field(default=SearchStats(), compare=False)
    retry_at: float | None = None
    """Code ``min-runtime``: when the plan its reason names becomes possible (its youngest
    victim has run its queue's minimum runtime by then)."""


def plan_preemption(cluster: Cluster, preemptor: Preemptor, running: Iterable[RunningGang], tree: QueueTree, *,
                    held_by: Mapping[str, int] | None = None, profile: Profile = DEFAULT_PROFILE,
                    avoid: Collection[str] = frozenset(), now: float | None = None,
                    bounds: SearchBounds = DEFAULT_BOUNDS, within: Collection[str] | None = None) -> Plan | NoPlan:
    """The best plan for ``preemptor`` by the plan order, or why there is none.

    ``cluster``: the engine's view placement decides on (never modified); ``running``: every
    gang holding reservations in it (a reservation of no listed gang is never evicted);
    ``held_by``: units each queue holds, its subtree included (``queues.held_by_queue`` of the
    ledgers; None: summed from ``running``); ``avoid``: nodes kept for a gang ahead, as in
    ``decide``; ``now``: unix seconds, for GPU-seconds (None: not counted); ``within``: the
    nodes a repair attempt is confined to (its repair's domain; None: the whole cluster): it is
    placed only there, and only gangs holding GPUs there are candidates (``rules.confined``).
    Raises nothing for data: a gang it cannot use is simply no candidate."""
    running = tuple(running)
    held = dict(held_by) if held_by is not None else _held(running, {g.gang_id: g.units for g in running})
    if within is not None:
        avoid = frozenset(avoid) | (cluster.nodes.keys() - frozenset(within))
        running = confined(running, within)
    gangs = {g.gang_id: g for g in sorted(running, key=lambda g: g.gang_id)}
    units = {g: gang.units for g, gang in gangs.items()}
    rules = Rules(preemptor, tree, held, now)
    trials = Trials(cluster, preemptor.members, profile, avoid, gangs)
    fits = trials.decide(frozenset())
    limit = rules.breaks((), {})
    if fits is not None and not limit:
        return Plan(victims=(), placement=fits, search=SearchStats(trials=trials.calls))
    refused = rules.refusal()
    if refused is not None:
        return NoPlan(*refused, search=SearchStats(trials=trials.calls))
    every = {g: r for g, gang in gangs.items() if (r := rules.rule_for(gang, units[g])) is not None}
    young = {g: (r, t) for g, r in every.items() if (t := rules.protected_until(gangs[g], r)) is not None}
    rule = {g: r for g, r in every.items() if g not in young}
    nobody = rules.nobody(None if within is None else len(cluster.nodes.keys() & frozenset(within)))
    if not every:
        return NoPlan("no-candidates", f"{limit}; {nobody}" if limit else nobody,
                      search=SearchStats(trials=trials.calls))
    got = _search(rules, trials, cluster, gangs, units, rule, bounds, now) if rule else None
    if isinstance(got, Plan) or not young:
        return got if got is not None else NoPlan("no-candidates", nobody, SearchStats(trials=trials.calls))
    # Too young to be victims yet: would they be, the plan the planner would make then says
    # from when the preemptor may preempt (the minimum runtime of its youngest victim).
    later = _search(rules, trials, cluster, gangs, units, every, bounds, now)
    if not isinstance(later, Plan):
        return later
    waiting = {v.gang_id: young[v.gang_id] for v in later.victims if v.gang_id in young}
    if not waiting:  # the full search found a set the first one was bounded out of: no age needed
        return got if got is not None else NoPlan("no-candidates", nobody, later.search)
    retry_at = max(t for _, t in waiting.values())
    names = ", ".join(v.gang_id for v in later.victims)
    return NoPlan("min-runtime", f"not preempting yet: evicting {names} would let it start, but "
                                 f"{rules.too_young(waiting, gangs)} started too recently to be a victim; "
                                 f"it may preempt from {when_text(retry_at)} and is tried again then",
                  later.search, retry_at=retry_at)


def _search(rules: Rules, trials: Trials, cluster: Cluster, gangs: Mapping[str, RunningGang],
            units: Mapping[str, int], rule: Mapping[str, Rule], bounds: SearchBounds,
            now: float | None) -> Plan | NoPlan:
    """The best plan among the candidates ``rule`` names (each with its rule), or why none."""
    search = Search(rules, trials, cluster, gangs, units, rule, bounds, now)
    found = search.run()
    stats = SearchStats(candidates=len(rule), domains=search.expanded, sets=len(search.offered),
                        trials=trials.calls, exact=search.exact)
    if found is None:
        return _why_not(rules, trials, gangs, rule, stats)
    victims, placement = found
    # An elastic gang's extra taken beside its whole gang is taken with it.
    victims = frozenset(v for v in victims if (g := victim_of(v)[0]) == v or g not in victims)
    chosen = tuple(_victim(gangs[g], rule[g]) for g in sorted(victims))
    return Plan(victims=chosen, placement=placement, units=sum(v.units for v in chosen),
                gpu_seconds=search.gpu_seconds(victims), search=stats)


def _victim(gang: RunningGang, rule: Rule) -> Victim:
    return Victim(gang_id=gang.gang_id, queue=gang.queue, priority=gang.priority, rule=rule, units=gang.units,
                  pods=tuple(sorted(gang.pods, key=pod_key)))


def _held(gangs: Iterable[RunningGang], units: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for g in gangs:
        for q in g.queues:
            out[q] += units[g.gang_id]
    return dict(out)


def _why_not(rules: Rules, trials: Trials, gangs: Mapping[str, RunningGang], rule: Mapping[str, Rule],
             stats: SearchStats) -> NoPlan:
    everyone = frozenset(rule)
    units = sum(gangs[g].units for g in everyone)
    by_rule = {r: sum(1 for x in rule.values() if x == r) for r in (PRIORITY, RECLAIM)}
    who = (f"{len(everyone)} gang(s) it may preempt ({by_rule[PRIORITY]} by priority, {by_rule[RECLAIM]} by reclaim; "
           f"{shown(units)} GPUs)")
    got = trials.explain(everyone)
    if isinstance(got, NoFit):
        return NoPlan("does-not-fit", f"evicting all {who} would still not let it fit: {got.summary}", stats)
    if not stats.exact:
        return NoPlan("search-bound", f"no set of the {who} found within the search bound "
                                      f"({stats.trials} engine decisions, {stats.domains} domains) lets it fit", stats)
    broken = rules.breaks((gangs[g] for g in sorted(everyone)), {g: gangs[g].units for g in everyone})
    return NoPlan("quota", f"no set of the {who} both lets it fit and keeps every queue's quota and limit"
                           + (f" (evicting all of them: {broken})" if broken else ""), stats)


def running_gangs(ledgers: Iterable[NodeLedger], priority: Mapping[str, int] | None = None,
                  started_at: Mapping[str, float] | None = None) -> tuple[RunningGang, ...]:
    """The gangs holding reservations in ``ledgers`` (the cluster's), by gang id: each with its
    members' assignments (in pod order), the queues its reservations are charged to (the first
    reservation's ``Allocation.queues``; none recorded: the default queue), and the priority and
    start time the caller knows of it (from the gang records: ``GangState.priority``)."""
    allocs = defaultdict(list)
    for ledger in ledgers:
        for a in ledger.allocations.values():
            allocs[a.gang_id].append(a)
    out = []
    for gang_id in sorted(allocs):
        held = sorted(allocs[gang_id], key=lambda a: (pod_key(a.assignment.pod), a.assignment.node))
        queues = next((a.queues for a in held if a.queues), (DEFAULT_QUEUE,))
        out.append(RunningGang(gang_id=gang_id, assignments=tuple(a.assignment for a in held),
                               priority=(priority or {}).get(gang_id, 0), queues=queues,
                               started_at=(started_at or {}).get(gang_id)))
    return tuple(out)


__all__ = ["NoPlan", "Plan", "Preemptor", "RunningGang", "SearchBounds", "SearchStats", "Victim", "placement_rank",
           "plan_order", "plan_preemption", "running_gangs"]
