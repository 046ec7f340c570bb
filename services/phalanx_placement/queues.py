"""Queues in placement, an adapter: it reads the cache — the ``phx-queues`` mirror
(``QueueSpec``), the queues' usage records and the node ledgers (assumed commits included), the
gang records — and asks the rulebook (``phalanx_rules.queueorder``: limits, borrowing, the
queues owed free GPUs, the cycle's order), the rules ``phalanx sim`` asks too; and it builds the
usage records a commit writes beside the reservations (docs/queues.md). Called by
``service.Placement``.

* **What a queue holds** is the units of the reservations that name it (``Allocation.queues``:
  the gang's queue and its ancestors when it was placed), summed from the ledgers the cache
  believes (``ClusterCache.queue_units``).
* **Reclaims are committed with their queues.** A nomination that takes GPUs back from
  another queue rewrites the usage record of every queue it moves units between in its own
  batch (``reclaim_fence``), so two replicas' reclaims are serialized as two limits' are.
* **Limits are committed with the reservations.** A queue with a limit also keeps a usage
  record (``QueueUsage``, a charge per gang attempt): after any change to a gang's reservations
  (a decision, a release, an adoption) the gang's charges to every limited queue it touches are
  recomputed from the ledgers the same commit writes (``usage_writes``) and written in the same
  atomic batch, expecting the revision the decision read; so two replicas can never push a
  queue past its limit between them. A decision whose units would do so is refused with the
  queue's numbers (``phalanx_rules.queues.over_limit``). Queues without a limit keep no record: their
  commits do not wait on one another.
* **Order.** A cycle takes the waiting requests of the queue furthest below its fair share
  first (``rank``), then by priority, then arrival; fair shares are recomputed at most every
  ``ORDER_EVERY_S``.
* **Quota first.** A gang that would borrow (its queue above its quota after it) is not placed
  while a waiting gang of a queue below its quota (outside its own line of the tree) would fit
  the cluster as it is now: GPUs that free go to the queue that is owed them. gang-coordinator
  retries waiting gangs as soon as GPUs are released, queues below their quota first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping

import msgspec

from phalanx_placement.cache import ClusterCache
from phalanx_proto.events import MemberSpec, RecordedOrder, RecordedQueueGate
from phalanx_proto.queues import (
    GPU_UNITS,
    QueueUsage,
    charge_key,
    units_of_assignment,
    usage_key,
)
from phalanx_proto.state import Allocation, GangState, NodeLedger, attempt_members
from phalanx_rules import queueorder, usage
from phalanx_rules.queueorder import queue_of
from phalanx_rules.queues import QueueTree, expected_usage

ORDER_EVERY_S = 0.5


class PlacementQueues:
    def __init__(self, cache: ClusterCache, clock=time.monotonic) -> None:
        self.cache = cache
        self.clock = clock
        self._tree: QueueTree | None = None
        self._tree_at = -1
        self._ranks: dict[str, float] = {}
        self._ranked_at = float("-inf")
        self.shares: dict[str, int] = {}
        self._order_logged: RecordedOrder | None = None
        self._order_pending: RecordedOrder | None = None
        """The cycle order computed last, until a decision's record carries it (``recorded``)."""

    def tree(self) -> QueueTree:
        """The queue tree as ``phx-queues`` holds it (rebuilt when the mirror moved)."""
        if self._tree is None or self._tree_at != self.cache.queues.revision:
            self._tree = QueueTree.of(e.value for e in self.cache.queues)
            self._tree_at = self.cache.queues.revision
        return self._tree

    def units_held(self, queue: str) -> int:
        """Units ``queue`` holds (its subtree's included), as the ledgers say."""
        return self.cache.queue_units.get(queue, 0)

    def limited_held(self, queues: Iterable[str]) -> dict[str, int]:
        """Units each queue with a limit holds by its usage record (a queue whose record is not
        written yet: as the ledgers say)."""
        tree = self.tree()
        out = {}
        for q in queues:
            spec = tree.get(q)
            if spec is not None and spec.limit is not None:
                entry = self.cache.usage.get(usage_key(q))
                assumed = self.cache.usage_of(q)
                out[q] = assumed.allocated if entry is not None or assumed.charges else self.units_held(q)
        return out

    # -- a decision ------------------------------------------------------------------------------
    def refusal(self, gang_id: str, members: tuple[MemberSpec, ...], keep: frozenset[str], *,
                placed: int | None = None) -> str:
        """Why the gang may not be placed now for its queue ("" when it may): its queue does
        not exist or is invalid, or its units would pass a limit on the queue's chain
        (``queueorder.refusal`` on the usage records). ``keep``: allocation keys of the gang
        that stay (its running members); ``placed``: the units a decision gave it."""
        tree = self.tree()
        return queueorder.refusal(tree, members, self.limited_held(tree.chain(queue_of(members))),
                                  self._replaced(gang_id, keep), placed=placed)

    def _replaced(self, gang_id: str, keep: frozenset[str]) -> dict[str, int]:
        """Units per queue of the gang's reservations a new decision replaces (all but ``keep``)."""
        out: dict[str, int] = defaultdict(int)
        for alloc in self._allocations(gang_id, {}):
            key, a = alloc
            if key not in keep:
                for q in a.queues:
                    out[q] += units_of_assignment(a.assignment)
        return out

    def recorded(self, gang_id: str, members: tuple[MemberSpec, ...], keep: frozenset[str], *, refusal: str,
                 borrowing: bool = False, owed: tuple[str, ...] = ()) -> RecordedQueueGate:
        """What the queue rules read for this request and what they answered, for the decision
        log (``phalanx sim --replay`` asks the rules again on it)."""
        tree = self.tree()
        chain = tree.chain(queue_of(members))
        order, self._order_pending = self._order_pending, None
        return RecordedQueueGate(specs=tuple(s for q in chain if (s := tree.get(q)) is not None),
                                 limited_held=self.limited_held(chain),
                                 held={q: self.cache.queue_units.get(q, 0) for q in chain},
                                 releasing=dict(self._replaced(gang_id, keep)), refusal=refusal,
                                 borrowing=borrowing, owed=owed, order=order)

    def borrowing(self, members: tuple[MemberSpec, ...], gang_id: str, keep: frozenset[str]) -> bool:
        """Would placing the gang put its queue above its quota (``queueorder.borrowing`` on the
        ledgers' units, less what the decision replaces)?"""
        return queueorder.borrowing(self.tree(), members, self.cache.queue_units,
                                    self._replaced(gang_id, keep).get(queue_of(members), 0))

    def begin_cycle(self) -> None:
        """Note, once per cycle, the waiting gangs of queues below their quota (``owed_now``;
        ``queueorder.owed_candidates``, none when no queue has a quota)."""
        gangs = (e.value for e in self.cache.gangs)
        self._owed = queueorder.owed_candidates(self.tree(), self.cache.queue_units, (
            (queue_of(s.members), attempt_members(s)) for s in gangs if queueorder.owed_candidate(s, self._reserved)))
        self._fits: dict[int, bool] = {}

    def _reserved(self, s: GangState) -> bool:
        """The cache holds a reservation of the gang's current attempt (assumed ones included)."""
        for key in self.cache.gang_keys(s.gang_id):
            ledger = self.cache.ledger_of(key)
            if ledger is not None and any(a.gang_id == s.gang_id and a.attempt == s.attempt
                                          for a in ledger.allocations.values()):
                return True
        return False

    def owed_now(self, queue: str, fits) -> tuple[str, ...]:
        """The queues below their quota, outside ``queue``'s line, with a waiting gang that
        ``fits(members)`` the cluster now (``queueorder.owed``; each gang decided at most once a
        cycle)."""
        return queueorder.owed(self.tree(), queue, getattr(self, "_owed", []), fits, self._fits)

    # -- the usage a commit writes ---------------------------------------------------------------
    def chain(self, members: tuple[MemberSpec, ...]) -> tuple[str, ...]:
        return self.tree().chain(queue_of(members))

    def _allocations(self, gang_id: str, writes: Mapping[str, NodeLedger]) -> list[tuple[str, Allocation]]:
        """The gang's reservations as they will be once ``writes`` commit."""
        out = []
        for key in set(self.cache.gang_keys(gang_id)) | set(writes):
            ledger = writes.get(key) or self.cache.ledger_of(key)
            if ledger is not None:
                out += [(k, a) for k, a in ledger.allocations.items() if a.gang_id == gang_id]
        return out

    def usage_writes(self, gang_id: str, writes: Mapping[str, NodeLedger | QueueUsage]) -> dict[str, QueueUsage]:
        """The usage records that change when ``writes`` commit: for every queue with a limit
        the gang's reservations name before or after, its charges recomputed from those
        reservations (a record written for the first time starts from what the ledgers hold
        for the queue). A usage record already among ``writes`` (another gang's change in the
        same batch) is the one changed further."""
        base = {k: v for k, v in writes.items() if isinstance(v, QueueUsage)}
        writes = {k: v for k, v in writes.items() if isinstance(v, NodeLedger)}
        tree = self.tree()
        before = self._allocations(gang_id, {})
        after = self._allocations(gang_id, writes)
        charged: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for _, a in after:
            for q in a.queues:
                charged[q][charge_key(gang_id, a.attempt)] += units_of_assignment(a.assignment)
        touched = {q for _, a in (*before, *after) for q in a.queues
                   if (spec := tree.get(q)) is not None and spec.limit is not None}
        prefix = f"{gang_id}#"
        out = {}
        for q in touched:
            current = base.get(usage_key(q)) or self.cache.usage_of(q)
            if usage_key(q) not in base and self.cache.usage.get(usage_key(q)) is None and not current.charges:
                current = QueueUsage(queue=q, charges=self._from_ledgers(q))
            charges = {k: v for k, v in current.charges.items() if not k.startswith(prefix)}
            charges.update({k: v for k, v in charged.get(q, {}).items() if v})
            if charges != self.cache.usage_of(q).charges:
                out[usage_key(q)] = QueueUsage(queue=q, charges=dict(sorted(charges.items())))
        return out

    def reclaim_fence(self, queue: str, victims) -> dict[str, QueueUsage]:
        """The usage records a nomination's batch rewrites when it reclaims (any victim of
        another queue): every queue on the preemptor's line and every queue a victim's units
        leave, each as it is (a queue without a limit keeps no charges: an empty record), each
        expecting the revision the decision read — so two replicas' reclaims between the same
        queues never both commit on the same view: the later decides again on the first's
        nomination (``phalanx_rules.preemption.with_nominations``)."""
        reclaimed = [v for v in victims if v.queue != queue]
        if not reclaimed:
            return {}
        tree = self.tree()
        chain = tree.chain(queue) or (queue,)
        giving = {q for v in reclaimed for q in (tree.chain(v.queue) or (v.queue,)) if q not in chain}
        out = {}
        for q in (*chain, *sorted(giving)):
            spec = tree.get(q)
            if spec is not None and spec.limit is not None:
                current = self.cache.usage_of(q)
                if self.cache.usage.get(usage_key(q)) is None and not current.charges:
                    current = QueueUsage(queue=q, charges=self._from_ledgers(q))
                out[usage_key(q)] = current
            else:
                out[usage_key(q)] = QueueUsage(queue=q)
        return out

    def _from_ledgers(self, queue: str) -> dict[str, int]:
        """The charges the ledgers hold for ``queue`` (for its first usage record)."""
        return expected_usage(self.cache.ledger_of(k) for k in self.cache.views
                              if self.cache.ledger_of(k) is not None).get(queue, {})

    # -- the order of a cycle --------------------------------------------------------------------
    def ranks(self) -> dict[str, float]:
        """Each queue's distance from its fair share (lower goes first; ``queueorder.shares_and_ranks``),
        at most every ``ORDER_EVERY_S`` recomputed from the units held, the gangs asking for GPUs and
        the usable nodes' GPUs."""
        now = self.clock()
        if now - self._ranked_at < ORDER_EVERY_S:
            return self._ranks
        self._ranked_at = now
        waiting = queueorder.waiting_units((e.value for e in self.cache.gangs), self._reserved)
        capacity = sum(len(v.topology.gpus) for v in self.cache.views.values() if v.enabled and not v.invalid) * GPU_UNITS
        history = tuple(sorted((e.value for e in self.cache.history), key=lambda r: r.queue))
        at = self.cache.clock()
        self.shares, self._ranks = queueorder.shares_and_ranks(self.tree(), self.cache.queue_units, waiting, capacity,
                                                               usage.recent_gpus(history, at))
        tree = self.tree()
        order = RecordedOrder(specs=tuple(tree.specs.values()), held={q: max(0, n) for q, n in self.cache.queue_units.items()},
                              waiting=dict(waiting), capacity=capacity, history=history, now=at, shares=dict(self.shares))
        if self._order_logged is None or _changed(self._order_logged, order):
            self._order_logged = self._order_pending = order
        return self._ranks

    def rank_of(self, members: tuple[MemberSpec, ...]) -> float:
        return self.ranks().get(queue_of(members), float("inf"))


def _changed(before: RecordedOrder, after: RecordedOrder) -> bool:
    """Worth recording again: any input but the clock changed, or the shares did."""
    return msgspec.structs.replace(before, now=0.0) != msgspec.structs.replace(after, now=0.0)
