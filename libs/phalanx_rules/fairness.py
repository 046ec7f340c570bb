"""gang-coordinator's order rules, pure: which waiting gang starts an attempt now, how long a
failed one backs off, and which gangs are woken when GPUs are released (docs/saga.md, "Order
and fairness"; docs/queues.md, "Who goes first").

gang-coordinator (its saga, resync and driver) and ``phalanx sim`` both run these, so the
simulator decides as the service does. Every function takes ``GangState`` records, the
service's own.

Queue order is ``queue_key``: higher priority first, then earlier arrival. The **head** is the
first gang in that order that has tried at least once, waits (``waiting``/``backoff``) and
could fit the cluster were it empty. Once the head has waited longer than ``starve_after_s``
it is *starving* and protected, in one of two modes:

* ``backfill`` (default; reserve-and-backfill, as HPC batch schedulers do): a gang behind the
  head still starts, but its attempt may not use the nodes the head's last failed placement
  would have used on the empty cluster (``reserve_nodes``); a head whose reserve is unknown
  holds the gangs behind it back, as in strict mode.
* ``strict`` (FIFO): a gang behind the head is held back until the head is scheduled.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from phalanx_proto.events import PlacementFailed
from phalanx_proto.queues import DEFAULT_QUEUE
from phalanx_proto.state import GangState
from phalanx_proto.vocab import IDLE

MODES = ("backfill", "strict")
"""How a starving head is protected; the first is the default."""
STARVE_AFTER_S = 60.0
"""The default wait after which a queue's head is protected."""
BACKOFF_BASE_S, BACKOFF_MAX_S = 1.0, 60.0
"""The default first and largest retry delay (``backoff_delay``)."""
WAKE = 8
"""Gangs retried at once when GPUs are released."""
UNSCHEDULABLE_RETRY_S = 300.0
"""The default wait before a gang that fits no node set of the cluster as it is (``waits_for``
``cluster``) is tried again although nothing it needs changed: the safety net of a missed
change, as kube-scheduler's ``podMaxInUnschedulablePodsDuration`` (5 minutes)."""


def queue_key(s: GangState) -> tuple[int, float, str]:
    """The documented order: higher ``spec.priority`` first, then earlier arrival."""
    return (-s.priority, s.created_at, s.gang_id)


def queue_of(s: GangState) -> str:
    """The queue a gang's members name (``default`` when none)."""
    for m in s.members:
        if m.queue:
            return m.queue
    return DEFAULT_QUEUE


def backoff_delay(failures: int, *, base_s: float, max_s: float, gang_id: str = "") -> float:
    """Exponential backoff with jitter: base·2^(failures-1), capped, times 0.75..1.25. The
    jitter is seeded by gang and failure count, so replicas, restarts and simulations agree.
    The exponent stops at 64 (2**1024 is no float: without the stop a gang that failed 1,025
    times, about 17 hours of waiting at the default 60 s cap, would raise OverflowError)."""
    raw: float = min(max_s, base_s * 2 ** min(64, max(0, failures - 1)))  # int ** int is Any to mypy
    return raw * (0.75 + 0.5 * random.Random(f"{gang_id}:{failures}").random())


@dataclass(frozen=True, slots=True)
class Gate:
    """What the gate says about one gang: ``hold`` (non-empty: do not start; the pods are told
    this), else start, on any node but ``avoid`` (kept for the starving head ``head``)."""

    hold: str = ""
    avoid: tuple[str, ...] = ()
    head: str = ""


def _may_head(s: GangState) -> bool:
    return s.phase in IDLE and s.attempt >= 1 and s.fits_empty_cluster


def head_of(others: Iterable[GangState]) -> GangState | None:
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


def gate(s: GangState, others: Iterable[GangState], *, now: float, starve_after_s: float,
         mode: str = "backfill") -> Gate:
    """May ``s`` start now, and where, given the other gangs of its queue?"""
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


