"""Sending what a decision came to (docs/scale.md, "Placement's cache and scheduling cycle"):
each gang's reservations commit on their own, pipelined while the next cycle decides, in one
atomic batch expecting the ledger revisions the decision read (``write``); a lost
compare-and-set drops the assumption, catches the ledger up and puts the request back for the
next cycle; then the reply (``Reserved``, or for a preemption the eviction to binder and the
pending reply naming the victims), handed to the batch sender with the cycle's other replies."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from opentelemetry import context as otel_context

from phalanx_bus import BatchSender, Bus, KvConflict, TemporaryError, kv_atomic_write
from phalanx_placement import preempting, testhooks
from phalanx_placement.assumed import Commit
from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_placement.cycle_queue import RequestQueue, Waiting
from phalanx_placement.gauges import Gauges
from phalanx_placement.outcomes import Decided
from phalanx_proto import subjects as S
from phalanx_proto.events import EvictPods, Reserved
from phalanx_proto.queues import GPU_UNITS, QueueUsage
from phalanx_proto.state import NodeLedger
from phalanx_telemetry import log, metrics, tracer


class Commits:
    def __init__(self, bus: Bus, cache: ClusterCache, config: Config, gauges: Gauges, retry: RequestQueue,
                 answers: BatchSender) -> None:
        self.bus, self.cache, self.config, self.gauges, self.retry = bus, cache, config, gauges, retry
        self.answers = answers
        """gang-coordinator's answers: a cycle's replies go out together (docs/events.md, "Batches")."""
        self.conflicts = 0

    async def reply(self, w: Waiting, event, evict: EvictPods | None = None) -> None:
        token = otel_context.attach(w.context) if w.context is not None else None
        try:
            if evict is not None:
                await self.bus.publish(S.evict_subject(evict.gang_id), evict)
            await self.answers.send(event)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which retries the message
            w.finish(e)
            return
        finally:
            if token is not None:
                otel_context.detach(token)
        w.finish()

    async def commit(self, w: Waiting, decided: Decided) -> None:
        token = otel_context.attach(w.context) if w.context is not None else None
        try:
            await self._commit_traced(w, decided)
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _commit_traced(self, w: Waiting, decided: Decided) -> None:
        ev, commit, placed = w.ev, decided.commit, decided.decision.assignments
        try:
            with tracer().start_as_current_span("placement.commit", attributes={
                    "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                    "k8s.node.name": sorted(led.node for led in commit.writes.values()
                                            if isinstance(led, NodeLedger))}) as span:
                if testhooks.DECIDE_DELAY_S:
                    await anyio.sleep(testhooks.DECIDE_DELAY_S)
                try:
                    await self.write(commit)
                except KvConflict:
                    span.set_attribute("phalanx.outcome", "conflict")
                    raise
                span.set_attribute("phalanx.outcome", "committed")
        except KvConflict as e:
            self.conflicts += 1
            metrics.LEDGER_COMMIT_CONFLICTS.inc()
            log("ledger conflict, deciding again", gang=ev.gang_id, error=str(e), conflicts=self.conflicts)
            w.tries += 1
            if w.tries >= self.config.max_commit_retries:
                w.finish(TemporaryError(f"gang {ev.gang_id}: ledger kept changing", delay=0.5))
            else:
                try:
                    await self.cache.catch_up()
                except Exception as err:  # noqa: BLE001 - the bus is away (a leader election): retried later
                    w.finish(TemporaryError(f"gang {ev.gang_id}: cannot catch up with the ledger: {err!r}",
                                            delay=0.5))
                    return
                self.retry.put(w)
            return
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which retries the message
            w.finish(e)
            return
        if decided.evict is not None and decided.plan is not None:
            try:
                if testhooks.take_dropped_eviction():
                    log("test hook: the eviction is not sent", gang=ev.gang_id, attempt=ev.attempt)
                else:
                    await self.bus.publish(S.evict_subject(ev.gang_id), decided.evict)
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which retries the message
                w.finish(e)
                return
            rule = preempting.preemption_rule(decided.plan)
            metrics.PREEMPTIONS.inc(rule=rule)
            metrics.PREEMPTED_GANGS.inc(len(decided.plan.victims), rule=rule)
            metrics.PREEMPTED_GPUS.inc(decided.plan.units / GPU_UNITS, rule=rule)
            log("nominated", gang=ev.gang_id, attempt=ev.attempt, victims=",".join(decided.evict.victims),
                nodes=",".join(sorted({a.node for a in placed})))
            await self.reply(w, decided.reply)
            return
        log("reserved", gang=ev.gang_id, attempt=ev.attempt,
            assignments=";".join(f"{a.pod}@{a.node}:{','.join(map(str, a.gpus))}" for a in placed),
            unchecked_nodes=",".join(decided.decision.unchecked))
        await self.reply(w, Reserved(gang_id=ev.gang_id, attempt=ev.attempt, members_digest=ev.members_digest))

    async def rewrite(self, build: Callable[[], dict[str, NodeLedger | QueueUsage] | None], *, what: str,
                      pause_s: float = 0.0) -> bool:
        """Write what ``build`` makes of the cache as it is now, as one atomic batch; after a lost
        compare-and-set, catch the ledger up and build again, ``max_commit_retries`` times at most
        (then ``TemporaryError``: the message is retried later). Whether anything was written
        (``build`` returning nothing writes nothing). ``pause_s``: a test hook's wait between
        assuming the writes and sending them (``testhooks.PROMOTE_DELAY_S``)."""
        for _ in range(self.config.max_commit_retries):
            writes = build()
            if not writes:
                return False
            commit = self.cache.assume(writes)  # at once: the revisions expected are those ``build`` read
            if pause_s:
                try:
                    await anyio.sleep(pause_s)
                except BaseException:
                    self.cache.forget(commit)
                    raise
            try:
                await self.write(commit)
                return True
            except KvConflict:
                self.conflicts += 1
                metrics.LEDGER_COMMIT_CONFLICTS.inc()
                log("ledger conflict, building again", what=what, conflicts=self.conflicts)
                await self.cache.catch_up()
        raise TemporaryError(f"{what}: ledger kept changing", delay=0.5)

    async def write(self, commit: Commit) -> None:
        """Send the commit's atomic batch: all nodes or none, each expecting the revision its
        decision read; the cache learns the outcome either way."""
        try:
            last = await kv_atomic_write(self.bus, S.KV_LEDGER, await self.cache.expected(commit))
        except BaseException:
            self.cache.forget(commit)
            raise
        self.cache.settle(commit, last)
        self.gauges.committed()
