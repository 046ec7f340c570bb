"""binder's part of preemption: evicting the victims of a nomination through the Eviction API
(docs/preemption.md, "Wiring").

An ``EvictPods`` command is a reference, believed only as far as the ledger goes (docs/saga.md,
"Checks"): the ledger must hold a nomination in force for exactly this preemptor gang and
attempt (placement writes it in the same compare-and-set as its reservations), every victim
the command names must be one that nomination names, and the pods evicted are the ones the
ledger holds reservations of those gangs for — never a pod the command names. A command that
fails a check is refused (logged with the rule, counted) and changes nothing.

Then, for the victims' pods (issue #39: one pass, all at once):

1. the pods a PodDisruptionBudget selects (``ClusterPort.budgeted``: one listing of the budgets
   per namespace) are tried as a dry run first: when a budget refuses any of them (HTTP 429),
   nothing is evicted, the preemptor's pods get a ``PreemptionBlocked`` warning event with the
   API server's reason, and placement is told (``EvictionRefused``) so it drops the nomination
   and chooses again without those gangs, or the gang waits; pods no budget selects need no
   dry run (nothing can refuse their eviction);
2. otherwise every pod is evicted, ``EVICT_PODS_AT_ONCE`` at a time; then each gets a
   ``Preempted`` event naming the preemptor, its queue and priority and the rule — after the
   evictions, so the events never delay them. The victims' controllers see their pods go;
   gang-coordinator rolls each victim gang back as for any deleted member, releasing its
   reservations, and placement turns the nomination into the preemptor's reservation when the
   last of its GPUs is released (docs/preemption.md). A budget that changes between the dry run
   and the eviction can still refuse a pod there: that is reported the same way, no eviction
   starts after it, and the pods evicted before it (or under way beside it) stay evicted (their
   gangs roll back whole).

Evicting a pod already gone is no error (a redelivered command evicts nothing twice).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from phalanx_bus import Bus, MirrorLagging, TemporaryError
from phalanx_bus.ledger import LedgerBook
from phalanx_kube.port import ClusterPort, EvictionBlocked, NotOurs
from phalanx_proto import subjects as S
from phalanx_proto.events import EvictionRefused, EvictPods, PodRef
from phalanx_proto.state import Nomination, victim_of
from phalanx_proto.vocab import RefusalRule as R
from phalanx_telemetry import log, metrics, refused, warn

EVICT_PODS_AT_ONCE = 32
"""Eviction requests (dry runs, evictions, then events) in flight at once: one at a time, a
preemptor whose victims hold 50 pods waited about 5 s on the API server's writes."""


