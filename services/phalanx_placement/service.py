"""placement: decides where a gang goes and reserves it in the ledger (KV ``phx-ledger``).

It decides on a watch-fed cache of ``phx-topology``, ``phx-heartbeat``, ``phx-node-state``
(``nodestate.py``), ``phx-ledger`` and ``phx-gangs`` (``cache.py``): no request reads a bucket. ``PlaceRequested`` commands wait
in a queue (``cycle_queue.py``); a scheduling cycle takes what waits (at most ``cycle_max``),
highest priority first, then by arrival, and decides them one after the other on the cache,
each decision assumed into it before the next. Each gang's reservations then commit on their
own (pipelined, while the next cycle decides) in one atomic batch expecting the ledger
revisions the decision read; a lost compare-and-set (another replica changed a node) drops the
assumption, catches the ledger up from the watch and decides that request again. Redelivery is
safe: if the ledger already holds this gang's attempt, the same ``Reserved`` is sent again.

A refusal (no fit, a queue's limit, the borrow gate) is replied with what would start the gang
now, within a share of placement's time (``whatif.py``, docs/whatif.md).

Nothing is believed on its word (``checks.py``, docs/saga.md "Checks"): a request is carried
out only for the attempt and the members the gang's record in ``phx-gangs`` names; a release
frees exactly (gang, attempt, pod uid) and never a live member's reservation; an adoption
(the reconciler's repair for a pod bound without a reservation) only onto free GPUs. A bad
value in ``phx-ledger``, ``phx-topology`` or ``phx-heartbeat`` is isolated by its mirror:
its node is left out of decisions, the others go on.

Metrics: decision time, ledger conflicts, and, computed when ``/metrics`` is read (``gauges``),
the GPUs, core % and memory allocated by node, model and mode plus fragmentation
(``phalanx_telemetry.allocation``) and the fresh and stale nodes it holds
(``phalanx_placement_nodes``). Spans ``placement.decide`` and ``placement.commit`` carry
the gang, attempt, nodes, GPU ids, RDMA level and the failure reason.
"""

from __future__ import annotations

import dataclasses
import time

import anyio
from opentelemetry import context as otel_context

from phalanx_bus import (
    BatchSender,
    Bus,
    Delivery,
    Poisoned,
    TemporaryError,
    consume,
    enable_atomic,
    sender_id,
)
from phalanx_engine.decide import decide, decide_within, default_profile
from phalanx_engine.snapshot import Decision, NoFit
from phalanx_placement import checks, preempting, spare
from phalanx_placement.cache import ClusterCache
from phalanx_placement.commits import Commits
from phalanx_placement.config import Config
from phalanx_placement.confine import Scope, confinement
from phalanx_placement.cycle_queue import RequestQueue, Waiting
from phalanx_placement.gauges import Gauges
from phalanx_placement.history import UsageHistory
from phalanx_placement.holdings import Holdings
from phalanx_placement.nominations import Nominations
from phalanx_placement.outcomes import Decided, Reply
from phalanx_placement.preemptions import Preemptions
from phalanx_placement.queues import PlacementQueues
from phalanx_placement.recorder import Recorder
from phalanx_placement.whatif import ProbeBudget, Probes, Relaxed
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    AdoptRequested,
    EvictionRefused,
    MemberSpec,
    PlacementFailed,
    PlaceRequested,
    ReleaseRequested,
    Reserved,
    WhatIf,
    gang_decoder,
)
from phalanx_proto.queues import units_of_assignment
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key, attempt_members
from phalanx_proto.vocab import RefusalRule as R
from phalanx_rules import queueorder
from phalanx_rules.queueorder import queue_of
from phalanx_telemetry import log, metrics, refused, tracer, warn
from phalanx_telemetry.prom import REGISTRY

__all__ = ["Config", "Placement", "run"]

