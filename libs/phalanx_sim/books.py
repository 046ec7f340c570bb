"""The run's queue books as the rulebook's arguments: ``phalanx sim``'s adapter over
``phalanx_rules.queueorder``, as ``services/phalanx_placement/queues.py`` is placement's (the two
answer alike on the same state: tests/unit/test_rulebook_agreement.py).

The run keeps, per queue, the units its running gangs hold (``held``, a queue's subtree
included) and the units its waiting gangs ask for (``waiting_units``); the tree and the
cluster's GPUs do not change during a run. A gang the run retries never holds a reservation,
so nothing a decision would replace is ever given back (placement's ``releasing``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from phalanx_proto.events import MemberSpec
from phalanx_proto.queues import QueueHistory
from phalanx_proto.state import GangState, attempt_members
from phalanx_rules import queueorder, usage
from phalanx_rules.queueorder import queue_of
from phalanx_rules.queues import QueueTree


def _unreserved(s: GangState) -> bool:
    """A placing gang's reservation is never in yet here: the run decides it in the same instant."""
    return False


class SimQueues:
    def __init__(self, tree: QueueTree, held: Mapping[str, int], waiting_units: Mapping[str, int],
                 capacity: int, half_life_s: float = 0.0) -> None:
        self.tree, self.held, self.waiting_units, self.capacity = tree, held, waiting_units, capacity
        self.half_life_s = half_life_s
        self.history: dict[str, QueueHistory] = {}
        """Each queue's recent usage, advanced at every change of what it holds (``held``): the
        run knows each change's instant, so it is the exact record placement's looks approach."""

    def held_changed(self, queues: Iterable[str], now: float) -> None:
        """What ``queues`` hold changed at ``now`` (``held`` is already the new amount): their
        records advance to now, holding that from now on (nothing when the half-life is 0)."""
        if self.half_life_s > 0:
            for q in queues:
                self.history[q] = usage.advance(self.history.get(q), q, now, max(0, self.held.get(q, 0)),
                                                self.half_life_s)

    def recent(self, now: float) -> dict[str, float] | None:
        return usage.recent_gpus(self.history.values(), now) if self.history else None

    def refusal(self, members: tuple[MemberSpec, ...]) -> str:
        return queueorder.refusal(self.tree, members, self.held)

    def borrowing(self, members: tuple[MemberSpec, ...]) -> bool:
        return queueorder.borrowing(self.tree, members, self.held)

    def below_quota(self, queue: str) -> bool:
        return queueorder.below_quota(self.tree, self.held, queue)

    def owed_candidates(self, records: Iterable[GangState]) -> list[tuple[str, tuple[MemberSpec, ...]]]:
        """The waiting gangs (as placement sees the records: those starting now are placing) that
        make their queue owed free GPUs."""
        return queueorder.owed_candidates(self.tree, self.held, (
            (queue_of(s.members), attempt_members(s)) for s in records if queueorder.owed_candidate(s, _unreserved)))

    def owed_now(self, queue: str, candidates: list, fits: Callable[[tuple[MemberSpec, ...]], bool],
                 memo: dict[int, bool]) -> tuple[str, ...]:
        return queueorder.owed(self.tree, queue, candidates, fits, memo)

    def shares_and_ranks(self, now: float = 0.0) -> tuple[dict[str, int], dict[str, float]]:
        return queueorder.shares_and_ranks(self.tree, self.held, self.waiting_units, self.capacity, self.recent(now))