class Evictions:
    def __init__(self, bus: Bus, cluster: ClusterPort, ledger: LedgerBook,
                 clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.cluster = cluster
        self.ledger = ledger
        self.clock = clock

    def check(self, ev: EvictPods) -> tuple[list[Nomination], dict[str, list[PodRef]]] | str:
        """The nomination and each victim's pods, from the ledger; or why the command is refused."""
        noms = self.ledger.nominations(ev.gang_id, ev.attempt, self.clock())
        if not noms:
            return f"the ledger holds no nomination in force for gang {ev.gang_id} attempt {ev.attempt}"
        named = {v for n in noms for v in n.victims}
        foreign = [v for v in ev.victims if v not in named]
        if foreign or not ev.victims:
            return (f"gang {ev.gang_id} attempt {ev.attempt}'s nomination does not name "
                    f"{', '.join(foreign[:5]) or 'any victim of the command'} as a victim")
        return noms, {v: self.ledger.gang_pods(v) for v in dict.fromkeys(ev.victims)}

    async def evict(self, ev: EvictPods) -> None:
        """Carry out one eviction command (see the module's docstring). May be called more than
        once: pods already evicted are gone and are not evicted again."""
        verdict = self.check(ev)
        if isinstance(verdict, str):
            try:
                await self.ledger.catch_up()  # a nomination committed a moment ago
            except MirrorLagging as e:
                raise TemporaryError(f"cannot check the eviction yet: {e}", delay=1.0) from e
            verdict = self.check(ev)
        if isinstance(verdict, str):
            refused(R.NOT_RECORDED, verdict, gang=ev.gang_id, attempt=ev.attempt, command="evict")
            return
        noms, victims = verdict
        pods = [(v, p) for v, refs in victims.items() for p in refs]
        blocked: dict[str, str] = {}
        foreign: list[str] = []
        budgeted = await self.cluster.budgeted([p for _, p in pods])

        async def dry_run(victim: str, ref: PodRef) -> None:
            try:
                await self.cluster.evict_pod(ref, dry_run=True)
            except EvictionBlocked as e:
                blocked.setdefault(victim, str(e))
            except NotOurs as e:
                foreign.append(str(e))

        await self._each([(v, p) for v, p in pods if p in budgeted], dry_run)
        if foreign:
            refused(R.FOREIGN_SCHEDULER, foreign[0], gang=ev.gang_id, attempt=ev.attempt, command="evict")
            return
        if blocked:
            await self._refused(ev, noms, blocked, evicted=0)
            return
        first = noms[0]
        evicted: list[tuple[str, PodRef]] = []

        async def evict(victim: str, ref: PodRef) -> None:
            try:
                if await self.cluster.evict_pod(ref):
                    evicted.append((victim, ref))
                    metrics.EVICTIONS.inc(result="evicted")
                    log("evicted", pod=str(ref), victim=victim, preemptor=ev.gang_id, attempt=ev.attempt,
                        rule=first.victims.get(victim, "priority"))
                else:
                    metrics.EVICTIONS.inc(result="gone")
            except EvictionBlocked as e:  # the budget changed since the dry run: start no more
                blocked.setdefault(victim, str(e))
            except NotOurs as e:
                refused(R.FOREIGN_SCHEDULER, str(e), gang=ev.gang_id, attempt=ev.attempt, command="evict")

        await self._each(pods, evict, stop=lambda: bool(blocked))
        if blocked:
            await self._refused(ev, noms, blocked, evicted=len(evicted))

        async def tell(victim: str, ref: PodRef) -> None:
            rule = first.victims.get(victim, "priority")
            try:
                await self.cluster.record_event(
                    ref, reason="Preempted", type="Warning",
                    message=f"Preempted by gang {ev.gang_id} (queue {first.queue or 'default'}, priority "
                            f"{first.priority}) under rule {rule}: {_victim_words(victim)}")
            except Exception as e:  # noqa: BLE001 - an event is information; the eviction is done
                warn("event not recorded", pod=str(ref), error=repr(e)[:200])

        await self._each(evicted, tell)

    async def _each(self, pods: list[tuple[str, PodRef]], fn: Callable[[str, PodRef], Awaitable[None]], *,
                    stop: Callable[[], bool] = lambda: False) -> None:
        """``fn(victim, pod)`` for every pod, ``EVICT_PODS_AT_ONCE`` at a time, in order; none
        started once ``stop()`` says so (those under way finish)."""
        limiter = anyio.CapacityLimiter(EVICT_PODS_AT_ONCE)

        async def one(victim: str, ref: PodRef) -> None:
            async with limiter:
                if not stop():
                    await fn(victim, ref)

        async with anyio.create_task_group() as tg:
            for victim, ref in pods:
                tg.start_soon(one, victim, ref)

    async def _refused(self, ev: EvictPods, noms: list[Nomination], blocked: dict[str, str], *, evicted: int) -> None:
        metrics.EVICTIONS.inc(len(blocked), result="refused")
        reason = "; ".join(f"gang {v}: {why}" for v, why in sorted(blocked.items()))
        warn("eviction refused", preemptor=ev.gang_id, attempt=ev.attempt, victims=",".join(sorted(blocked)),
             evicted_before=evicted, reason=reason[:500])
        message = f"preempting for gang {ev.gang_id} is blocked, the planner will choose again: {reason}"
        async with anyio.create_task_group() as tg:
            for n in noms:
                tg.start_soon(self._note, n.assignment.pod, message)
        await self.bus.publish(S.eviction_refused_subject(ev.gang_id), EvictionRefused(
            gang_id=ev.gang_id, attempt=ev.attempt, victims=tuple(sorted(blocked)), reason=reason[:2000]))

    async def _note(self, ref: PodRef, message: str) -> None:
        try:
            await self.cluster.record_event(ref, reason="PreemptionBlocked", message=message, type="Warning")
        except Exception as e:  # noqa: BLE001 - an event is information; the refusal is sent anyway
            warn("event not recorded", pod=str(ref), error=repr(e)[:200])


def _victim_words(victim: str) -> str:
    """What a victim's pods are told: a gang goes whole; an elastic gang's extra goes alone."""
    gang_id, pod = victim_of(victim)
    if pod:
        return f"an extra member of elastic gang {gang_id}, given up while the gang keeps running its minimum"
    return f"victim gang {victim} is evicted whole"