DURABLE = "placement"
class Placement:
    """The scheduling cycle and the commands' dispatch; what a decision comes to is sent by
    ``commits``, preemption is ``preemptions``', releases and adoptions ``holdings``'."""

    def __init__(self, bus: Bus, cache: ClusterCache, config: Config) -> None:
        self.bus = bus
        self.cache = cache
        self.config = config
        self.queue = RequestQueue()
        self.profiles = {req: default_profile(require_node_state=req) for req in (False, True)}
        self.queues = PlacementQueues(cache)
        self.probes = Probes(cache, self.queues, ProbeBudget(share=config.whatif_share, burst_s=config.whatif_burst_s,
                                                             gang_s=config.whatif_gang_s))
        self.gauges = Gauges(cache, config)
        self.replica = sender_id()
        self.answers = BatchSender(bus, S.placement_answers_subject(self.replica), self.replica)
        self.commits = Commits(bus, cache, config, self.gauges, self.queue, self.answers)
        self.preemptions = Preemptions(cache, self.queues, config, lambda: self.profile, self.commits.rewrite,
                                       self.answers.send)
        self.holdings = Holdings(bus, cache, config, self.queues, self.commits.write, self.commits.rewrite,
                                 self.answers)
        self.nominations = Nominations(bus, cache, config, self.holdings, self.commits.rewrite, self.answers)
        self.recorder = Recorder(bus, cache.cluster, enabled=config.record_decisions,
                                 base_every_s=config.record_base_every_s, replica=self.replica)

    @property
    def profile(self):
        """The engine profile for the next decision (nodes without state refused or not)."""
        return self.profiles[self._node_state_required]

    @property
    def _node_state_required(self) -> bool:
        states = self.cache.node_states
        return states.required() if states is not None else False

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case PlaceRequested():
                record = self.cache.gang(event.gang_id)
                await self.queue.submit(event, record.priority if isinstance(record, GangState) else 0,
                                        otel_context.get_current())
            case ReleaseRequested():
                await self.holdings.on_release(event)
            case AdoptRequested():
                await self.holdings.on_adopt(event)
            case EvictionRefused():
                await self.preemptions.on_eviction_refused(event)
            case _:
                warn("unexpected event on placement subject", kind=type(event).__name__)

    def _members(self, ev: PlaceRequested) -> tuple[MemberSpec, ...]:
        """The members the gang's record says its current attempt places (for the cycle's order;
        the check decides whether the request is for them)."""
        record = self.cache.gang(ev.gang_id)
        return attempt_members(record) if isinstance(record, GangState) else ()

    def _checked(self, ev: PlaceRequested) -> GangState | checks.Refusal:
        """The gang's record from the mirror, or why the request is refused."""
        record = self.cache.gang(ev.gang_id)
        if isinstance(record, Poisoned):
            return checks.Refusal(R.UNREADABLE_RECORD, f"{S.KV_GANGS}/{record.key} "
                                                       f"(revision {record.revision}): {record.error}")
        return checks.check_request(record, ev) or record

    async def _records(self, batch: list[Waiting]) -> list[GangState | checks.Refusal | TemporaryError]:
        """Each request's record and verdict; if any is refused, the mirror may be behind the
        command (gang-coordinator writes the record, then sends it): one catch-up from the
        watch for the whole cycle, and those are checked once more."""
        out: list = [self._checked(w.ev) for w in batch]
        if any(isinstance(r, checks.Refusal) for r in out):
            try:
                await self.cache.gangs.catch_up()
            except Exception as e:  # noqa: BLE001 - the bus is away (a stream leader election): retried later
                warn("gang records not caught up; those requests are retried", error=repr(e)[:300])
                return [TemporaryError(f"gang {w.ev.gang_id}: its record could not be caught up: {e!r}"[:500],
                                       delay=1.0) if isinstance(r, checks.Refusal) else r
                        for w, r in zip(batch, out, strict=True)]
            out = [self._checked(w.ev) if isinstance(r, checks.Refusal) else r for w, r in zip(batch, out, strict=True)]
        return out

    async def _pools_caught_up(self) -> None:
        """gang-coordinator writes the DRA pools it has seen before it asks for a gang with
        claims: the mirror reads everything written up to now before such a gang is decided, so
        devices another scheduler allocated just before are not given again (docs/dra.md,
        "Limits")."""
        try:
            await self.cache.pools.mirror.catch_up()
        except Exception as e:  # noqa: BLE001 - the bus is away: decide on what the mirror has
            warn("dra pools not caught up", error=repr(e)[:300])

    # -- the scheduling cycle ------------------------------------------------------------------
    async def run_cycles(self) -> None:
        """Take what waits (bounded, by priority then arrival), decide one request after the
        other on the cache (each decision assumed before the next), commit per gang, pipelined."""
        async with anyio.create_task_group() as tg:
            while True:
                batch = await self.queue.take(self.config.cycle_max, rank=lambda w: self.queues.rank_of(self._members(w.ev)))
                records = await self._records(batch)
                if any(isinstance(r, GangState) and any(m.claims for m in r.members) for r in records):
                    await self._pools_caught_up()
                self.cache.refresh()
                self.queues.begin_cycle()
                for w, record in zip(batch, records, strict=True):
                    if isinstance(record, TemporaryError):
                        w.finish(record)  # redelivered: nothing was decided
                        continue
                    if isinstance(record, checks.Refusal):
                        refused(record.rule, record.why, gang=w.ev.gang_id, attempt=w.ev.attempt,
                                command="placement.place")
                        w.finish()
                        continue
                    w.members = attempt_members(record)
                    outcome = self._decide(w, record)
                    if isinstance(outcome, Decided):
                        tg.start_soon(self.commits.commit, w, outcome)
                    elif isinstance(outcome, Reply):
                        tg.start_soon(self.commits.reply, w, outcome.event, outcome.evict)
                    else:
                        refused(outcome.rule, outcome.why, gang=w.ev.gang_id, attempt=w.ev.attempt,
                                command="placement.place")
                        w.finish()
                self.recorder.flush()

    def _decide(self, w: Waiting, record: GangState) -> Decided | Reply | checks.Refusal:
        """One request on the cache, synchronously: the committed answer again, a refusal, a
        no-fit reply, or a decision assumed into the cache (its ``Commit``)."""
        ev, members = w.ev, w.members
        existing = self._existing(ev, members)
        if existing is not None:
            log("placement already committed, replying again", gang=ev.gang_id, attempt=ev.attempt)
            return Reply(Reserved(gang_id=ev.gang_id, attempt=ev.attempt, members_digest=ev.members_digest))
        refusal = checks.check_decide(record)
        if refusal is not None:
            return refusal
        running = _running(record)
        queue = queue_of(members)
        scope = confinement(record, self.cache.cluster)
        with self.cache.excluding(ev.gang_id, running):
            # Other queues' spare capacity for repairs (docs/queues.md): left alone by this
            # gang, its preemption plans too, unless it is a repair attempt.
            kept = {} if scope is not None and scope.required else spare.kept_from(
                queue, self.cache.cluster, self.preemptions.ledgers(), self.queues.tree(), self.cache.queue_units)
        avoid = frozenset(record.avoid_nodes) | kept.keys()
        blocked = self.queues.refusal(ev.gang_id, members, running)
        if blocked:
            # Over a limit (not an invalid queue), it may preempt its own queue's gangs of lower
            # priority to get under it: the planner counts the victims' units off the limit.
            preempted = None
            with self.cache.excluding(ev.gang_id, running):
                self._record(ev, members, record.avoid_nodes, None, self.queues.recorded(
                    ev.gang_id, members, running, refusal=blocked))
                if not self.queues.tree().problem(queue):
                    preempted, logged = self.preemptions.plan(ev, record, members, queue, avoid=avoid)
                    self.recorder.planned(logged)
            if isinstance(preempted, Decided | Reply):
                return preempted
            log("queue refuses", gang=ev.gang_id, attempt=ev.attempt, queue=queue, reason=blocked)
            metrics.QUEUE_REFUSALS.inc(queue=queue)
            summary, retry_at = _later(blocked, preempted)
            return Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=summary, reasons={blocked: 1},
                                          fits_empty_cluster=False, members=tuple(m.pod for m in members),
                                          waits_for="queue", retry_at=retry_at,
                                          whatif=self._whatif(ev.gang_id, members, record, blocked, running,
                                                              preempt=preempted)))
        borrows = self.queues.borrowing(members, ev.gang_id, running)
        if borrows:
            owed = self.queues.owed_now(queue, lambda members: isinstance(
                decide(self.cache.cluster, members, self.profile, explain=False), Decision))
            if owed:
                why = queueorder.borrow_reason(queue, owed)
                self._record(ev, members, record.avoid_nodes, None, self.queues.recorded(
                    ev.gang_id, members, running, refusal="", borrowing=True, owed=owed))
                log("borrowing held for a queue below its quota", gang=ev.gang_id, queue=queue, owed=",".join(owed))
                return Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=why, reasons={why: 1},
                                              fits_empty_cluster=False, members=tuple(m.pod for m in members),
                                              waits_for="gpus",
                                              whatif=self._whatif(ev.gang_id, members, record, why, running, owed)))
        with tracer().start_as_current_span("placement.decide", context=w.context, attributes={
                "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt, "phalanx.queue": queue,
                "phalanx.members": len(members), "phalanx.scope": scope.where if scope else ""}) as span:
            started = time.perf_counter()
            with self.cache.excluding(ev.gang_id, running):
                result = decide_within(self.cache.cluster, members, self.profile, avoid=avoid,
                                       inside=scope.inside if scope else None, required=bool(scope and scope.required))
                elapsed = time.perf_counter() - started
                # The engine's answer as it gave it (a replay decides it again on the same nodes),
                # then what the reason adds: the repair's domain, the reserves kept.
                self._record(ev, members, avoid, result, self.queues.recorded(
                    ev.gang_id, members, running, refusal="", borrowing=borrows), scope=scope)
                if scope is not None and scope.required and isinstance(result, NoFit):
                    result = dataclasses.replace(result, detail=scope.no_room(result.detail, len(members)))
                if kept and isinstance(result, NoFit):
                    detail = spare.kept_detail(kept, self.queues.tree())
                    result = dataclasses.replace(result, detail=f"{result.detail}; {detail}" if result.detail else detail)
                preempted = None
                if isinstance(result, NoFit):
                    preempted, logged = self.preemptions.plan(ev, record, members, queue, avoid=avoid)
                    self.recorder.planned(logged)
            _annotate_decision(span, result)
        metrics.PLACEMENT_DECISION_SECONDS.observe(elapsed, outcome="no_fit" if isinstance(result, NoFit) else "placed")
        _report_node_errors(result.node_errors)
        if isinstance(preempted, Decided | Reply):
            return preempted
        if isinstance(result, NoFit):
            log("no fit", gang=ev.gang_id, attempt=ev.attempt, reason=result.summary, ms=round(elapsed * 1000, 3))
            # Could it fit were the whole cluster empty (the statuses say: only busy nodes kept it
            # out), and where? Those nodes are what the fairness gate keeps for this gang should
            # it starve (docs/saga.md, backfill).
            empty = decide(self.cache.empty, members, self.profile) if result.resolvable else None
            fits = isinstance(empty, Decision)
            summary, retry_at = _later(result.summary, preempted)
            return Reply(PlacementFailed(
                gang_id=ev.gang_id, attempt=ev.attempt, summary=summary, reasons=dict(result.reasons),
                fits_empty_cluster=fits, members=tuple(m.pod for m in members), waits_for="gpus" if fits else "cluster",
                retry_at=retry_at, reserve_nodes=tuple(sorted({a.node for a in empty.assignments})) if fits else (),
                whatif=self._whatif(ev.gang_id, members, record, result.summary, running, preempt=preempted)))
        if any(m.claims for m in members):
            # Claims' GPUs are known only now: the limit is checked again on what was given.
            over = self.queues.refusal(ev.gang_id, members, running,
                                       placed=sum(units_of_assignment(a) for a in result.assignments))
            if over:
                log("queue refuses", gang=ev.gang_id, attempt=ev.attempt, queue=queue, reason=over)
                metrics.QUEUE_REFUSALS.inc(queue=queue)
                return Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=over, reasons={over: 1},
                                              fits_empty_cluster=False, members=tuple(m.pod for m in members),
                                              waits_for="queue"))
        log("decided", level=10, gang=ev.gang_id, attempt=ev.attempt, ms=round(elapsed * 1000, 3))
        writes: dict = self._ledgers_after(ev.gang_id, ev.attempt, members, result, running, self.queues.chain(members))
        writes.update(self.queues.usage_writes(ev.gang_id, writes))
        return Decided(self.cache.assume(writes), result)

    def _record(self, ev: PlaceRequested, members: tuple[MemberSpec, ...], avoid, result: Decision | NoFit | None,
                gate, scope: Scope | None = None) -> None:
        """Log the decision (``recorder``): the engine's answer, or none when the queue refused
        first, what the queue rules read and said, and the nodes it was confined to or tried
        first (``scope``), so that a replay decides it on the same nodes."""
        self.recorder.decided(ev.gang_id, ev.attempt, members, node_state_required=self._node_state_required,
                              avoid=avoid, result=result, queue=gate,
                              within=scope.inside if scope is not None else frozenset(),
                              within_required=scope is not None and scope.required)

    def _whatif(self, gang_id: str, members: tuple[MemberSpec, ...], record: GangState, refusal: str,
                running: frozenset[str], owed: tuple[str, ...] = (), preempt: Relaxed | None = None) -> WhatIf | None:
        """What would start the gang, on the view its decision refused (``whatif.Probes``)."""
        with self.cache.excluding(gang_id, running):
            return self.probes.answer(gang_id, members, self.cache.cluster, self.profile, refusal=refusal,
                                      avoid=frozenset(record.avoid_nodes), keep=running, owed=owed, preempt=preempt)

    def _ledgers_after(self, gang_id: str, attempt: int, members: tuple[MemberSpec, ...], decision: Decision,
                       running: frozenset[str] = frozenset(), queues: tuple[str, ...] = ()) -> dict[str, NodeLedger]:
        """Every touched node's new ledger: the gang's earlier reservations (and any of these
        members') replaced by the decision's, but those of its ``running`` members kept. The new
        reservations are charged to ``queues`` (the gang's queue and its ancestors)."""
        keys = {alloc_key(m.pod) for m in members}
        by_key: dict[str, tuple[str, list]] = {}
        for a in decision.assignments:
            by_key.setdefault(S.token(a.node), (a.node, []))[1].append(a)
        for key in self.cache.gang_keys(gang_id):
            ledger = self.cache.ledger_of(key)
            if key not in by_key and ledger is not None and (any(
                    a.gang_id == gang_id and k not in running for k, a in ledger.allocations.items())
                    or any(n.gang_id == gang_id for n in ledger.nominations.values())):
                by_key[key] = (ledger.node, [])
        out = {}
        now = self.cache.clock()
        for key, (node, assignments) in by_key.items():
            ledger = self.cache.ledger_of(key) or NodeLedger(node=node)
            allocs = {k: v for k, v in ledger.allocations.items()
                      if k in running or not (v.gang_id == gang_id or k in keys)}
            for a in assignments:
                allocs[alloc_key(a.pod)] = Allocation(gang_id=gang_id, attempt=attempt, assignment=a,
                                                      queues=queues)
            # the gang's nominations end with its reservation; expired ones go on the way
            out[key] = preempting.without_nominations(NodeLedger(node=node, allocations=allocs,
                                                                 nominations=ledger.nominations), gang_id, now)
        return out

    def _existing(self, ev: PlaceRequested, members: tuple[MemberSpec, ...]) -> tuple | None:
        """The assignments already committed for exactly this gang attempt, if all are there."""
        found = {}
        for key in self.cache.gang_keys(ev.gang_id):
            for alloc in (self.cache.ledger_of(key) or NodeLedger(node="")).allocations.values():
                if alloc.gang_id == ev.gang_id and alloc.attempt == ev.attempt:
                    found[alloc_key(alloc.assignment.pod)] = alloc.assignment
        wanted = [alloc_key(m.pod) for m in members]
        if wanted and all(k in found for k in wanted):
            return tuple(found[k] for k in wanted)
        return None



