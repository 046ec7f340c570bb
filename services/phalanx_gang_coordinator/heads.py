"""The heads of the queues, as of the last resync: what the fairness gate decides on.

Resync notes the gangs that may head each queue (``update``: ``fairness.contenders``); the
driver asks the gate (``gate``) before it starts an attempt. One object, passed to both: the
view is up to ``--resync-s`` old, as gang-coordinator's queue is.
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx_proto.state import GangState
from phalanx_rules import fairness


class QueueHeads:
    def __init__(self, *, starve_after_s: float, mode: str) -> None:
        self.starve_after_s, self.mode = starve_after_s, mode
        self.contenders: dict[str, tuple[GangState, ...]] = {}
        """Per queue, the gangs that may head it as of the last ``update``."""

    def update(self, states: Iterable[GangState]) -> None:
        self.contenders = fairness.contenders(s for s in states if s.members)

    def gate(self, state: GangState, now: float) -> fairness.Gate:
        """The starvation gate among the gangs of the gang's own queue (across queues, a queue
        below its quota goes first in placement: docs/queues.md)."""
        others = [s for s in self.contenders.get(fairness.queue_of(state), ()) if s.gang_id != state.gang_id]
        return fairness.gate(state, others, now=now, starve_after_s=self.starve_after_s, mode=self.mode)
