"""Fair share that remembers, pure (docs/queues.md, "Fair share that remembers"): each queue's
recent usage, decayed with a half-life, and how it weighs a queue's part of the GPUs beyond the
quotas. The services (placement writes the records and orders its cycles, gang-coordinator
wakes gangs and writes Queue status), ``phalanx queues`` and ``phalanx sim`` call these.

**Recent usage.** Every GPU-second a queue holds counts, and counts half as much one half-life
``h`` later: its decayed usage at time t is ``u(t) = Σ gpus(s) · 2^(-(t-s)/h)`` over the past. A
record (``QueueHistory``) keeps ``u`` as of ``at`` and the units held from ``at`` on; while
that holding ``H`` (GPUs) does not change, ``u(at + Δ) = u(at)·2^(-Δ/h) + H·τ·(1 − 2^(-Δ/h))``
exactly, with ``τ = h / ln 2`` (the mean life): so a record needs rewriting only when what the
queue holds changes. ``u / τ`` is the queue's **recent GPUs**: the exponentially weighted mean
of the GPUs it held (a queue that held H GPUs for ever has H).

**The weight it gives.** Where ``queues.fair_shares`` divides what a level has beyond its
children's quotas among the children that want more (weight ``w``), each child's weight becomes

    p = max(0, 2·W − U),   W = w / Σ w (the hungry siblings),   U = recent / max(L, Σ recent)

where ``L`` is the GPUs the level divides (the cluster at the top, the parent's share below it)
and the sum of recent GPUs is over all the siblings: ``U`` is the part of the level the queue
used lately. A queue that used exactly its weighted part keeps its weight's share (``p = W``);
one that used nothing gets up to twice it, one that used twice its part or more gets nothing
while others want the GPUs; when every hungry sibling's ``p`` is 0 the plain weights divide.
With no usage anywhere the division is the plain one. It weighs only the part beyond the
quotas: a queue's quota stays guaranteed. (KAI-Scheduler's time-based fair share divides the
over-quota part by ``W − U``; keeping ``W`` in makes one queue's small lead not take everything.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from phalanx_proto.queues import GPU_UNITS, QueueHistory

LN2 = math.log(2.0)


def mean_life(half_life_s: float) -> float:
    """τ = h / ln 2: the decayed weight of one second held for ever (∫ 2^(-s/h) ds)."""
    return half_life_s / LN2


def usage_at(r: QueueHistory, now: float) -> float:
    """The queue's decayed GPU-seconds at ``now``: the record's, decayed since ``at``, plus the
    units it has held since then (none before ``at``: a time before it counts as ``at``)."""
    factor: float = 2.0 ** (-max(0.0, now - r.at) / r.half_life_s)
    return r.gpu_seconds * factor + r.held / GPU_UNITS * mean_life(r.half_life_s) * (1.0 - factor)


def advance(r: QueueHistory | None, queue: str, now: float, held: int, half_life_s: float) -> QueueHistory:
    """The record as of ``now``, holding ``held`` units from then on. A new queue starts from
    nothing; a record of another half-life keeps its recent GPUs (its usage scaled by the ratio
    of the half-lives). A ``now`` before the record's ``at`` (another replica's clock ahead) is
    taken as ``at``: time never runs back, nothing is counted twice."""
    if r is None:
        return QueueHistory(queue=queue, at=now, held=held, half_life_s=half_life_s)
    used = usage_at(r, now)
    if r.half_life_s != half_life_s:
        used *= half_life_s / r.half_life_s
    return QueueHistory(queue=queue, gpu_seconds=used, at=max(now, r.at), held=held, half_life_s=half_life_s)


def stale(r: QueueHistory | None, held: int, half_life_s: float) -> bool:
    """Does the record need rewriting: none yet, the queue holds other units now, or another
    half-life is configured?"""
    return r is None or r.held != held or r.half_life_s != half_life_s


def recent_gpus(records: Iterable[QueueHistory], now: float) -> dict[str, float]:
    """Each queue's recent GPUs at ``now`` (decayed usage over the mean life)."""
    return {r.queue: usage_at(r, now) / mean_life(r.half_life_s) for r in records}


def gpu_hours(records: Iterable[QueueHistory], now: float) -> dict[str, float]:
    """Each queue's decayed usage at ``now`` in GPU-hours (for people)."""
    return {r.queue: usage_at(r, now) / 3600.0 for r in records}


def weights(hungry: Mapping[str, float], recent: Mapping[str, float], norm: float) -> dict[str, float]:
    """The usage-weighted weight of each hungry sibling (``hungry``: its ``overQuotaWeight``):
    ``max(0, 2·W − U)`` with ``U = recent / norm``; the plain weights when all are 0.
    ``norm``: max(the GPUs the level divides, the siblings' recent GPUs)."""
    total = sum(hungry.values())
    if total <= 0 or norm <= 0:
        return dict(hungry)
    out = {c: max(0.0, 2.0 * w / total - recent.get(c, 0.0) / norm) for c, w in hungry.items()}
    return out if sum(out.values()) > 0 else dict(hungry)
