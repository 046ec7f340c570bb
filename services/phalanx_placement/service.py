"""placement: decides where a gang goes and reserves it in the ledger (KV ``phx-ledger``).

It decides on a watch-fed cache of ``phx-topology``, ``phx-heartbeat``, ``phx-node-state``
(``nodestate.py``), ``phx-ledger`` and ``phx-gangs`` (``cache.py``): no request reads a bucket. ``PlaceRequested`` commands wait
in a queue (``queue.py``); a scheduling cycle takes what waits (at most ``cycle_max``),
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

Metrics: decision time, ledger conflicts, and (at most every ``metrics_every_s`` after a
commit) the GPUs, core % and memory allocated by node, model and mode plus fragmentation
(``phalanx_telemetry.allocation``), and every ``metrics_every_s`` the fresh and stale nodes
it holds (``phalanx_placement_nodes``). Spans ``placement.decide`` and ``placement.commit`` carry
the gang, attempt, nodes, GPU ids, RDMA level and the failure reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
from opentelemetry import context as otel_context

from phalanx_bus import (
    Bus,
    Delivery,
    KvConflict,
    Poisoned,
    TemporaryError,
    consume,
    enable_atomic,
    kv_atomic_write,
)
from phalanx_engine.decide import decide, default_profile
from phalanx_engine.framework import NODE_ERRORS
from phalanx_engine.preempt import NoPlan, Plan, plan_preemption
from phalanx_engine.queues import usage_drift
from phalanx_engine.snapshot import Decision, NoFit
from phalanx_placement import checks, preempting, testhooks
from phalanx_placement.cache import ClusterCache, Commit
from phalanx_placement.nodestate import GRACE_S, POLICIES, NodeStates
from phalanx_placement.queue import RequestQueue, Waiting
from phalanx_placement.queues import PlacementQueues, queue_of
from phalanx_placement.whatif import ProbeBudget, Probes, Relaxed
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    AdoptRequested,
    EvictionRefused,
    EvictPods,
    MemberSpec,
    PlacementFailed,
    PlaceRequested,
    Released,
    ReleaseRequested,
    Reserved,
    WhatIf,
    gang_decoder,
)
from phalanx_proto.queues import GPU_UNITS, QueueUsage, shown, usage_key
from phalanx_proto.state import Allocation, GangState, NodeLedger, alloc_key, attempt_members
from phalanx_proto.vocab import RefusalRule as R
from phalanx_service.config import option
from phalanx_telemetry import allocation, log, metrics, refused, tracer, warn

DURABLE = "placement"
RELEASE_RETRY_S = 2.0
"""How soon a release held back under running pods is tried again."""


@dataclass(frozen=True)
class Config:
    """placement's configuration; the fields with a flag are ``phalanx run placement``'s
    (``phalanx_service.config``)."""

    heartbeat_stale_s: float = option(15.0, "a node whose topology heartbeat is older than this is unavailable")
    max_commit_retries: int = 20
    node_state: str = option("auto", "when a node whose agent has not reported its Kubernetes state takes "
                             "nothing: 'auto' once reports have flowed for --node-state-grace-s, always "
                             "('required'), or never ('optional') (docs/placement.md)", choices=POLICIES)
    node_state_grace_s: float = option(GRACE_S, "seconds of reports before 'auto' refuses unreported nodes")
    cycle_max: int = 64
    """Requests decided in one scheduling cycle at most (and handlers waiting for one)."""
    usage_audit_s: float = 10.0
    """Seconds between audits of the queues' usage against the ledger (``audit_usage``)."""
    whatif_share: float = option(0.03, "share of placement's time the counterfactual probes of gangs that do not "
                                 "fit may take, at most (0: no probes; docs/whatif.md)")
    whatif_burst_s: float = 0.05
    """Seconds of probing saved up at most (``whatif.ProbeBudget``)."""
    whatif_gang_s: float = 0.02
    """Seconds one gang's probes may take at most."""
    nomination_s: float = option(120.0, "seconds a preemptor's nomination keeps the GPUs its victims free for it "
                                 "(docs/preemption.md); then it is dropped and the planner chooses again")
    metrics_every_s: float = 5.0
    """Allocation gauges are recomputed (a pass over every node) at most this often: half the
    10 s scrape interval of ``deploy/prometheus``, so each scrape sees a fresh value."""


