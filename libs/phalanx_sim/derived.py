"""What the run derives from a waiting gang again and again, derived once: its members as the
engine sees them (``Member``: kind, units, shape), the refusal key, the preemptor. A gang's
members and priority never change, so each is kept from its first use until it starts
(``forget``); an evicted gang derives them again when it next waits."""

from __future__ import annotations

from phalanx_engine.framework import Member
from phalanx_proto.state import GangState
from phalanx_rules.preemption import Preemptor, preemptor_of
from phalanx_rules.queueorder import queue_of


class Derived:
    def __init__(self) -> None:
        self._members: dict[str, tuple[Member, ...]] = {}
        self._preemptors: dict[str, Preemptor | None] = {}

    def members(self, s: GangState) -> tuple[Member, ...]:
        got = self._members.get(s.gang_id)
        if got is None:
            got = self._members[s.gang_id] = tuple(Member.of(m) for m in s.members)
        return got

    def key(self, s: GangState) -> str | bytes:
        """What a refusal is remembered by: a gang of one by its request's shape (members with
        equal shapes are interchangeable, so a pod arriving with the shape of one just refused is
        refused too), a larger gang by its id."""
        return self.members(s)[0].shape if len(s.members) == 1 else s.gang_id

    def preemptor(self, s: GangState) -> Preemptor | None:
        """The gang as the planner's preemptor (``phalanx_rules.preemption.preemptor_of``); None
        when it may not preempt (its members disagree on the priority)."""
        if s.gang_id not in self._preemptors:
            who = preemptor_of(s.gang_id, s.members, queue_of(s.members))
            self._preemptors[s.gang_id] = who if not isinstance(who, str) else None
        return self._preemptors[s.gang_id]

    def forget(self, gang_id: str) -> None:
        self._members.pop(gang_id, None)
        self._preemptors.pop(gang_id, None)
