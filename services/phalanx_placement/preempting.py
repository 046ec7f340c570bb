"""Placement's part of preemption (docs/preemption.md, "Wiring"): what the ledger records for
a preemptor, and the reasons its pods show (who may preempt whom is the rulebook's:
``phalanx_rules.preemption``). Pure: ``service.Placement`` calls these
with its cache's ledgers and records, writes what they return in one compare-and-set, and
publishes the eviction.

* ``candidates``: the running gangs the planner may choose from — every gang holding
  reservations but the preemptor, gangs being rolled back or whose pods are all gone, gangs
  another preemptor's nomination already names, and gangs whose eviction was refused for this
  preemptor lately.
* ``nominate``: the ledgers with the plan's placement recorded as the preemptor's
  nominations (its older ones dropped, expired ones of anybody dropped on the way);
  ``without_nominations``: a ledger once the preemptor reserves or its eviction is refused.
* ``promotion``: the ledgers with a preemptor's nominations turned into its reservations, once
  no reservation left on those GPUs stands in the way (the victims' last ones released).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

import msgspec

from phalanx_engine.preempt import NoPlan, Plan, Preemptor, RunningGang, running_gangs
from phalanx_proto.events import RecordedPreemption, RecordedRunning
from phalanx_proto.kvrules import gpu_conflicts
from phalanx_proto.queues import shown
from phalanx_proto.state import (
    Allocation,
    GangState,
    NodeLedger,
    Nomination,
    alloc_key,
    attempt_members,
    elastic_extras,
    victim_of,
    victim_unit,
)
from phalanx_rules.queues import QueueTree


def nominations(ledgers: Iterable[NodeLedger], gang_id: str, now: float) -> list[Nomination]:
    """The gang's nominations in force at ``now``."""
    return [n for led in ledgers for n in led.nominations.values() if n.gang_id == gang_id and n.active(now)]


def candidates(ledgers: list[NodeLedger], records: Callable[[str], GangState | None], preemptor: str, now: float,
               refused: Iterable[str] = ()) -> tuple[RunningGang, ...]:
    """The running gangs the planner may evict for ``preemptor``: those holding reservations in
    ``ledgers`` with their records' priorities and start times, but not the preemptor itself, a
    gang being rolled back (it is going anyway), a gang another preemptor's nomination names
    (its GPUs are promised: no two preemptors evict for the same GPUs), nor ``refused``; nor a
    gang whose pods are all gone (its record has no members: its reservations are released as
    the agents see the pods go, and its record's priority, 0, is no longer its pods')."""
    taken = {victim_of(v)[0] for led in ledgers for n in led.nominations.values()
             if n.gang_id != preemptor and n.active(now) for v in n.victims}
    skip = taken | {victim_of(v)[0] for v in refused} | {preemptor}
    priority, started, elastic = {}, {}, {}
    for led in ledgers:
        for a in led.allocations.values():
            record = records(a.gang_id)
            if record is not None and (record.phase == "rolling_back" or not record.members):
                skip.add(a.gang_id)
            elif record is not None:
                priority[a.gang_id] = record.priority
                if record.attempt_started_at:
                    started[a.gang_id] = record.attempt_started_at
                if record.max_member:
                    elastic[a.gang_id] = record
    out = []
    for g in running_gangs(ledgers, priority, started):
        if g.gang_id in skip:
            continue
        out.append(g)
        if g.gang_id in elastic:
            out.extend(extras(g, elastic[g.gang_id]))
    return tuple(out)


def extras(gang: RunningGang, record: GangState) -> tuple[RunningGang, ...]:
    """An elastic gang's extra members as victims of their own (``state.victim_unit``), each
    with the gang's priority, queues and start: a preemptor may take one of them and leave the
    gang running its minimum. The gang itself stays a candidate, taking all its pods."""
    held = {a.pod: a for a in gang.assignments}
    return tuple(dataclasses.replace(gang, gang_id=victim_unit(gang.gang_id, pod.name), assignments=(held[pod],))
                 for pod in elastic_extras(record, held.keys()))


def without_nominations(ledger: NodeLedger, gang_id: str, now: float) -> NodeLedger:
    """``ledger`` without ``gang_id``'s nominations and without any that expired by ``now``."""
    keep = {k: n for k, n in ledger.nominations.items() if n.gang_id != gang_id and n.active(now)}
    return ledger if keep == ledger.nominations else msgspec.structs.replace(ledger, nominations=keep)