@dataclass(frozen=True, slots=True)
class _Reply:
    """A decision's outcome that needs no ledger write; ``evict``: a nomination's eviction sent
    again first (``_preempt``)."""

    event: object
    evict: EvictPods | None = None


@dataclass(frozen=True, slots=True)
class _Decided:
    """A decision assumed into the cache, to be committed; for a preemption, the nominations
    (``commit``), then ``evict`` to binder and ``reply`` (pending, naming the victims)."""

    commit: Commit
    decision: Decision
    evict: EvictPods | None = None
    reply: PlacementFailed | None = None
    plan: Plan | None = None


class Placement:
    def __init__(self, bus: Bus, cache: ClusterCache, config: Config) -> None:
        self.bus = bus
        self.cache = cache
        self.config = config
        self.conflicts = 0
        self.queue = RequestQueue()
        self.profiles = {req: default_profile(require_node_state=req) for req in (False, True)}
        self.queues = PlacementQueues(cache)
        self.probes = Probes(cache, self.queues, ProbeBudget(share=config.whatif_share, burst_s=config.whatif_burst_s,
                                                             gang_s=config.whatif_gang_s))
        self._recorded_at = 0.0
        self._allocation_stale = True
        self._refused: dict[str, dict[str, float]] = {}
        """Preemptor → victim gangs whose eviction was refused for it, until when they are left
        out of its plans (``on_eviction_refused``)."""

    @property
    def profile(self):
        """The engine profile for the next decision (nodes without state refused or not)."""
        states = self.cache.node_states
        return self.profiles[states.required() if states is not None else False]

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case PlaceRequested():
                record = self.cache.gang(event.gang_id)
                await self.queue.submit(event, record.priority if isinstance(record, GangState) else 0,
                                        otel_context.get_current())
            case ReleaseRequested():
                await self.on_release(event)
            case AdoptRequested():
                await self.on_adopt(event)
            case EvictionRefused():
                await self.on_eviction_refused(event)
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

    async def _records(self, batch: list[Waiting]) -> list[GangState | checks.Refusal]:
        """Each request's record and verdict; if any is refused, the mirror may be behind the
        command (gang-coordinator writes the record, then sends it): one catch-up from the
        watch for the whole cycle, and those are checked once more."""
        out = [self._checked(w.ev) for w in batch]
        if any(isinstance(r, checks.Refusal) for r in out):
            await self.cache.gangs.catch_up()
            out = [self._checked(w.ev) if isinstance(r, checks.Refusal) else r for w, r in zip(batch, out, strict=True)]
        return out

    # -- the scheduling cycle ------------------------------------------------------------------
    async def run_cycles(self) -> None:
        """Take what waits (bounded, by priority then arrival), decide one request after the
        other on the cache (each decision assumed before the next), commit per gang, pipelined."""
        async with anyio.create_task_group() as tg:
            while True:
                batch = await self.queue.take(self.config.cycle_max, rank=lambda w: self.queues.rank_of(self._members(w.ev)))
                records = await self._records(batch)
                self.cache.refresh()
                self.queues.begin_cycle()
                for w, record in zip(batch, records, strict=True):
                    if isinstance(record, checks.Refusal):
                        refused(record.rule, record.why, gang=w.ev.gang_id, attempt=w.ev.attempt,
                                command="placement.place")
                        w.finish()
                        continue
                    w.members = attempt_members(record)
                    outcome = self._decide(w, record)
                    if isinstance(outcome, _Decided):
                        tg.start_soon(self._commit_request, w, outcome)
                    elif isinstance(outcome, _Reply):
                        tg.start_soon(self._reply, w, outcome.event, outcome.evict)
                    else:
                        refused(outcome.rule, outcome.why, gang=w.ev.gang_id, attempt=w.ev.attempt,
                                command="placement.place")
                        w.finish()

    def _decide(self, w: Waiting, record: GangState) -> _Decided | _Reply | checks.Refusal:
        """One request on the cache, synchronously: the committed answer again, a refusal, a
        no-fit reply, or a decision assumed into the cache (its ``Commit``)."""
        ev, members = w.ev, w.members
        existing = self._existing(ev, members)
        if existing is not None:
            log("placement already committed, replying again", gang=ev.gang_id, attempt=ev.attempt)
            return _Reply(Reserved(gang_id=ev.gang_id, attempt=ev.attempt, members_digest=ev.members_digest))
        refusal = checks.check_decide(record)
        if refusal is not None:
            return refusal
        running = _running(record)
        queue = queue_of(members)
        blocked = self.queues.refusal(ev.gang_id, members, running)
        if blocked:
            # Over a limit (not an invalid queue), it may preempt its own queue's gangs of lower
            # priority to get under it: the planner counts the victims' units off the limit.
            preempted = None
            if not self.queues.tree().problem(queue):
                with self.cache.excluding(ev.gang_id, running):
                    preempted = self._preempt(ev, record, members, queue)
            if isinstance(preempted, _Decided | _Reply):
                return preempted
            log("queue refuses", gang=ev.gang_id, attempt=ev.attempt, queue=queue, reason=blocked)
            metrics.QUEUE_REFUSALS.inc(queue=queue)
            return _Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=blocked, reasons={blocked: 1},
                                          fits_empty_cluster=False, members=tuple(m.pod for m in members),
                                          whatif=self._whatif(ev.gang_id, members, record, blocked, running,
                                                              preempt=preempted)))
        if self.queues.borrowing(members, ev.gang_id, running):
            owed = self.queues.owed_now(queue, lambda members: isinstance(
                decide(self.cache.cluster, members, self.profile, explain=False), Decision))
            if owed:
                why = (f"queue {queue} would borrow beyond its quota, and the GPUs free now are kept for queue(s) "
                       f"{', '.join(owed)}, below quota, whose gangs wait for them")
                log("borrowing held for a queue below its quota", gang=ev.gang_id, queue=queue, owed=",".join(owed))
                return _Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=why, reasons={why: 1},
                                              fits_empty_cluster=False, members=tuple(m.pod for m in members),
                                              whatif=self._whatif(ev.gang_id, members, record, why, running, owed)))
        avoid = record.avoid_nodes
        with tracer().start_as_current_span("placement.decide", context=w.context, attributes={
                "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt, "phalanx.queue": queue,
                "phalanx.members": len(members)}) as span:
            started = time.perf_counter()
            with self.cache.excluding(ev.gang_id, running):
                result = decide(self.cache.cluster, members, self.profile, avoid=avoid)
                elapsed = time.perf_counter() - started
                preempted = self._preempt(ev, record, members, queue) if isinstance(result, NoFit) else None
            _annotate_decision(span, result)
        metrics.PLACEMENT_DECISION_SECONDS.observe(elapsed, outcome="no_fit" if isinstance(result, NoFit) else "placed")
        _report_node_errors()
        if isinstance(preempted, _Decided | _Reply):
            return preempted
        if isinstance(result, NoFit):
            log("no fit", gang=ev.gang_id, attempt=ev.attempt, reason=result.summary, ms=round(elapsed * 1000, 3))
            # Could it fit were the whole cluster empty (the statuses say: only busy nodes kept it
            # out), and where? Those nodes are what the fairness gate keeps for this gang should
            # it starve (docs/saga.md, backfill).
            empty = decide(self.cache.empty, members, self.profile) if result.resolvable else None
            fits = isinstance(empty, Decision)
            return _Reply(PlacementFailed(
                gang_id=ev.gang_id, attempt=ev.attempt, summary=result.summary, reasons=dict(result.reasons),
                fits_empty_cluster=fits, members=tuple(m.pod for m in members),
                reserve_nodes=tuple(sorted({a.node for a in empty.assignments})) if fits else (),
                whatif=self._whatif(ev.gang_id, members, record, result.summary, running, preempt=preempted)))
        log("decided", level=10, gang=ev.gang_id, attempt=ev.attempt, ms=round(elapsed * 1000, 3))
        writes: dict = self._ledgers_after(ev.gang_id, ev.attempt, members, result, running, self.queues.chain(members))
        writes.update(self.queues.usage_writes(ev.gang_id, writes))
        return _Decided(self.cache.assume(writes), result)

    def _whatif(self, gang_id: str, members: tuple[MemberSpec, ...], record: GangState, refusal: str,
                running: frozenset[str], owed: tuple[str, ...] = (), preempt: Relaxed | None = None) -> WhatIf | None:
        """What would start the gang, on the view its decision refused (``whatif.Probes``)."""
        with self.cache.excluding(gang_id, running):
            return self.probes.answer(gang_id, members, self.cache.cluster, self.profile, refusal=refusal,
                                      avoid=frozenset(record.avoid_nodes), keep=running, owed=owed, preempt=preempt)

    def _ledgers(self) -> list[NodeLedger]:
        """Every node's ledger as the cache believes it (assumed commits included)."""
        return [led for key in self.cache.views if (led := self.cache.ledger_of(key)) is not None]

    def _preempt(self, ev: PlaceRequested, record: GangState, members: tuple[MemberSpec, ...],
                 queue: str) -> _Decided | _Reply | Relaxed | None:
        """A gang that does not fit: wait for the victims its nomination names, or plan a
        preemption (``phalanx_engine.preempt``) on the cluster without the gang's own
        reservations and nominations (the caller's ``excluding``). Otherwise no preemption
        helps (the caller answers the engine's reason): the preempt probe's planner, which says
        which victims the refusing rules kept it from (``whatif.Relaxed``), or None."""
        now = self.cache.clock()
        ledgers = self._ledgers()
        own = preempting.nominations(ledgers, ev.gang_id, now)
        holding = sorted({v for n in own for v in n.victims if self._holds(v)})
        if own and holding:
            # The eviction goes again with every wait: a placement that stopped between writing
            # the nomination and sending it (or a send that failed) is finished by the next
            # attempt. Its message id is the first one's, so within the stream's window it is
            # dropped; after it, binder evicts only pods still there.
            latest = max(n.attempt for n in own)
            named = sorted({v for n in own if n.attempt == latest for v in n.victims})
            reply = self._pending(ev, members, preempting.waiting_reason(own, holding),
                                  sorted({n.assignment.node for n in own}))
            return _Reply(reply.event, evict=EvictPods(gang_id=ev.gang_id, attempt=latest, victims=tuple(named)))
        preemptor = preempting.preemptor_of(ev.gang_id, members, queue)
        if isinstance(preemptor, str):
            log("preemption refused", gang=ev.gang_id, attempt=ev.attempt, reason=preemptor)
            return None
        refused = {g for g, until in self._refused.get(ev.gang_id, {}).items() if until > now}
        running = preempting.candidates(ledgers, self._record, ev.gang_id, now, refused)
        plan = plan_preemption(self.cache.cluster, preemptor, running, self.queues.tree(),
                               held_by=dict(self.cache.queue_units), profile=self.profile,
                               avoid=record.avoid_nodes, now=now)
        if isinstance(plan, NoPlan) or not plan.victims:
            log("no preemption", gang=ev.gang_id, attempt=ev.attempt,
                reason=plan.reason if isinstance(plan, NoPlan) else "the planner placed it without victims")
            if not isinstance(plan, NoPlan) or plan.code in ("queue-problem", "search-bound"):
                return None
            return Relaxed(preemptor, running, self.queues.tree(), dict(self.cache.queue_units), plan.reason,
                           avoid=frozenset(record.avoid_nodes), profile=self.profile, now=now)
        writes = preempting.nominate(self.cache.ledger_of, S.token, self.cache.gang_keys(ev.gang_id), ev.gang_id,
                                     ev.attempt, plan, preemptor, expires_at=now + self.config.nomination_s, now=now)
        reason = preempting.preempting_reason(plan)
        log("preempting", gang=ev.gang_id, attempt=ev.attempt, reason=reason,
            victims=",".join(v.gang_id for v in plan.victims), gpus=shown(plan.units))
        reply = self._pending(ev, members, reason, sorted({a.node for a in plan.placement.assignments})).event
        return _Decided(self.cache.assume(writes), plan.placement, plan=plan, reply=reply,
                        evict=EvictPods(gang_id=ev.gang_id, attempt=ev.attempt,
                                        victims=tuple(v.gang_id for v in plan.victims)))

    def _holds(self, gang_id: str) -> bool:
        """The gang still holds a reservation somewhere."""
        return any(a.gang_id == gang_id for k in self.cache.gang_keys(gang_id)
                   for a in (self.cache.ledger_of(k) or NodeLedger(node="")).allocations.values())

    def _record(self, gang_id: str) -> GangState | None:
        record = self.cache.gang(gang_id)
        return record if isinstance(record, GangState) else None

    @staticmethod
    def _pending(ev: PlaceRequested, members: tuple[MemberSpec, ...], reason: str, nodes: list[str]) -> _Reply:
        return _Reply(PlacementFailed(gang_id=ev.gang_id, attempt=ev.attempt, summary=reason, reasons={reason: 1},
                                      fits_empty_cluster=True, members=tuple(m.pod for m in members),
                                      reserve_nodes=tuple(nodes)))

    async def on_eviction_refused(self, ev: EvictionRefused) -> None:
        """binder could not evict a victim of ``ev.gang_id``'s nomination (a disruption budget):
        drop the gang's nominations, and leave those victims out of its plans for
        ``nomination_s`` so the planner chooses others, or the gang waits with the reason. Only
        for a nomination the ledger holds for this attempt naming those victims."""
        now = self.cache.clock()
        own = [n for n in preempting.nominations(self._ledgers(), ev.gang_id, now) if n.attempt == ev.attempt]
        named = {v for n in own for v in n.victims}
        victims = [v for v in ev.victims if v in named]
        if not victims:
            refused(R.NOT_RECORDED, f"no nomination of gang {ev.gang_id} attempt {ev.attempt} names "
                                    f"{', '.join(ev.victims[:5]) or 'these victims'}", gang=ev.gang_id,
                    attempt=ev.attempt, command="eviction_refused")
            return
        self._refused.setdefault(ev.gang_id, {}).update({v: now + self.config.nomination_s for v in victims})
        self._refused = {g: left for g, vs in self._refused.items() if (left := {v: t for v, t in vs.items() if t > now})}
        for _ in range(self.config.max_commit_retries):
            writes = {}
            for key in self.cache.gang_keys(ev.gang_id):
                ledger = self.cache.ledger_of(key)
                if ledger is not None and (new := preempting.without_nominations(ledger, ev.gang_id, now)) != ledger:
                    writes[key] = new
            try:
                if writes:
                    await self._write(self.cache.assume(writes))
                break
            except KvConflict:
                await self.cache.catch_up()
        else:
            raise TemporaryError(f"gang {ev.gang_id}: ledger kept changing while dropping its nomination", delay=0.5)
        metrics.PREEMPTIONS_REFUSED.inc()
        warn("eviction refused, nomination dropped", gang=ev.gang_id, attempt=ev.attempt,
             victims=",".join(victims), reason=ev.reason)

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

    async def _reply(self, w: Waiting, event, evict: EvictPods | None = None) -> None:
        token = otel_context.attach(w.context) if w.context is not None else None
        try:
            if evict is not None:
                await self.bus.publish(S.evict_subject(evict.gang_id), evict)
            await self.bus.publish(S.placement_reply_subject(w.ev.gang_id), event)
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which retries the message
            w.finish(e)
            return
        finally:
            if token is not None:
                otel_context.detach(token)
        w.finish()

    async def _commit_request(self, w: Waiting, decided: _Decided) -> None:
        token = otel_context.attach(w.context) if w.context is not None else None
        try:
            await self._commit_traced(w, decided)
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _commit_traced(self, w: Waiting, decided: _Decided) -> None:
        ev, commit, placed = w.ev, decided.commit, decided.decision.assignments
        try:
            with tracer().start_as_current_span("placement.commit", attributes={
                    "phalanx.gang": ev.gang_id, "phalanx.attempt": ev.attempt,
                    "k8s.node.name": sorted(led.node for led in commit.writes.values()
                                            if isinstance(led, NodeLedger))}) as span:
                if testhooks.DECIDE_DELAY_S:
                    await anyio.sleep(testhooks.DECIDE_DELAY_S)
                try:
                    await self._write(commit)
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
                self.queue.put(w)
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
            await self._reply(w, decided.reply)
            return
        log("reserved", gang=ev.gang_id, attempt=ev.attempt,
            assignments=";".join(f"{a.pod}@{a.node}:{','.join(map(str, a.gpus))}" for a in placed),
            unchecked_nodes=",".join(decided.decision.unchecked))
        await self._reply(w, Reserved(gang_id=ev.gang_id, attempt=ev.attempt, members_digest=ev.members_digest))

    async def _write(self, commit: Commit) -> None:
        """Send the commit's atomic batch: all nodes or none, each expecting the revision its
        decision read; the cache learns the outcome either way."""
        try:
            last = await kv_atomic_write(self.bus, S.KV_LEDGER, await self.cache.expected(commit))
        except BaseException:
            self.cache.forget(commit)
            raise
        self.cache.settle(commit, last)
        self._allocation_stale = True
        self.record_allocation(force=False)

    # -- release and adoption ------------------------------------------------------------------
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
        for _ in range(self.config.max_commit_retries):
            released, writes, held = 0, {}, []
            for key in self.cache.gang_keys(ev.gang_id):
                ledger = self.cache.ledger_of(key)
                if ledger is None:
                    continue
                out = checks.release(ledger, ev, self._running(ledger.node))
                held += out.held
                if out.ledger is not None:
                    released += len(ledger.allocations) - len(out.ledger.allocations)
                    writes[key] = out.ledger
            writes.update(self.queues.usage_writes(ev.gang_id, writes))
            try:
                if writes:
                    await self._write(self.cache.assume(writes))
                break
            except KvConflict:
                await self.cache.catch_up()
        else:
            raise TemporaryError(f"gang {ev.gang_id}: ledger kept changing during release", delay=0.5)
        log("released", gang=ev.gang_id, attempt=ev.attempt, reason=ev.reason, allocations=released)
        if held:
            refused(R.LIVE_POD, f"{', '.join(held[:5])}: still running on the node (its agent's report), so the "
                                "reservation is kept; the release is retried", gang=ev.gang_id, attempt=ev.attempt,
                    command="release")
            raise TemporaryError(f"gang {ev.gang_id}: {len(held)} reservation(s) held under running pods",
                                 delay=RELEASE_RETRY_S)
        await self.bus.publish(S.placement_reply_subject(ev.gang_id), Released(gang_id=ev.gang_id, attempt=ev.attempt, pods=ev.pods))

    async def on_adopt(self, ev: AdoptRequested) -> None:
        """Record a reservation for a pod found bound without one, if its GPUs are free there
        (``checks.adopt``); otherwise refuse and say why (the reconciler reports the pod)."""
        node = ev.assignment.node
        key = S.token(node)
        for _ in range(self.config.max_commit_retries):
            if key in self.cache.ledger.poisoned:
                bad = self.cache.ledger.poisoned[key]
                refused(R.UNREADABLE_RECORD, f"{S.KV_LEDGER}/{key} (revision {bad.revision}): {bad.error}",
                        gang=ev.gang_id, pod=str(ev.assignment.pod))
                return
            ledger = self.cache.ledger_of(key) or NodeLedger(node=node)
            topo = self.cache.topology.get(key)
            report = topo.value if topo is not None and topo.value.node == node else None
            record = self.cache.gang(ev.gang_id)
            chain = self.queues.chain(record.members) if isinstance(record, GangState) else self.queues.chain(())
            out = checks.adopt(ledger, report.topology if report is not None else None, ev, self._running(node, None),
                               queues=chain)
            if out is None:
                return
            if isinstance(out, checks.Refusal):
                refused(out.rule, out.why, gang=ev.gang_id, pod=str(ev.assignment.pod), command="adopt")
                return
            writes: dict = {key: out}
            writes.update(self.queues.usage_writes(ev.gang_id, writes))
            try:
                await self._write(self.cache.assume(writes))
            except KvConflict:
                await self.cache.catch_up()
                continue
            warn("reservation recorded for a bound pod", gang=ev.gang_id, attempt=ev.attempt,
                 pod=str(ev.assignment.pod), node=node, gpus=",".join(map(str, ev.assignment.gpus)), reason=ev.reason)
            return
        raise TemporaryError(f"node {node}: ledger kept changing during adoption", delay=0.5)

    def _running(self, node: str, unknown=frozenset()) -> frozenset[str] | None:
        """The pods ``node``'s agent reports running there (``NodeKubeState.phalanx_pods``);
        ``unknown`` when it reports no state."""
        state = self.cache.node_states.of(node) if self.cache.node_states is not None else None
        return frozenset(state.phalanx_pods) if state is not None else unknown

    # -- queue usage audit ----------------------------------------------------------------------
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
                    await self._write(self.cache.assume({usage_key(q): fixed}))
                except Exception as e:  # noqa: BLE001 - a commit raced it: looked at again next pass
                    warn("queue usage repair not written", queue=q, error=repr(e)[:200])

    # -- allocation gauges ---------------------------------------------------------------------
    def record_allocation(self, *, force: bool) -> None:
        """Allocation gauges from the cache (a pass over every node): after a commit at most
        every ``metrics_every_s``; ``flush_allocation`` catches up the rest."""
        now = time.monotonic()
        if not force and now - self._recorded_at < self.config.metrics_every_s:
            return
        self._recorded_at, self._allocation_stale = now, False
        self.cache.refresh()
        try:
            allocation.record(allocation.NodeAllocation(node=v.name, topology=v.topology, enabled=v.enabled,
                                                        assignments=v.allocations)
                              for v in self.cache.views.values() if not v.invalid)
        except Exception as e:  # noqa: BLE001 - metrics never stop a commit or a decision
            warn("allocation metrics not computed", error=repr(e)[:300])

    async def flush_allocation(self) -> None:
        """Every ``metrics_every_s``: the allocation gauges if a commit is not yet in them, and
        how many nodes the cache holds (a node whose heartbeat went late shows without a request)."""
        while True:
            self.record_nodes()
            await anyio.sleep(self.config.metrics_every_s)
            if self._allocation_stale:
                self.record_allocation(force=True)

    def record_nodes(self) -> None:
        self.cache.refresh()
        metrics.PLACEMENT_NODES.replace(({"state": k}, n) for k, n in self.cache.node_counts().items())


