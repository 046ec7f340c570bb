"""placement's watch over the preemptions under way (docs/preemption.md, "The attempt stays
open"). A preemptor's attempt waits in ``preempting`` while its victims go; the release that
frees their last GPUs turns its nomination into its reservation (``holdings``). Every
``PASS_S`` this pass looks at each gang the gang records say is ``preempting`` and keeps it
moving whatever was lost on the way:

* its nomination can become its reservation (the release that freed the GPUs could not promote
  it: another replica's, or a node's report was stale then): promoted now, ``Reserved``;
* its reservation is in the ledger but the attempt still waits ``RESEND_S`` later (the
  ``Reserved`` was lost: a placement killed between its commit and its reply): ``Reserved``
  again;
* its victims still hold GPUs ``RESEND_S`` after the nomination (an eviction never sent, or a
  pod slow to go): the eviction again (its message id is the first one's, so it is stored only
  if the first never was; binder evicts only pods still there) and the pods' reason names who
  still holds (``Preempting`` again), at most every ``RESEND_S``;
* it has no nomination in force for the attempt, or its victims are gone and the nomination
  still cannot become its reservation, in two passes running: the nomination is dropped and the
  attempt answered ``PlacementFailed``, so the gang backs off and plans again on the cluster as
  it is then (a nomination expires after ``--nomination-s``).

Every action is idempotent: two replicas running it, or a pass racing a release, promote once
(the ledger's compare-and-set decides; the loser finds the reservation there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from phalanx_bus import BatchSender, Bus
from phalanx_placement import preempting, testhooks
from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_placement.holdings import Holdings
from phalanx_proto import subjects as S
from phalanx_proto.events import EvictPods, PlacementFailed, Preempting, Reserved
from phalanx_proto.state import GangState, NodeLedger, alloc_key, attempt_members, members_digest
from phalanx_telemetry import log, metrics, warn

PASS_S = 1.0
"""Seconds between two looks at the preemptions under way."""
RESEND_S = 5.0
"""How long a preemption may wait on its victims, or on its ``Reserved``, before it is sent again."""


class Nominations:
    def __init__(self, bus: Bus, cache: ClusterCache, config: Config, holdings: Holdings,
                 rewrite: Callable[..., Awaitable[bool]], answers: BatchSender) -> None:
        self.bus, self.cache, self.config, self.holdings = bus, cache, config, holdings
        self.rewrite, self.answers = rewrite, answers
        self._resent: dict[tuple[str, int], float] = {}
        """(preemptor, attempt) → when its eviction was last sent again."""
        self._doubtful: set[tuple[str, int]] = set()
        """Preempting attempts found without a nomination that can serve them in the last pass."""

    async def run(self) -> None:
        while True:
            await anyio.sleep(PASS_S)
            try:
                await self.once()
            except Exception:  # noqa: BLE001 - the next pass tries again
                log("nomination pass failed", level=40, exc_info=True)

    async def once(self) -> None:
        now = self.cache.clock()
        live = set()
        for gang in sorted(self.cache.preempting):
            record = self.cache.gang(gang)
            if isinstance(record, GangState) and record.phase == "preempting":
                live.add((gang, record.attempt))
                await self._one(record, now)
        self._resent = {k: v for k, v in self._resent.items() if k in live}
        self._doubtful &= live
        self.holdings.answered = {k: v for k, v in self.holdings.answered.items() if k in live}

    async def _one(self, record: GangState, now: float) -> None:
        key = (record.gang_id, record.attempt)
        if self._reserved(record):
            if now - self.holdings.answered.setdefault(key, now) >= RESEND_S:
                log("preemptor still waits with its reservation in the ledger: Reserved again", gang=record.gang_id,
                    attempt=record.attempt)
                self.holdings.answered[key] = now
                await self.answers.send(Reserved(gang_id=record.gang_id, attempt=record.attempt,
                                                 members_digest=members_digest(record)))
            return
        if await self._promote(record):
            self._doubtful.discard(key)
            return
        noms = [n for n in preempting.nominations(self._ledgers(record.gang_id), record.gang_id, now)
                if n.attempt == record.attempt]
        holding = sorted({v for n in noms for v in n.victims if self.cache.victim_holds(v)})
        covered = {alloc_key(m.pod) for m in attempt_members(record)} <= {alloc_key(n.assignment.pod) for n in noms}
        if covered and holding:
            self._doubtful.discard(key)
            made = min(n.expires_at for n in noms) - self.config.nomination_s
            if now - max(made, self._resent.get(key, 0.0)) >= RESEND_S:
                self._resent[key] = now
                victims = tuple(sorted({v for n in noms for v in n.victims}))
                log("preemptor still waits for its victims: eviction sent again", gang=record.gang_id,
                    attempt=record.attempt, holding=",".join(holding[:10]))
                await self.bus.publish(S.evict_subject(record.gang_id), EvictPods(
                    gang_id=record.gang_id, attempt=record.attempt, victims=victims))
                await self.answers.send(Preempting(
                    gang_id=record.gang_id, attempt=record.attempt, members_digest=members_digest(record),
                    reason=preempting.waiting_reason(noms, holding)[:4000],
                    nodes=tuple(sorted({n.assignment.node for n in noms}))))
            return
        if key not in self._doubtful:
            self._doubtful.add(key)  # the ledger mirror may be a moment behind the record: look again
            return
        self._doubtful.discard(key)
        why = ("its nomination ended (expired, or dropped)" if not covered else
               "its victims are gone but the GPUs nominated for it cannot be reserved (a node is unavailable)")
        await self.give_up(record, f"preempting did not start it: {why}; placing it again")

    async def give_up(self, record: GangState, summary: str) -> None:
        """Drop the attempt's nominations and answer it ``PlacementFailed``: the gang backs off
        and plans again."""
        now = self.cache.clock()

        def build() -> dict:
            return {key: new for key in self.cache.gang_keys(record.gang_id)
                    if (ledger := self.cache.ledger_of(key)) is not None
                    and (new := preempting.without_nominations(ledger, record.gang_id, now)) != ledger}

        await self.rewrite(build, what=f"gang {record.gang_id}: dropping its nomination")
        metrics.NOMINATIONS_GIVEN_UP.inc()
        warn("preemption given up", gang=record.gang_id, attempt=record.attempt, reason=summary)
        await self.answers.send(failed(record, summary))

    async def _promote(self, record: GangState) -> bool:
        """Promote the nomination now if it can be (``preempting.promotion``); True when done."""
        def build() -> dict | None:
            now = self.cache.clock()
            writes: dict = preempting.promotion(self.cache.ledger_of, self.cache.gang_keys(record.gang_id), record, now,
                                                queues=self.holdings.queues.chain(record.members),
                                                usable=self.cache.usable) or {}
            if writes:
                writes.update(self.holdings.queues.usage_writes(record.gang_id, writes))
            return writes

        if not await self.rewrite(build, what=f"gang {record.gang_id}: promoting its nomination",
                                  pause_s=testhooks.PROMOTE_DELAY_S):
            return False
        await self.holdings.promoted(record, after="nomination pass")
        return True

    def _reserved(self, record: GangState) -> bool:
        """The ledger holds every member of the record's attempt."""
        held = {k for key in self.cache.gang_keys(record.gang_id)
                for k, a in (self.cache.ledger_of(key) or NodeLedger(node="")).allocations.items()
                if a.gang_id == record.gang_id and a.attempt == record.attempt}
        members = attempt_members(record)
        return bool(members) and all(alloc_key(m.pod) in held for m in members)

    def _ledgers(self, gang_id: str) -> list[NodeLedger]:
        return [led for key in self.cache.gang_keys(gang_id) if (led := self.cache.ledger_of(key)) is not None]



def failed(record: GangState, summary: str) -> PlacementFailed:
    """The answer that ends a preempting attempt whose nomination is given up."""
    return PlacementFailed(gang_id=record.gang_id, attempt=record.attempt, summary=summary, reasons={summary: 1},
                           members=tuple(m.pod for m in attempt_members(record)), waits_for="gpus")
