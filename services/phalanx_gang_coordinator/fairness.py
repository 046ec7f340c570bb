"""The fairness gate: which waiting gang may start an attempt now. Pure; table-tested in
tests/unit/test_fairness.py. The rule is documented in docs/saga.md ("Order and fairness").

Queue order is ``saga.queue_key``: higher priority first, then earlier arrival. The **head** is
the first gang in that order that has tried at least once, waits (``waiting``/``backoff``) and
could fit the cluster were it empty. Once the head has waited longer than ``starve_after_s``,
it is *starving* and protected, in one of two modes:

* ``backfill`` (default; reserve-and-backfill, as HPC batch schedulers do): the head's
  **reserve** is the set of nodes its last failed placement would have used on the empty
  cluster (``PlacementFailed.reserve_nodes``). A gang behind the head still starts, but its
  attempt may not use a reserved node (``PlacementRequested.avoid_nodes``): it can only take
  capacity the head's placement does not need, so it cannot delay the head, which gets its
  nodes as soon as the work already on them ends. A head whose reserve is unknown holds the
  gangs behind it back, as in strict mode.
* ``strict`` (FIFO): a gang behind the head is held back until the head is scheduled.

A gang ahead of the head (higher priority) and the head itself are never held back or
restricted, and gangs already placed are never disturbed (no preemption).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from phalanx_gang_coordinator.saga import queue_key, queue_of
from phalanx_proto.state import GangState
from phalanx_proto.vocab import IDLE

MODES = ("backfill", "strict")


@dataclass(frozen=True, slots=True)
class Gate:
    """What the gate says about one gang: ``hold`` (non-empty: do not start; the pods are told
    this), else start, on any node but ``avoid`` (kept for the starving head ``head``)."""

    hold: str = ""
    avoid: tuple[str, ...] = ()
    head: str = ""


def _may_head(s: GangState) -> bool:
    return s.phase in IDLE and s.attempt >= 1 and s.fits_empty_cluster


def head_of(others: list[GangState]) -> GangState | None:
    """The head of the queue among ``others``, or None."""
    waiting = [o for o in others if _may_head(o)]
    return min(waiting, key=queue_key) if waiting else None


def contenders(states: Iterable[GangState]) -> dict[str, tuple[GangState, ...]]:
    """Queue → its first two gangs that may be its head, in queue order: the head of a queue
    without any one gang is among them, so ``gate(s, contenders[queue])`` decides as
    ``gate(s, every other gang of the queue)`` does, without a pass over the queue per gang."""
    by_queue: dict[str, list[GangState]] = defaultdict(list)
    for s in states:
        if _may_head(s):
            by_queue[queue_of(s)].append(s)
    return {q: tuple(heapq.nsmallest(2, gangs, key=queue_key)) for q, gangs in by_queue.items()}


def gate(s: GangState, others: list[GangState], *, now: float, starve_after_s: float,
         mode: str = "backfill") -> Gate:
    """May ``s`` start now, and where, given the other gangs of the queue?"""
    if starve_after_s <= 0:
        return Gate()
    head = head_of(others)
    if head is None or head.gang_id == s.gang_id or queue_key(s) < queue_key(head):
        return Gate()
    if now - head.created_at <= starve_after_s:
        return Gate()
    if mode == "backfill" and head.reserve_nodes:
        return Gate(avoid=head.reserve_nodes, head=head.gang_id)
    return Gate(hold=f"held back behind {head.gang_id}, first in queue and waiting too long (fairness)",
                head=head.gang_id)