def waits_for(s: GangState | PlacementFailed) -> str:
    """What a gang that did not fit waits for (``phalanx_proto.events.WaitsFor``): as its last
    placement said, or for a record or reply without the field, ``gpus`` when it could fit the
    empty cluster and ``cluster`` when not."""
    return s.waits_for or ("gpus" if s.fits_empty_cluster else "cluster")


def retry_delay(s: GangState, failures: int, *, base_s: float, max_s: float,
                unschedulable_s: float = UNSCHEDULABLE_RETRY_S) -> float:
    """How long a gang that did not fit waits before it is tried again on a timer: the
    exponential ``backoff_delay``, but for a gang waiting for the cluster to change
    (``waits_for`` ``cluster``) ``unschedulable_s`` — such a gang is retried when a node
    changes (``woken_by_cluster_change``), the timer only covers a change that was missed."""
    if waits_for(s) == "cluster":
        return unschedulable_s * (0.75 + 0.5 * random.Random(f"{s.gang_id}:{failures}").random())
    return backoff_delay(failures, base_s=base_s, max_s=max_s, gang_id=s.gang_id)


def _backing_off(s: GangState, now: float) -> bool:
    return s.phase == "backoff" and s.failure == "placement_failed" and s.backoff_until > now


def release_helps(s: GangState, freed: Collection[str] | None,
                  chain: Callable[[str], Iterable[str]] = lambda q: (q,)) -> bool:
    """Can GPUs released (charged to the queues ``freed``; None when unknown) help the gang? Yes
    when it waits for GPUs, or for its queue and the release gave units back to a queue of its
    line (``chain``: a queue and its ancestors); never when it fits no node set of the cluster."""
    match waits_for(s):
        case "gpus":
            return True
        case "queue":
            return freed is None or any(q in freed for q in chain(queue_of(s)))
    return False


def wake_order(states: Iterable[GangState], *, now: float, below_quota: Callable[[str], bool],
               limit: int = WAKE, freed: Collection[str] | None = None,
               chain: Callable[[str], Iterable[str]] = lambda q: (q,), placing: bool = False,
               rank: Callable[[str], float] = lambda q: 0.0) -> list[GangState]:
    """GPUs were released: the gangs that try again now instead of at the end of their
    backoff — at most ``limit`` of those backing off after a failed placement that the release
    can help (``release_helps``), queues below their quota first, then the queue furthest below
    its fair share (``rank``: ``queueorder.shares_and_ranks``' rank, as placement orders its
    cycle), then by priority and arrival.
    Gangs waiting for the cluster to change are not woken by a release: as kube-scheduler moves
    unschedulable pods back to its active queue only on a cluster event its queueing hints say
    may help them. With ``placing``, gangs whose attempt is under way compete for the same
    places (gang-coordinator retries such a one at once should its attempt fail: placement may
    have decided it before these GPUs came free)."""
    waiting = [s for s in states if (_backing_off(s, now) and release_helps(s, freed, chain))
               or (placing and s.phase == "placing")]
    waiting.sort(key=lambda s: (not below_quota(queue_of(s)), rank(queue_of(s)), queue_key(s)))
    return waiting[:limit]


def woken_by_cluster_change(states: Iterable[GangState], *, now: float) -> list[GangState]:
    """A node was added, removed or changed (its topology, labels, taints, readiness,
    allocatable or other pods): every gang backing off because it fit no node set of the
    cluster is tried again, in queue order."""
    return sorted((s for s in states if _backing_off(s, now) and waits_for(s) == "cluster"), key=queue_key)


def woken_by_queue_change(states: Iterable[GangState], *, now: float) -> list[GangState]:
    """The queues changed (a Queue created, edited or deleted): every gang backing off at its
    queue is tried again, in queue order."""
    return sorted((s for s in states if _backing_off(s, now) and waits_for(s) == "queue"), key=queue_key)
