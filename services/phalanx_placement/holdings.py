"""What placement does with reservations already made, besides deciding: frees exactly what a
release names (never under a pod its node reports running), records a reservation for a pod
found bound without one (the reconciler's adoption, only onto free GPUs), and audits the
queues' usage records against the ledger (docs/saga.md "Checks", docs/queues.md).

A release that frees the last reservation standing on GPUs a preemptor's nomination keeps
turns that nomination into the preemptor's reservation **in the same atomic batch**
(``preempting.promotion``) and answers the preemptor ``Reserved``: its binds follow at once,
and no attempt of it waits on a timer or a wake-up (docs/preemption.md, "The attempt stays
open")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from phalanx_bus import BatchSender, Bus, Poisoned, TemporaryError
from phalanx_placement import checks, preempting, testhooks
from phalanx_placement.assumed import Commit
from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_placement.queues import PlacementQueues
from phalanx_proto import subjects as S
from phalanx_proto.events import AdoptRequested, Released, ReleaseRequested, Reserved
from phalanx_proto.queues import QueueUsage, usage_key
from phalanx_proto.state import GangState, NodeLedger, members_digest
from phalanx_proto.vocab import PLACING
from phalanx_proto.vocab import RefusalRule as R
from phalanx_rules.queues import usage_drift
from phalanx_telemetry import log, metrics, refused, warn

RELEASE_RETRY_S = 2.0
"""How soon a release held back under running pods is tried again, once it stops waiting."""
RELEASE_WAIT_S = 4.0
"""How long a release held back under running pods waits in its handler for those nodes'
agents to report again (each report: the release is tried at once), before it is handed back
to be redelivered after ``RELEASE_RETRY_S``."""
RELEASE_WAITERS = 8
"""Releases waiting so at once, at most: they hold consumer slots the placement commands need."""


class Holdings:
    def __init__(self, bus: Bus, cache: ClusterCache, config: Config, queues: PlacementQueues,
                 write: Callable[[Commit], Awaitable[None]], rewrite: Callable[..., Awaitable[bool]],
                 answers: BatchSender) -> None:
        self.bus, self.cache, self.config, self.queues, self.write = bus, cache, config, queues, write
        self.answers = answers
        """Where ``Released`` goes: with the cycles' replies, in the order they were sent."""
        self.rewrite = rewrite
        """``Commits.rewrite``: build the writes from the cache, again after a lost compare-and-set."""
        self._waiters = anyio.CapacityLimiter(RELEASE_WAITERS)
        self.answered: dict[tuple[str, int], float] = {}
        """(preemptor, attempt) → when its promotion's ``Reserved`` was sent (``nominations``
        sends it again should the attempt still wait long after)."""

    async def on_release(self, ev: ReleaseRequested) -> None:
        """Free exactly (gang, attempt, pod uid) for each pod named, after ``checks.check_release``.
        May be called more than once, and for a reservation that was never made (nothing to free)."""
        await self.cache.gangs.catch_up()  # a release is checked against the record as it is now
        record = self.cache.gang(ev.gang_id)
        if isinstance(record, Poisoned):
            refused(R.UNREADABLE_RECORD, f"{S.KV_GANGS}/{record.key}: {record.error}", gang=ev.gang_id,
                    attempt=ev.attempt)
            return
        refusal = checks.check_release(record, ev)
        if refusal is not None:
            refused(refusal.rule, refusal.why, gang=ev.gang_id, attempt=ev.attempt, command="release")
            return
        released, held, held_on, freeing, queues = 0, [], set(), 0, set()
        promoted: list[GangState] = []

        def build() -> dict:
            nonlocal held, held_on, freeing, promoted
            writes, held, held_on, freeing = {}, [], set(), 0
            for key in self.cache.gang_keys(ev.gang_id):
                ledger = self.cache.ledger_of(key)
                if ledger is None:
                    continue
                out = checks.release(ledger, ev, self.running_on(ledger.node))
                held += out.held
                if out.held:
                    held_on.add(ledger.node)
                if out.ledger is not None:
                    freeing += len(ledger.allocations) - len(out.ledger.allocations)
                    queues.update(q for k, a in ledger.allocations.items() if k not in out.ledger.allocations
                                  for q in a.queues)
                    writes[key] = out.ledger
            promoted = self.promotions(writes) if not testhooks.PROMOTE_DELAY_S else []
            for gang in (ev.gang_id, *(p.gang_id for p in promoted)):
                writes.update(self.queues.usage_writes(gang, writes))
            return writes

        # Under pods its node still reports running, a reservation is kept; the release waits
        # (a while, a few at once) for those nodes' next reports and frees what they let go.
        deadline = anyio.current_time() + RELEASE_WAIT_S
        while True:
            if await self.rewrite(build, what=f"gang {ev.gang_id}: release"):
                released += freeing
                for record in promoted:
                    await self.promoted(record, after=f"gang {ev.gang_id} released")
            if not held or not await self._wait_for_reports(held_on, deadline):
                break
        log("released", gang=ev.gang_id, attempt=ev.attempt, reason=ev.reason, allocations=released)
        if held:
            refused(R.LIVE_POD, f"{', '.join(held[:5])}: still running on the node (its agent's report), so the "
                                "reservation is kept; the release is retried", gang=ev.gang_id, attempt=ev.attempt,
                    command="release")
            raise TemporaryError(f"gang {ev.gang_id}: {len(held)} reservation(s) held under running pods",
                                 delay=RELEASE_RETRY_S)
        await self.answers.send(Released(gang_id=ev.gang_id, attempt=ev.attempt, pods=ev.pods,
                                         queues=tuple(sorted(queues))[:64]))

    def promotions(self, writes: dict) -> list[GangState]:
        """Add to ``writes`` the promotion of every preemptor nominated on a node they touch
        whose nominations ``preempting.promotion`` can now turn into its reservation (its record
        at that attempt, placing or preempting); returns their records."""
        now = self.cache.clock()
        gangs = sorted({n.gang_id for led in writes.values() if isinstance(led, NodeLedger)
                        for n in led.nominations.values() if n.active(now)})
        out = []
        for gang in gangs:
            record = self.cache.gang(gang)
            if not isinstance(record, GangState) or record.phase not in PLACING:
                continue
            promo = preempting.promotion(lambda k: _ledger(writes.get(k)) or self.cache.ledger_of(k),
                                         self.cache.gang_keys(gang), record, now,
                                         queues=self.queues.chain(record.members), usable=self.cache.usable)
            if promo:
                writes.update(promo)
                out.append(record)
        return out

    async def promoted(self, record: GangState, *, after: str) -> None:
        """The preemptor's nomination is its reservation now (committed): answer ``Reserved``."""
        log("promoted", gang=record.gang_id, attempt=record.attempt, after=after)
        metrics.PROMOTIONS.inc()
        testhooks.exit_after_promotion()
        self.answered[(record.gang_id, record.attempt)] = self.cache.clock()
        await self.answers.send(Reserved(gang_id=record.gang_id, attempt=record.attempt,
                                         members_digest=members_digest(record)))

    async def _wait_for_reports(self, nodes: set[str], deadline: float) -> bool:
        """Wait, until ``deadline``, for one of ``nodes``' agents to report again (whether its
        pods are gone); False when it did not, or when ``RELEASE_WAITERS`` already wait."""
        if self.cache.node_states is None or anyio.current_time() >= deadline:
            return False
        try:
            self._waiters.acquire_nowait()
        except anyio.WouldBlock:
            return False
        try:
            return await self.cache.node_states.changed(nodes, deadline - anyio.current_time())
        finally:
            self._waiters.release()

    async def on_adopt(self, ev: AdoptRequested) -> None:
        """Record a reservation for a pod found bound without one, if its GPUs are free there
        (``checks.adopt``); otherwise refuse and say why (the reconciler reports the pod)."""
        node = ev.assignment.node
        key = S.token(node)

        def build() -> dict | None:
            if key in self.cache.ledger.poisoned:
                bad = self.cache.ledger.poisoned[key]
                refused(R.UNREADABLE_RECORD, f"{S.KV_LEDGER}/{key} (revision {bad.revision}): {bad.error}",
                        gang=ev.gang_id, pod=str(ev.assignment.pod))
                return None
            ledger = self.cache.ledger_of(key) or NodeLedger(node=node)
            topo = self.cache.topology.get(key)
            report = topo.value if topo is not None and topo.value.node == node else None
            record = self.cache.gang(ev.gang_id)
            chain = self.queues.chain(record.members) if isinstance(record, GangState) else self.queues.chain(())
            out = checks.adopt(ledger, report.topology if report is not None else None, ev, self.running_on(node, None),
                               queues=chain)
            if isinstance(out, checks.Refusal):
                refused(out.rule, out.why, gang=ev.gang_id, pod=str(ev.assignment.pod), command="adopt")
                return None
            if out is None:
                return None
            writes: dict = {key: out}
            writes.update(self.queues.usage_writes(ev.gang_id, writes))
            return writes

        if await self.rewrite(build, what=f"node {node}: adoption"):
            warn("reservation recorded for a bound pod", gang=ev.gang_id, attempt=ev.attempt,
                 pod=str(ev.assignment.pod), node=node, gpus=",".join(map(str, ev.assignment.gpus)), reason=ev.reason)

    def running_on(self, node: str, unknown=frozenset()) -> frozenset[str] | None:
        """The pods ``node``'s agent reports running there (``NodeKubeState.phalanx_pods``);
        ``unknown`` when it reports no state."""
        state = self.cache.node_states.of(node) if self.cache.node_states is not None else None
        return frozenset(state.phalanx_pods) if state is not None else unknown

    async def audit_usage(self) -> None:
        """Every ``usage_audit_s``: compare each queue's usage with what the ledger says and, when
        the same drift is seen twice running with no commit in flight, write what the ledger says
        (by compare-and-set; a usage that changed meanwhile is looked at again next pass)."""
        seen: dict[str, QueueUsage] = {}
        while True:
            await anyio.sleep(self.config.usage_audit_s)
            if self.cache.assuming:
                seen = {}
                continue
            usage = {e.value.queue: e.value for e in self.cache.usage}
            drift = usage_drift(self.queues.tree(), (e.value for e in self.cache.ledger), usage)
            confirmed = {q: u for q, u in drift.items() if seen.get(q) == u}
            seen = drift
            for q, fixed in confirmed.items():
                warn("queue usage repaired from the ledger", queue=q, had=usage[q].allocated if q in usage else 0,
                     ledger_says=fixed.allocated)
                metrics.QUEUE_USAGE_REPAIRS.inc(queue=q)
                try:
                    await self.write(self.cache.assume({usage_key(q): fixed}))
                except Exception as e:  # noqa: BLE001 - a commit raced it: looked at again next pass
                    warn("queue usage repair not written", queue=q, error=repr(e)[:200])


def _ledger(value: object) -> NodeLedger | None:
    return value if isinstance(value, NodeLedger) else None
