"""The saga driver: start attempts, take replies and deadlines, and carry out the effects.

Every handler does the same three things: check the message against the record (the gang's
state, the ledger, the cluster — docs/saga.md "Checks"), apply a pure transition by
compare-and-set (``store``, ``saga``), then carry out ``effects.entered(before, after)``. The
one exception is a ``Reserved`` without MIG: it changes no state (the ledger holds the
reservations), and its binds go out at once (docs/saga.md, "One write fewer").
State is written before the commands that follow from it are published, and every command
carries its idempotency key as ``Nats-Msg-Id``, so a crash in between only delays the gang:
resync re-drives it with the same commands (``redrive``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import msgspec
from opentelemetry import context as otel_context

from phalanx_bus import BatchSender, Bus, Delivery, KvMirror
from phalanx_bus.declare import declare_consumer
from phalanx_bus.ledger import LedgerBook
from phalanx_gang_coordinator import effects
from phalanx_gang_coordinator.compensate import Compensator
from phalanx_gang_coordinator.holdings import Holdings
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.podgroups import PodGroupBook
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_gang_coordinator.store import Change, GangStore, Transition
from phalanx_kube.port import ClusterPort
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindsDone,
    GangDeadline,
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    PlacementFailed,
    PodRef,
    Preempting,
    Released,
    ReleaseRequested,
    Reserved,
)
from phalanx_proto.state import MAX_GANG_TIMEOUT_S, GangState, NodeMig, alloc_key, attempt_members
from phalanx_proto.vocab import BOUND_WANTED, IDLE, PLACING
from phalanx_proto.vocab import RefusalRule as R
from phalanx_rules import fairness, saga
from phalanx_rules import repair as repairs
from phalanx_telemetry import log, metrics, refused, tracer, warn


class SagaDriver:
    def __init__(self, bus: Bus, cluster: ClusterPort, store: GangStore, notifier: Notifier, config,
                 queues: QueueBook | None = None, *, ledger: LedgerBook | None = None,
                 mig: KvMirror[NodeMig] | None = None,
                 gate: Callable[[GangState, float], fairness.Gate] | None = None,
                 bound_seen: dict[str, str] | None = None,
                 batched: Mapping[type, BatchSender] | None = None) -> None:
        """``gate``: the fairness gate (``heads.QueueHeads.gate``; none: never held back);
        ``bound_seen``: pod uid → the node the pod watch last showed it bound to (the intake keeps
        it); ``batched``: command type → the sender that batches it with the others sent
        meanwhile (a command without one, or with its own message id, is published alone).
        ``ledger``/``mig``: mirrors to share (None: the driver's own; None for tests)."""
        self.bus = bus
        self.ledger = ledger or LedgerBook(bus)
        """The reservations (``phx-ledger``, mirrored): the one home of every assignment."""
        self.mig = mig or KvMirror.of_bucket(bus, S.KV_MIG)
        """The MIG ownership records (``phx-mig``, mirrored): the one home of every instance."""
        self.holdings = Holdings(self.ledger, self.mig)
        self.reservations_of = self.holdings.reservations_of
        self.cluster = cluster
        self.store = store
        self.notifier = notifier
        self.config = config
        self.queues = queues
        self.groups: PodGroupBook | None = None
        """Where a gang named by a Workload API PodGroup reports its status (set by the service)."""
        self.compensator = Compensator(store, cluster, notifier, self.execute, self.reservations_of,
                                       backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s)
        self.bound_seen: dict[str, str] = bound_seen if bound_seen is not None else {}
        self.gate: Callable[[GangState, float], fairness.Gate] = gate or (lambda state, now: fairness.Gate())
        self._node_consumers: set[str] = set()
        self.announced: set[tuple[str, int]] = set()
        """(gang, attempt) whose deadline and ``GangAdmitted`` were published by this process."""
        self.missed: dict[str, tuple[int, tuple[str, ...] | None]] = {}
        """Gang → its attempt that was placing when a release would have woken it (``wake``), and
        the queues that release freed."""
        self.batched: Mapping[type, BatchSender] = batched or {}

    # -- effects -----------------------------------------------------------------------------
    def timeout_of(self, state: GangState) -> float:
        return min(state.timeout_s or self.config.default_timeout_s, MAX_GANG_TIMEOUT_S)

    async def execute(self, todo: tuple[effects.Effect, ...]) -> None:
        """Carry out effects in order (each may be carried out more than once: same message ids).
        A node's first MIG command creates the node's durable consumer first (``node_consumer``)."""
        for e in todo:
            match e:
                case effects.Publish(subject=subject, event=event, msg_id=msg_id):
                    if isinstance(event, MigPrepareRequested | MigDestroyRequested):
                        await self.node_consumer(event.node)
                    sender = self.batched.get(type(event)) if msg_id is None else None
                    if sender is not None:
                        await sender.send(event)
                    else:
                        await self.bus.publish(subject, event, msg_id=msg_id)
                case effects.ScheduleDeadline(event=event, at=at):
                    await self.bus.publish_scheduled(S.deadline_schedule_subject(event.gang_id), event, at=at,
                                                     target=S.deadline_fired_subject(event.gang_id))
                case effects.Notify(pods=pods, reason=reason, message=message, condition=condition, normal=normal):
                    self.notifier.tell(pods, reason, message, condition=condition, normal=normal)
                case effects.ReportGroup(gang_id=gang_id, scheduled=scheduled, message=message):
                    if self.groups is not None:
                        await self.groups.report(gang_id, scheduled=scheduled, message=message)
                case effects.Compensate(gang_id=gang_id, attempt=attempt):
                    await self.roll_back(gang_id, attempt)

    async def node_consumer(self, node: str) -> None:
        """Create ``node``'s MIG durable once per process: a pull consumer with the table's
        filter, which node agents may bind to but never create (docs/security.md)."""
        if node not in self._node_consumers:
            await declare_consumer(self.bus, S.node_consumer(node))
            self._node_consumers.add(node)

    async def apply(self, t: Transition | None) -> GangState | None:
        """Carry out the effects of a stored transition; returns its new state."""
        if t is None:
            return None
        self.note_repair(t.before, t.after, time.time())
        await self.execute(effects.entered(t.before, t.after, now=time.time(), timeout_s=self.timeout_of(t.after),
                                           held=self.reservations_of(t.after), announce_now=self.config.announce_after_s <= 0))
        if t.after.phase == "preempting":
            self.announced.add((t.after.gang_id, t.after.attempt))  # entering it armed the deadline
        return t.after

    def note_repair(self, before: GangState | None, after: GangState, now: float) -> None:
        """Count a repair's end (``phalanx_gang_repairs_total``, ``phalanx_gang_repair_seconds``)
        and record it as a span ``gang.repair`` from its first failure to now."""
        r = before.repair if before is not None else None
        if r is None:
            return
        if after.repair is None and after.phase == "scheduled":
            outcome = repairs.outcome(before)  # type: ignore[arg-type]  # before is not None: r is its repair
        elif after.repair is not None and after.repair.restart and not r.restart:
            outcome = "restarted"
        else:
            return
        metrics.GANG_REPAIRS.inc(outcome=outcome)
        if outcome != "restarted":
            metrics.GANG_REPAIR_SECONDS.observe(max(0.0, now - r.started_at))
        span = tracer().start_span("gang.repair", context=otel_context.Context(), start_time=int(r.started_at * 1e9),
                                   attributes={"phalanx.gang": after.gang_id, "phalanx.outcome": outcome,
                                               "phalanx.failed": len(r.failed), "phalanx.policy": r.policy,
                                               "phalanx.domain": str(r.domain() or ""),
                                               "phalanx.nodes": ",".join(sorted({f.node for f in r.failed}))})
        span.end(end_time=int(now * 1e9))
        log("repair over", gang=after.gang_id, outcome=outcome, seconds=round(now - r.started_at, 3))

    async def roll_back(self, gang_id: str, attempt: int) -> None:
        state = await self.store.get(gang_id)
        if state is None or state.attempt != attempt or state.phase != "rolling_back":
            return
        after = await self.compensator.roll_back(state)
        if after is not None and after.phase == "backoff":
            await self.apply(Transition(state, after))

    async def redrive(self, state: GangState) -> None:
        """Publish what ``state`` waits for again (idempotent: same commands, same message ids)."""
        await self.execute(effects.redrive(state, timeout_s=self.timeout_of(state), held=self.reservations_of(state)))

    # -- attempts ----------------------------------------------------------------------------
    async def admit(self, gang_id: str, add: Change) -> Transition | None:
        """Record new members (``add``, a ``saga.add_member`` fold) and, when that completes
        the gang and nothing holds it back, start its attempt in the same compare-and-set: a
        gang whose pods arrive together costs one write, not two. Returns what was stored."""
        now = time.time()
        current, _ = await self.store.load(gang_id, to_write=True)
        added = add(current)
        if added is not None and saga.start_attempt(added, now=now, settle_s=self.config.settle_s) is not None:
            gate = self.gate(added, now)
            if not (saga.queue_conflict(added) or gate.hold):
                t = await self._start(gang_id, now, gate, prepare=add, members=len(added.members))
                if t is not None:
                    return t
        t = await self.store.transition(gang_id, add)
        await self.start(gang_id)
        return t

    async def start(self, gang_id: str) -> None:
        """Start a new attempt when the gang is complete and waiting (or its backoff is over),
        or is scheduled and has late members, unless the fairness gate holds it back (its pods
        are told why, once)."""
        now = time.time()
        current = await self.store.get(gang_id)
        if current is None or not (current.phase in IDLE or saga.late_members(current)):
            return
        gate = self.gate(current, now)
        reason = saga.queue_conflict(current) or gate.hold
        if reason:
            t = await self.store.transition(gang_id, lambda s: saga.held_back(s, reason))
            if t is not None:
                log("held back", gang=gang_id, reason=reason)
                await self.execute(effects.pending(t.after, now))
            return
        if saga.start_attempt(current, now=now, settle_s=self.config.settle_s, avoid=gate.avoid,
                              avoid_for=gate.head) is None:
            return  # not complete yet, or its backoff is not over: no trace, no write
        await self._start(gang_id, now, gate, members=len(current.members))

    async def _start(self, gang_id: str, now: float, gate: fairness.Gate, *, prepare: Change | None = None,
                     members: int = 0) -> Transition | None:
        """Start the attempt (after ``prepare``, in the same compare-and-set) and carry out its
        effects. One trace per attempt: a root span whose context travels in every command's
        headers; its id goes into the record with the attempt."""
        def start(s: GangState | None, trace_id: str) -> GangState | None:
            if prepare is not None:
                s = prepare(s) or s
            new = saga.start_attempt(s, now=now, settle_s=self.config.settle_s, avoid=gate.avoid, avoid_for=gate.head)
            return msgspec.structs.replace(new, trace_id=trace_id) if new is not None else None

        with tracer().start_as_current_span("gang.attempt", context=otel_context.Context(), attributes={
                "phalanx.gang": gang_id, "phalanx.members": members}) as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            t = await self.store.transition(gang_id, lambda s: start(s, trace_id))
            if t is None:
                span.set_attribute("phalanx.outcome", "not_started")
                return None
            state = t.after
            span.set_attribute("phalanx.attempt", state.attempt)
            span.set_attribute("phalanx.min_member", state.min_member)
            if gate.avoid:
                log("backfill", gang=gang_id, head=gate.head, avoid=",".join(gate.avoid))
            metrics.GANG_ATTEMPTS.inc()
            log("attempt started", gang=gang_id, attempt=state.attempt, members=len(state.members), trace=trace_id)
            await self.apply(t)
            return t

    def forget_announced(self, running: set[tuple[str, int]]) -> None:
        """Forget the announced attempts that are no longer running."""
        self.announced &= running

    async def announce(self, state: GangState) -> None:
        """An attempt that runs longer than ``announce_after_s``: schedule its deadline and tell
        subscribers it started (``GangAdmitted``). Quicker ones never needed either: their
        ``gang.scheduled`` or ``gang.pending`` says it all (docs/events.md, "Coalesced")."""
        key = (state.gang_id, state.attempt)
        if key in self.announced:
            return
        await self.execute(effects.announce(state, timeout_s=self.timeout_of(state)))
        self.announced.add(key)

    # -- replies -----------------------------------------------------------------------------
    async def on_reply(self, event, delivery: Delivery) -> None:
        match event:
            case Reserved():
                self.missed.pop(event.gang_id, None)
                await self.on_reserved(event)
            case PlacementFailed():
                c = self.config
                attempt, freed = self.missed.pop(event.gang_id, (None, None))
                state = await self.apply(await self.store.transition(event.gang_id, lambda s: saga.placement_failed(
                    s, event, now=time.time(), base_s=c.backoff_base_s, max_s=c.backoff_max_s,
                    unschedulable_s=c.unschedulable_retry_s)))
                if attempt == event.attempt and state is not None and \
                        fairness.release_helps(state, freed, self._chain) and \
                        await self._wake_one(event.gang_id, time.time()):
                    log("gang woken: GPUs were released during its attempt", gang=event.gang_id,
                        attempt=event.attempt)
            case Preempting():
                self.missed.pop(event.gang_id, None)  # a release no longer helps it: its GPUs are kept
                state = await self.apply(await self.store.transition(event.gang_id, lambda s: saga.preempting(s, event)))
                if state is not None:
                    log("preempting", gang=event.gang_id, attempt=event.attempt, nodes=",".join(event.nodes[:20]))
            case BindsDone():
                await self.on_binds_done(event)
            case Released():
                await self.wake(freed=event.queues or None)  # GPUs came free: gangs that did not fit may now
            case _:
                warn("unexpected event on coordinator subject", kind=type(event).__name__)

    async def wake(self, now: float | None = None, *, freed: tuple[str, ...] | None = None) -> list[str]:
        """GPUs were released (charged to the queues ``freed``, None when unknown): the gangs
        ``fairness.wake_order`` picks try again now instead of at the end of their backoff.
        Returns the gangs woken.

        A gang whose attempt is under way competes too: placement may have decided it before
        these GPUs came free, so if that attempt fails waiting for GPUs it is tried again at once
        (``missed``) instead of sleeping its whole backoff — a preemptor woken by each of its
        victims' releases is nearly always placing when the last one comes."""
        now = time.time() if now is None else now
        states, _ = await self.store.all()
        owed = self.queues.below_quota if self.queues is not None else (lambda q: False)
        ranks = self.queues.ranks(states, now) if self.queues is not None else {}
        woken = []
        for s in fairness.wake_order(states, now=now, below_quota=owed, freed=freed, chain=self._chain,
                                     placing=True, rank=lambda q: ranks.get(q, float("inf"))):
            if s.phase == "placing":
                self.missed[s.gang_id] = (s.attempt, freed)
            elif await self._wake_one(s.gang_id, now):
                woken.append(s.gang_id)
        if woken:
            log("gangs woken: GPUs were released", gangs=",".join(woken))
        return woken

    def _chain(self, queue: str) -> tuple[str, ...]:
        """The queue and its ancestors, as the queue book's tree says."""
        return (self.queues.tree.chain(queue) if self.queues is not None else ()) or (queue,)

    async def wake_all(self, woken: list[GangState], why: str, now: float | None = None) -> list[str]:
        """Try ``woken`` again now (``fairness.woken_by_cluster_change``, ``woken_by_queue_change``):
        something they wait for changed. Returns the gangs woken."""
        now = time.time() if now is None else now
        done = [s.gang_id for s in woken if await self._wake_one(s.gang_id, now)]
        if done:
            log("gangs woken", why=why, gangs=",".join(done[:20]), count=len(done))
        return done

    async def _wake_one(self, gang_id: str, now: float) -> bool:
        """End the backoff of a gang that failed to place and start its next attempt."""
        t = await self.store.transition(gang_id, lambda cur: saga.woken(cur, now))
        if t is not None:
            await self.start(gang_id)
        return t is not None

    async def on_node_reply(self, event, delivery: Delivery) -> None:
        match event:
            case MigReady():
                state = await self.store.get(event.gang_id)
                if state is not None and await self.holdings.mig_recorded(event, state):
                    ready = self.holdings.all_instances_ready(state)
                    await self.apply(await self.store.transition(event.gang_id, lambda s: saga.mig_ready(
                        s, event, all_ready=ready)))
            case MigFailed():
                await self.apply(await self.store.transition(event.gang_id, lambda s: saga.mig_failed(s, event)))
            case MigDestroyed():
                pass
            case _:
                pass  # commands to node agents share the stream; not ours

    async def on_deadline(self, event, delivery: Delivery) -> None:
        if not isinstance(event, GangDeadline):
            return
        state = await self.apply(await self.store.transition(event.gang_id, lambda s: saga.deadline(s, event)))
        if state is None:
            log("deadline ignored", gang=event.gang_id, attempt=event.attempt)
        else:
            warn("deadline fired", gang=event.gang_id, attempt=event.attempt)

    async def on_reserved(self, ev: Reserved) -> None:
        """Act on a ``Reserved`` only for an attempt this gang started, and only as far as the
        ledger holds it: a reservation for (gang, attempt, pod uid) for every member."""
        current = await self.store.get(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused(R.UNSTARTED_ATTEMPT, f"Reserved for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        if current.attempt != ev.attempt or current.phase not in PLACING:
            # Late or redelivered: a reservation nobody will use (old attempt, or rolled back).
            held = tuple(self.ledger.reservations(ev.gang_id, ev.attempt).values())
            pods = tuple(a.pod for a in held)
            if pods and not (current.attempt == ev.attempt and current.phase in ("preparing", "binding", "scheduled")):
                release = ReleaseRequested(gang_id=ev.gang_id, attempt=ev.attempt, reason="reply for a stale attempt",
                                           pods=pods)
                await self.bus.publish(S.placement_subject(ev.gang_id), release, msg_id=f"{release.key()}:after-placed")
            return
        if ev.members_digest != saga.members_digest(current):
            refused(R.NOT_MEMBERS, f"Reserved for members {ev.members_digest}, the attempt's are "
                                   f"{saga.members_digest(current)}", gang=ev.gang_id, attempt=ev.attempt)
            return
        missing = await self.holdings.unreserved(current)
        if missing:
            refused(R.NOT_RECORDED, f"{len(missing)} of {len(attempt_members(current))} member(s) have no reservation "
                                    f"in the ledger for this gang attempt ({', '.join(map(str, missing[:3]))})",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        held = self.reservations_of(current)
        nodes = ",".join(sorted({a.node for a in held}))
        if saga.binds_without_write(current, held):
            # Nothing to prepare: the binds go out now and the record stays placing (one write
            # fewer an attempt); the ledger says it is placed, and bound() moves it on.
            await self.execute(effects.binds(current))
            log("placed", gang=ev.gang_id, attempt=ev.attempt, phase=current.phase, nodes=nodes)
            return
        state = await self.apply(await self.store.transition(ev.gang_id, lambda s: saga.placed(s, ev)))
        if state is not None:
            log("placed", gang=ev.gang_id, attempt=ev.attempt, phase=state.phase, nodes=nodes)

    async def on_binds_done(self, ev: BindsDone) -> None:
        """Record members bound only for an attempt this gang started and only when the
        cluster shows each pod (uid) bound to the node the ledger holds it on; a bind the
        attempt no longer wants is undone (``Compensator.undo_late_bind``). A failure rolls the
        attempt back."""
        current = await self.store.get(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused(R.UNSTARTED_ATTEMPT, f"BindsDone for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        where = self.ledger.reservations(ev.gang_id, ev.attempt)
        wanted = current.attempt == ev.attempt and current.phase in BOUND_WANTED
        seen: list[tuple[PodRef, str, object]] = []
        for ref in ev.bound:
            a = where.get(alloc_key(ref))
            node = a.node if a is not None else None
            # The pod watch usually showed the binding already (a binding is never undone while
            # the uid lives); otherwise the API server is asked.
            if node is not None and ref.uid and self.bound_seen.get(ref.uid) == node:
                seen.append((ref, node, None))
                continue
            pod = await self.cluster.get_pod(ref)
            if node is None and not wanted and pod is not None and pod.uid == ref.uid and pod.node_name:
                # A bind that outran the rollback: the reservation it used is released already,
                # so the ledger no longer says where; the pod is undone where it is bound.
                seen.append((ref, pod.node_name, pod))
                continue
            if node is None or pod is None or pod.uid != ref.uid or pod.node_name != node:
                refused(R.NOT_BOUND, f"{ref} (uid {ref.uid or '-'}) is not bound to "
                                     f"{node or 'a node the ledger holds it on'}", gang=ev.gang_id, attempt=ev.attempt)
                continue
            seen.append((ref, node, pod))
        # The members bound first, then a failure: the rollback's unbind then deletes them too.
        t = await self.store.transition(ev.gang_id, lambda s: saga.bound(s, ev.attempt, tuple(r for r, _, _ in seen)))
        if t is not None:
            if t.after.phase == "scheduled":
                self.missed.pop(ev.gang_id, None)  # woken while its binds were out: nothing to retry
                log("gang scheduled", gang=ev.gang_id, attempt=ev.attempt)
            await self.apply(t)
        elif seen:
            latest = await self.store.get(ev.gang_id)
            if not (latest is not None and latest.attempt == ev.attempt and latest.phase in BOUND_WANTED):
                for ref, node, pod in seen:  # binds the attempt no longer wants
                    pod = pod or await self.cluster.get_pod(ref)
                    if pod is not None and pod.uid == ref.uid and pod.node_name == node:
                        await self.compensator.undo_late_bind(ev.gang_id, ev.attempt, ref, node, pod)
        if ev.failed:
            await self.apply(await self.store.transition(ev.gang_id, lambda s: saga.bind_failed(s, ev)))
