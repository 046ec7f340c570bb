"""Queues as a tree, pure: which queues a gang charges, whether they have room, and each
queue's fair share of the cluster (docs/queues.md). Called by placement (the limit check and
the order of a cycle), gang-coordinator (the queue a pod is in, the order gangs start in,
Queue status), ``phalanx queues``, ``phalanx validate`` and the simulator.

The fair share ("deserved, then weighted over-quota", as KAI-Scheduler and Volcano divide a
cluster): at each level of the tree, the capacity the parent has is first given to each child
up to its quota, as far as the child wants it (its allocated GPUs plus what its gangs wait
for); what is left goes to the children that still want more, in proportion to their
``overQuotaWeight``, each capped by its limit and its demand (water-filling: a child that is
capped gives its unused part back to the others); then each child divides its share among its
own children the same way. A queue's quota is guaranteed in this sense: whatever others want,
its fair share never drops below min(quota, demand) when the parent's share allows it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx_proto.events import Phase
from phalanx_proto.queues import (
    DEFAULT_QUEUE,
    GPU_UNITS,
    MAX_DEPTH,
    QueueHistory,
    QueueSpec,
    QueueUsage,
    charge_key,
    shown,
    units_of_assignment,
    units_of_member,
)
from phalanx_proto.state import GangState, NodeLedger
from phalanx_proto.vocab import IDLE, OPEN
from phalanx_rules import usage


@dataclass(frozen=True)
class QueueTree:
    """The queues, by name, with the implicit ``default`` queue when none is declared."""

    specs: Mapping[str, QueueSpec]
    children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, specs: Iterable[QueueSpec]) -> QueueTree:
        by_name = {s.name: s for s in specs}
        by_name.setdefault(DEFAULT_QUEUE, QueueSpec(name=DEFAULT_QUEUE))
        kids: dict[str, list[str]] = {}
        for s in by_name.values():
            kids.setdefault(s.parent, []).append(s.name)
        return cls(by_name, {k: tuple(sorted(v)) for k, v in kids.items()})

    def get(self, name: str) -> QueueSpec | None:
        return self.specs.get(name)

    def roots(self) -> tuple[str, ...]:
        return tuple(n for n in self.children.get("", ()) if n in self.specs)

    def chain(self, name: str) -> tuple[str, ...]:
        """The queue and its ancestors, nearest first (stops at a cycle or an unknown parent:
        such a queue has a ``problem`` and takes no gang)."""
        out: list[str] = []
        at = name
        while at and at in self.specs and at not in out and len(out) < MAX_DEPTH:
            out.append(at)
            at = self.specs[at].parent
        return tuple(out)

    def problem(self, name: str) -> str:
        """Why gangs of ``name`` cannot be placed: unknown queue, or a queue on its chain has a
        problem ("" when none)."""
        if name not in self.specs:
            return f"queue {name} does not exist"
        for q in self.chain(name):
            if self.specs[q].problem:
                return f"queue {q} is invalid: {self.specs[q].problem}"
        return ""


def tree_problems(specs: Iterable[QueueSpec]) -> dict[str, str]:
    """Each queue's problem as a tree (the rules a Queue object alone cannot state, so neither
    can the API server's schema): its parent exists, no cycle, not deeper than ``MAX_DEPTH``,
    quota within limit, and the children's quotas summing to at most the queue's quota."""
    by_name = {s.name: s for s in specs}
    out: dict[str, str] = {}
    for s in by_name.values():
        if s.limit is not None and s.quota > s.limit:
            out[s.name] = f"spec.resources[nvidia.com/gpu]: quota {shown(s.quota)} is above limit {shown(s.limit)}"
            continue
        if s.parent and s.parent not in by_name:
            out[s.name] = f"spec.parent: queue {s.parent!r} does not exist"
            continue
        seen, at = [s.name], s.parent
        while at:
            if at in seen:
                out[s.name] = f"spec.parent: the parents form a cycle ({' -> '.join([*seen, at])})"
                break
            seen.append(at)
            if len(seen) > MAX_DEPTH:
                out[s.name] = f"spec.parent: the tree is deeper than {MAX_DEPTH} levels"
                break
            at = by_name[at].parent if at in by_name else ""
    kids: dict[str, list[QueueSpec]] = {}
    for s in by_name.values():
        if s.parent:
            kids.setdefault(s.parent, []).append(s)
    for parent, children in kids.items():
        total = sum(c.quota for c in children)
        if parent in by_name and total > by_name[parent].quota and parent not in out:
            names = ", ".join(sorted(c.name for c in children))
            out[parent] = (f"spec.resources[nvidia.com/gpu].quota {shown(by_name[parent].quota)} is below its "
                           f"children's quotas, {shown(total)} ({names}): a child's quota fits in its parent's")
    return out


def fair_shares(tree: QueueTree, demand: Mapping[str, int], capacity: int,
                recent: Mapping[str, float] | None = None) -> dict[str, int]:
    """Each queue's fair share of ``capacity`` (units), given ``demand``: what each queue's own
    gangs hold and wait for (a parent's demand is its own plus its subtree's). ``recent``: each
    queue's recent GPUs (``usage.recent_gpus``, its subtree included) — the part beyond the
    quotas is then divided by the usage-weighted weights (``usage.weights``); None or empty:
    by ``overQuotaWeight`` alone. Deterministic: ties and remainders go in name order."""
    total_demand: dict[str, int] = {}

    def subtree(name: str) -> int:
        if name not in total_demand:
            total_demand[name] = demand.get(name, 0) + sum(subtree(c) for c in tree.children.get(name, ())
                                                          if c in tree.specs and c != name)
        return total_demand[name]

    shares: dict[str, int] = {}

    def divide(parent: str, amount: int) -> None:
        kids = [c for c in tree.children.get(parent, ()) if c in tree.specs and not tree.specs[c].problem]
        if not kids:
            return
        own = demand.get(parent, 0) if parent else 0
        level = amount
        amount = max(0, amount - min(own, amount))  # the parent's own gangs first, then its children
        want = {c: min(subtree(c), _cap(tree.specs[c])) for c in kids}
        got = {c: min(tree.specs[c].quota, want[c]) for c in kids}
        scale = min(1.0, amount / sum(got.values())) if sum(got.values()) else 1.0
        got = {c: int(g * scale) for c, g in got.items()}
        left = amount - sum(got.values())
        used = sum(recent.get(c, 0.0) for c in kids) if recent else 0.0
        norm = max(level / GPU_UNITS, used)  # no usage at this level: the plain weights
        while left > 0:
            hungry = [c for c in kids if got[c] < want[c]]
            weights = {c: tree.specs[c].over_quota_weight for c in hungry}
            if used > 0:
                weights = usage.weights(weights, recent or {}, norm)
            if not hungry or sum(weights.values()) <= 0:
                break
            total_w = sum(weights.values())
            gave = 0
            for c in sorted(hungry):
                extra = min(want[c] - got[c], int(left * weights[c] / total_w))
                got[c] += extra
                gave += extra
            if gave == 0:  # integer crumbs: one unit at a time, in name order
                for c in sorted(hungry):
                    if left - gave > 0 and got[c] < want[c] and weights[c] > 0:
                        got[c] += 1
                        gave += 1
                if gave == 0:
                    break
            left -= gave
        for c in kids:
            shares[c] = got[c]
            divide(c, got[c])

    divide("", capacity)
    return shares


def _cap(spec: QueueSpec) -> int:
    return spec.limit if spec.limit is not None else 2**62


def over_limit(tree: QueueTree, queue: str, held_by: Mapping[str, int], units: int,
               releasing: Mapping[str, int] | None = None) -> str:
    """Why ``units`` more would push ``queue`` or an ancestor past its limit ("" when not):
    ``0/16 GPUs available to queue team-a: at its limit 16 (allocated 16, this gang needs 4)``.
    ``held_by``: units each queue holds; ``releasing``: units per queue the same commit gives
    back (the gang's own earlier attempt)."""
    for q in tree.chain(queue):
        spec = tree.specs[q]
        if spec.limit is None:
            continue
        held = held_by.get(q, 0) - (releasing or {}).get(q, 0)
        if held + units > spec.limit:
            free = max(0, spec.limit - held)
            where = "" if q == queue else f" (a parent of queue {queue})"
            return (f"{shown(free)}/{shown(spec.limit)} GPUs available to queue {q}{where}: at its limit "
                    f"{shown(spec.limit)} (allocated {shown(held)}, this gang needs {shown(units)})")
    return ""


def rank(queue: str, held_by: Mapping[str, int], shares: Mapping[str, int]) -> float:
    """How far a queue is from its fair share, lower first: its allocation over its share
    (a queue below its share sorts before one above; a queue with no share last)."""
    held = held_by.get(queue, 0)
    share = shares.get(queue, 0)
    if share <= 0:
        return float("inf") if held else 1e9
    return held / share


def held_by_queue(ledgers: Iterable[NodeLedger]) -> dict[str, int]:
    """Units each queue holds: the reservations naming it (``Allocation.queues``)."""
    out: dict[str, int] = defaultdict(int)
    for ledger in ledgers:
        for a in ledger.allocations.values():
            units = units_of_assignment(a.assignment)
            for q in a.queues:
                out[q] += units
    return dict(out)


def expected_usage(ledgers: Iterable[NodeLedger]) -> dict[str, dict[str, int]]:
    """What each queue's usage must hold given the ledgers: per queue, the units of every
    reservation naming it, by gang attempt (the reconciler audits with the same rule)."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for ledger in ledgers:
        for a in ledger.allocations.values():
            for q in a.queues:
                out[q][charge_key(a.gang_id, a.attempt)] += units_of_assignment(a.assignment)
    return {q: {k: v for k, v in sorted(c.items()) if v} for q, c in out.items()}


def usage_drift(tree: QueueTree, ledgers: Iterable[NodeLedger],
                usage: Mapping[str, QueueUsage]) -> dict[str, QueueUsage]:
    """The queues with a limit whose usage record is not what the ledgers say (only they keep
    one: ``phalanx_proto.queues.QueueUsage``), with the usage they should have; and the
    records of queues without a limit (to drop: an empty usage)."""
    expected = expected_usage(ledgers)
    limited = {q for q, spec in tree.specs.items() if spec.limit is not None}
    out = {}
    for q in set(usage) - limited:
        if usage[q].charges:
            out[q] = QueueUsage(queue=q)
    for q in limited & (set(expected) | set(usage)):
        want = expected.get(q, {})
        have = usage[q].charges if q in usage else {}
        if want != have:
            out[q] = QueueUsage(queue=q, charges=want)
    return out


PENDING: frozenset[Phase] = IDLE | OPEN
"""Phases of a gang that has not (all) started: what its queue waits for."""


def queue_report(tree: QueueTree, held_by: Mapping[str, int], gangs: Iterable[GangState],
                 capacity: int, history: Iterable[QueueHistory] = (), now: float = 0.0) -> dict[str, dict[str, Any]]:
    """Each queue's status in GPUs: allocated (its subtree's included), borrowed (beyond its
    quota), pending gangs and GPUs (what its waiting gangs, and its subtree's, ask for), fair
    share of ``capacity`` units (weighted by the queues' recent usage, ``history`` at ``now``,
    when there is any), and that recent usage in decayed GPU-hours; with quota, limit, parent
    and problem. What gang-coordinator writes to each Queue's status and ``phalanx queues``
    prints."""
    history = tuple(history)
    pending_gangs: dict[str, int] = defaultdict(int)
    pending_units: dict[str, int] = defaultdict(int)
    own_pending: dict[str, int] = defaultdict(int)
    for s in gangs:
        if s.phase not in PENDING or not s.members:
            continue
        q = next((m.queue for m in s.members if m.queue), DEFAULT_QUEUE)
        started = set(s.bound) | {r.pod for r in s.running}
        units = sum(units_of_member(m) for m in s.members if m.pod not in started)
        own_pending[q] += units
        for a in tree.chain(q):
            pending_gangs[a] += 1
            pending_units[a] += units
    held = {q: held_by.get(q, 0) for q in tree.specs}
    own = {q: held[q] - sum(held.get(c, 0) for c in tree.children.get(q, ())) for q in tree.specs}
    shares = fair_shares(tree, {q: own[q] + own_pending.get(q, 0) for q in tree.specs}, capacity,
                         usage.recent_gpus(history, now))
    hours = usage.gpu_hours(history, now)
    out: dict[str, dict[str, Any]] = {}
    for q, spec in tree.specs.items():
        out[q] = {"parent": spec.parent, "quota": _gpus(spec.quota),
                  "limit": None if spec.limit is None else _gpus(spec.limit), "allocated": _gpus(held[q]),
                  "borrowed": _gpus(max(0, held[q] - spec.quota)), "pendingGangs": pending_gangs.get(q, 0),
                  "pendingGPUs": _gpus(pending_units.get(q, 0)), "fairShare": _gpus(shares.get(q, 0)),
                  "recentGPUHours": round(hours.get(q, 0.0), 3), "problem": spec.problem}
    return out


def _gpus(units: int) -> float:
    return round(units / GPU_UNITS, 3)