def nominate(ledger_of: Callable[[str], NodeLedger | None], token: Callable[[str], str], gang_keys: Iterable[str],
             gang_id: str, attempt: int, plan: Plan, preemptor: Preemptor, *, expires_at: float,
             now: float) -> dict[str, NodeLedger]:
    """The new ledgers of every node the nomination touches: the plan's placement recorded as
    ``gang_id``'s nominations, naming the victims and their rules; its nominations elsewhere
    (an earlier plan) dropped. Reservations are left as they are: a nomination is no
    reservation, and no queue is charged for it."""
    victims = {v.gang_id: v.rule for v in plan.victims}
    by_key: dict[str, dict[str, Nomination]] = {}
    names: dict[str, str] = {}
    for a in plan.placement.assignments:
        key = token(a.node)
        names[key] = a.node
        by_key.setdefault(key, {})[alloc_key(a.pod)] = Nomination(
            gang_id=gang_id, attempt=attempt, assignment=a, victims=victims, queue=preemptor.queue,
            priority=preemptor.priority, expires_at=expires_at)
    out = {}
    for key in set(by_key) | set(gang_keys):
        ledger = ledger_of(key)
        if ledger is None:
            if key not in by_key:
                continue
            ledger = NodeLedger(node=names[key])
        kept = without_nominations(ledger, gang_id, now)
        new = msgspec.structs.replace(kept, nominations={**kept.nominations, **by_key.get(key, {})})
        if new != ledger:
            out[key] = new
    return out


def promotion(ledger_of: Callable[[str], NodeLedger | None], keys: Iterable[str], record: GangState, now: float, *,
              queues: tuple[str, ...] = (), usable: Callable[[str], bool] = lambda key: True) -> dict[str, NodeLedger] | None:
    """The ledgers (of ``keys``, the nodes the gang is nominated on, as ``ledger_of`` has them —
    the writes about to be made included) with the preemptor's nominations for its record's
    attempt turned into reservations of that attempt (charged to ``queues``) and dropped, or
    None while that cannot be: a member of the attempt has no nomination in force, a nominated
    node is not ``usable``, or a reservation still stands on a nominated GPU (a victim's, whose
    pod its node still reports running: placement frees it only when the node no longer does).
    The engine chose those GPUs for the gang on the cluster without its victims (the plan), and
    every other decision since saw them taken (``cache.nominated``)."""
    found: dict[str, tuple[str, Nomination]] = {}
    ledgers: dict[str, NodeLedger] = {}
    for key in keys:
        ledger = ledger_of(key)
        if ledger is None:
            continue
        ledgers[key] = ledger
        for k, n in ledger.nominations.items():
            if n.gang_id == record.gang_id and n.attempt == record.attempt and n.active(now):
                found[k] = (key, n)
    members = attempt_members(record)
    if not members or any(alloc_key(m.pod) not in found for m in members):
        return None
    out = {}
    for key in {key for key, _ in found.values()}:
        if not usable(key):
            return None
        ledger = ledgers[key]
        mine = {k: Allocation(gang_id=record.gang_id, attempt=record.attempt, assignment=n.assignment, queues=queues)
                for k, (at, n) in found.items() if at == key}
        allocations = {k: a for k, a in ledger.allocations.items() if k not in mine}
        if gpu_conflicts([a.assignment for a in allocations.values()] + [a.assignment for a in mine.values()]):
            return None
        out[key] = without_nominations(msgspec.structs.replace(ledger, allocations={**allocations, **mine}),
                                       record.gang_id, now)
    return out


def preempting_reason(plan: Plan) -> str:
    """What the preemptor's pods say while its victims go: ``preempting a/train-7 (priority
    10, queue b) to free 8 GPUs on n3``."""
    victims = ", ".join(f"{v.gang_id} (priority {v.priority}, queue {v.queue}, rule {v.rule})" for v in plan.victims)
    nodes = sorted({a.node for a in plan.placement.assignments})
    return f"preempting {victims} to free {shown(plan.units)} GPUs on {', '.join(nodes)}"


def waiting_reason(noms: list[Nomination], holding: Iterable[str]) -> str:
    """What the preemptor's pods say while the victims its nomination names still hold GPUs."""
    nodes = sorted({n.assignment.node for n in noms})
    return (f"waiting for the preempted gang(s) {', '.join(sorted(holding))} to release their GPUs "
            f"(nominated on {', '.join(nodes)})")


def preemption_rule(plan: Plan) -> str:
    """The metric label of a preemption: ``reclaim`` when any victim is taken back across
    queues, else ``priority``."""
    return "reclaim" if any(v.rule == "reclaim" for v in plan.victims) else "priority"


MAX_RECORDED_PODS = 4096
"""Running pods a decision log record names at most (beyond, the plan is logged unreplayable)."""


def recorded(preemptor: Preemptor, running: tuple[RunningGang, ...], tree: QueueTree, held_by: Mapping[str, int],
             now: float, plan: Plan | NoPlan) -> RecordedPreemption:
    """What the planner read and answered, for the decision log (``phalanx sim --replay`` plans
    again on it)."""
    omitted = sum(len(g.assignments) for g in running) > MAX_RECORDED_PODS
    return RecordedPreemption(
        priority=preemptor.priority, policy=preemptor.preemption_policy, queue=preemptor.queue,
        specs=tuple(tree.specs.values()), held_by={q: max(0, n) for q, n in held_by.items()}, now=now,
        running=() if omitted else tuple(RecordedRunning(gang_id=g.gang_id, pods=g.pods, priority=g.priority,
                                                         queues=g.queues, started_at=g.started_at) for g in running),
        victims=tuple(v.gang_id for v in plan.victims) if isinstance(plan, Plan) else (),
        placed=plan.placement.assignments if isinstance(plan, Plan) else (),
        no_plan=plan.reason if isinstance(plan, NoPlan) else "", omitted=omitted)
