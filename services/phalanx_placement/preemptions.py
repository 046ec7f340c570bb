"""placement's side of preemption (docs/preemption.md, "Wiring"), around the pure pieces in
``preempting``: for a gang the engine could not place, wait for the victims its nomination
names (sending their eviction again) or plan a preemption and nominate the GPUs it frees
(``plan``); drop a nomination whose eviction binder was refused and keep those victims out of
the gang's plans for a while (``on_eviction_refused``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from phalanx_engine.framework import Profile
from phalanx_engine.preempt import NoPlan, plan_preemption
from phalanx_placement import nominations, preempting
from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_placement.confine import confinement
from phalanx_placement.outcomes import Decided, Reply
from phalanx_placement.outcomes import preempting_answer as preempting_reply
from phalanx_placement.queues import PlacementQueues
from phalanx_placement.whatif import Relaxed
from phalanx_proto import subjects as S
from phalanx_proto.events import EvictionRefused, EvictPods, MemberSpec, PlaceRequested, RecordedPreemption
from phalanx_proto.queues import shown
from phalanx_proto.state import GangState, NodeLedger
from phalanx_proto.vocab import PLACING
from phalanx_proto.vocab import RefusalRule as R
from phalanx_rules.preemption import preemptor_of, with_nominations
from phalanx_telemetry import log, metrics, refused, warn


class Preemptions:
    def __init__(self, cache: ClusterCache, queues: PlacementQueues, config: Config, profile: Callable[[], Profile],
                 rewrite: Callable[..., Awaitable[bool]],
                 answer: Callable[[object], Awaitable[None]] | None = None) -> None:
        self.cache, self.queues, self.config, self.profile, self.rewrite = cache, queues, config, profile, rewrite
        self.answer = answer
        """Sends a reply to gang-coordinator (with the cycle's others); None: replies are not sent."""
        self._refused: dict[str, dict[str, float]] = {}
        """Preemptor → victim gangs whose eviction was refused for it, until when they are left
        out of its plans (``on_eviction_refused``)."""

    def ledgers(self) -> list[NodeLedger]:
        """Every node's ledger as the cache believes it (assumed commits included)."""
        return [led for key in self.cache.views if (led := self.cache.ledger_of(key)) is not None]

    def plan(self, ev: PlaceRequested, record: GangState, members: tuple[MemberSpec, ...], queue: str,
             avoid: frozenset[str] | None = None) -> tuple[Decided | Reply | Relaxed | None, RecordedPreemption | None]:
        """A gang that does not fit: wait for the victims its nomination names, or plan a
        preemption (``phalanx_engine.preempt``) on the cluster without the gang's own
        reservations and nominations (the caller's ``excluding``). Otherwise no preemption
        helps (the caller answers the engine's reason): the preempt probe's planner, which says
        which victims the refusing rules kept it from (``whatif.Relaxed``), or None. Beside the
        outcome, what the planner read and answered for the decision log (None when it was not
        asked). ``avoid``: the nodes the gang's decision left alone (its ``avoid_nodes`` and other
        queues' spare capacity for repairs, ``spare``); None: its ``avoid_nodes``."""
        now = self.cache.clock()
        ledgers = self.ledgers()
        own = [n for n in preempting.nominations(ledgers, ev.gang_id, now) if n.attempt == ev.attempt]
        holding = sorted({v for n in own for v in n.victims if self.cache.victim_holds(v)})
        if own and holding:
            # A request decided again while its nomination's victims still hold GPUs (redelivered
            # after a crash, before or after its Preempting): the attempt waits on, and the
            # eviction goes again. Its message id is the first one's, so within the stream's
            # window it is dropped; after it, binder evicts only pods still there.
            named = sorted({v for n in own for v in n.victims})
            reply = preempting_reply(ev, preempting.waiting_reason(own, holding), sorted({n.assignment.node for n in own}))
            return Reply(reply, evict=EvictPods(gang_id=ev.gang_id, attempt=ev.attempt, victims=tuple(named))), None
        preemptor = preemptor_of(ev.gang_id, members, queue)
        if isinstance(preemptor, str):
            log("preemption refused", gang=ev.gang_id, attempt=ev.attempt, reason=preemptor)
            return None, None
        refused = {g for g, until in self._refused.get(ev.gang_id, {}).items() if until > now}
        running = preempting.candidates(ledgers, self._record, ev.gang_id, now, refused)
        held_by = with_nominations(self.cache.queue_units, ledgers, self.queues.tree(), now, but=ev.gang_id)
        # A repair attempt preempts only inside the domain its placement is confined to
        # (docs/repair.md): the victims hold GPUs there and the nomination lands there.
        scope = confinement(record, self.cache.cluster)
        within = scope.inside if scope is not None and scope.required else None
        avoid = frozenset(record.avoid_nodes) if avoid is None else avoid
        plan = plan_preemption(self.cache.cluster, preemptor, running, self.queues.tree(),
                               held_by=held_by, profile=self.profile(), avoid=avoid, now=now, within=within)
        logged = preempting.recorded(preemptor, running, self.queues.tree(), held_by, now, plan)
        if isinstance(plan, NoPlan) or not plan.victims:
            log("no preemption", gang=ev.gang_id, attempt=ev.attempt,
                reason=plan.reason if isinstance(plan, NoPlan) else "the planner placed it without victims")
            if not isinstance(plan, NoPlan) or plan.code in ("queue-problem", "search-bound"):
                return None, logged
            return Relaxed(preemptor, running, self.queues.tree(), held_by, plan.reason,
                           avoid=avoid, within=within, profile=self.profile(), now=now,
                           retry_at=(plan.retry_at or 0.0) if plan.code == "min-runtime" else 0.0), logged
        writes: dict = preempting.nominate(self.cache.ledger_of, S.token, self.cache.gang_keys(ev.gang_id),
                                           ev.gang_id, ev.attempt, plan, preemptor,
                                           expires_at=now + self.config.nomination_s, now=now)
        writes.update(self.queues.reclaim_fence(queue, plan.victims))
        reason = preempting.preempting_reason(plan)
        log("preempting", gang=ev.gang_id, attempt=ev.attempt, reason=reason,
            victims=",".join(v.gang_id for v in plan.victims), gpus=shown(plan.units))
        reply = preempting_reply(ev, reason, sorted({a.node for a in plan.placement.assignments}))
        return Decided(self.cache.assume(writes), plan.placement, plan=plan, reply=reply,
                       evict=EvictPods(gang_id=ev.gang_id, attempt=ev.attempt,
                                       victims=tuple(v.gang_id for v in plan.victims))), logged


    def _record(self, gang_id: str) -> GangState | None:
        record = self.cache.gang(gang_id)
        return record if isinstance(record, GangState) else None

    async def on_eviction_refused(self, ev: EvictionRefused) -> None:
        """binder could not evict a victim of ``ev.gang_id``'s nomination (a disruption budget):
        drop the gang's nominations, and leave those victims out of its plans for
        ``nomination_s`` so the planner chooses others, or the gang waits with the reason. Only
        for a nomination the ledger holds for this attempt naming those victims."""
        now = self.cache.clock()
        own = [n for n in preempting.nominations(self.ledgers(), ev.gang_id, now) if n.attempt == ev.attempt]
        named = {v for n in own for v in n.victims}
        victims = [v for v in ev.victims if v in named]
        if not victims:
            refused(R.NOT_RECORDED, f"no nomination of gang {ev.gang_id} attempt {ev.attempt} names "
                                    f"{', '.join(ev.victims[:5]) or 'these victims'}", gang=ev.gang_id,
                    attempt=ev.attempt, command="eviction_refused")
            return
        self._refused.setdefault(ev.gang_id, {}).update({v: now + self.config.nomination_s for v in victims})
        self._refused = {g: left for g, vs in self._refused.items() if (left := {v: t for v, t in vs.items() if t > now})}
        def build() -> dict:
            return {key: new for key in self.cache.gang_keys(ev.gang_id)
                    if (ledger := self.cache.ledger_of(key)) is not None
                    and (new := preempting.without_nominations(ledger, ev.gang_id, now)) != ledger}

        await self.rewrite(build, what=f"gang {ev.gang_id}: dropping its nomination")
        metrics.PREEMPTIONS_REFUSED.inc()
        warn("eviction refused, nomination dropped", gang=ev.gang_id, attempt=ev.attempt,
             victims=",".join(victims), reason=ev.reason)
        record = self.cache.gang(ev.gang_id)
        if self.answer is not None and isinstance(record, GangState) and record.attempt == ev.attempt \
                and record.phase in PLACING:
            # The attempt waited for these victims: it backs off, and plans again without them.
            await self.answer(nominations.failed(record, f"preempting for it is blocked, the planner will choose "
                                                         f"again: {ev.reason}"[:2000]))