def _report_node_errors(errors: tuple[tuple[str, str], ...]) -> None:
    """Log and count the nodes a plugin raised on in a decision (each was refused alone)."""
    for node, error in errors:
        metrics.ENGINE_NODE_ERRORS.inc()
        warn("node could not be evaluated; refused for this decision", node=node, error=error)


def _annotate_decision(span, result) -> None:
    """Span attributes of a decision: where it went, or why nothing fits."""
    if isinstance(result, NoFit):
        span.set_attribute("phalanx.outcome", "no_fit")
        span.set_attribute("phalanx.failure_reason", result.summary)
        return
    span.set_attribute("phalanx.outcome", "placed")
    span.set_attribute("k8s.node.name", sorted({a.node for a in result.assignments}))
    span.set_attribute("phalanx.gpus", [f"{a.node}:{','.join(map(str, a.gpus))}" for a in result.assignments])
    levels = sorted({a.rdma_level for a in result.assignments if a.rdma_level})
    if levels:
        span.set_attribute("phalanx.rdma_level", levels)


async def run(bus: Bus, config: Config, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run placement until cancelled; ready once its cache is listed and its durable consumer is live."""
    await enable_atomic(bus, S.KV_LEDGER)
    cache = ClusterCache(bus, stale_s=config.heartbeat_stale_s,
                         node_state_policy=config.node_state, node_state_grace_s=config.node_state_grace_s)
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        placement = Placement(bus, cache, config)
        tg.start_soon(placement.run_cycles)
        tg.start_soon(placement.holdings.audit_usage)
        tg.start_soon(placement.nominations.run)
        tg.start_soon(UsageHistory(bus, cache, placement.queues, config).run)
        tg.start_soon(placement.recorder.run)
        await tg.start(placement.answers.run)
        stop_collecting = REGISTRY.collect_on_render(placement.gauges.collect)
        try:
            await consume(bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE,
                          filter_subject=S.CONSUMER[DURABLE].filter, decoder=gang_decoder,
                          handler=placement.on_command, concurrency=config.cycle_max, task_status=task_status)
        finally:
            stop_collecting()


def _later(summary: str, preempted) -> tuple[str, float]:
    """The refusal's summary and the time to try again: when the preemption it needs waits for
    its victims' minimum runtime (``Relaxed.retry_at``), the summary says until when (the pods'
    reason, ``phalanx explain``) and the gang is tried again then (``PlacementFailed.retry_at``)."""
    if isinstance(preempted, Relaxed) and preempted.retry_at:
        return f"{summary.removesuffix('.')}; {preempted.why_not}", preempted.retry_at
    return summary, 0.0


def _running(record: GangState) -> frozenset[str]:
    """The allocation keys of the gang's members bound by earlier attempts (``GangState.running``)."""
    return frozenset(alloc_key(r.pod) for r in record.running)
