"""What deciding one request comes to, before anything is sent: a reply that needs no ledger
write (``Reply``), or a decision assumed into the cache that must commit first (``Decided``)."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx_engine.preempt import Plan
from phalanx_engine.snapshot import Decision
from phalanx_placement.assumed import Commit
from phalanx_proto.events import EvictPods, PlacementFailed, PlaceRequested, Preempting


@dataclass(frozen=True, slots=True)
class Reply:
    """A decision's outcome that needs no ledger write; ``evict``: a nomination's eviction sent
    again first (``preemptions.Preemptions.plan``)."""

    event: object
    evict: EvictPods | None = None


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision assumed into the cache, to be committed; for a preemption, the nominations
    (``commit``), then ``evict`` to binder and ``reply`` (``Preempting``, naming the victims)."""

    commit: Commit
    decision: Decision
    evict: EvictPods | None = None
    reply: Preempting | None = None
    plan: Plan | None = None


def preempting_answer(ev: PlaceRequested, reason: str, nodes: list[str]) -> Preempting:
    """The attempt waits, open, for the victims of its nomination on ``nodes`` (docs/preemption.md)."""
    return Preempting(gang_id=ev.gang_id, attempt=ev.attempt, members_digest=ev.members_digest, reason=reason[:4000],
                      nodes=tuple(nodes))


def pending(ev: PlaceRequested, members, reason: str, nodes: list[str], *, fits_empty: bool = True) -> Reply:
    """The gang waits with ``reason``; ``nodes``: where it would go (kept for it by the fairness
    gate should it starve)."""
    return Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=reason, reasons={reason: 1},
                                 fits_empty_cluster=fits_empty, members=tuple(m.pod for m in members),
                                 reserve_nodes=tuple(nodes), waits_for="gpus"))