def _report_node_errors() -> None:
    """Log and count the nodes a plugin raised on in the last decision (each was refused alone)."""
    while NODE_ERRORS:
        node, error = NODE_ERRORS.pop(0)
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


async def run(bus: Bus, config: Config = Config(), *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run placement until cancelled; ready once its cache is listed and its durable consumer is live."""
    await enable_atomic(bus, S.KV_LEDGER)
    cache = ClusterCache(bus, stale_s=config.heartbeat_stale_s,
                         node_states=NodeStates(bus, policy=config.node_state, grace_s=config.node_state_grace_s))
    async with anyio.create_task_group() as tg:
        await tg.start(cache.run)
        placement = Placement(bus, cache, config)
        try:
            placement.record_allocation(force=True)
        except Exception as e:  # noqa: BLE001 - metrics never stop placement from starting
            warn("allocation metrics not computed at start", error=repr(e))
        tg.start_soon(placement.run_cycles)
        tg.start_soon(placement.flush_allocation)
        tg.start_soon(placement.audit_usage)
        await consume(bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE,
                      filter_subject=S.CONSUMER[DURABLE].filter, decoder=gang_decoder, handler=placement.on_command,
                      concurrency=config.cycle_max, task_status=task_status)


def _running(record: GangState) -> frozenset[str]:
    """The allocation keys of the gang's members bound by earlier attempts (``GangState.running``)."""
    return frozenset(alloc_key(r.pod) for r in record.running)
