"""The saga driver: start attempts, take replies and deadlines, and carry out the effects.

Every handler does the same three things: check the message against the record (the gang's
state, the ledger, the cluster — docs/saga.md "Checks"), apply a pure transition by
compare-and-set (``store``, ``saga``), then carry out ``effects.entered(before, after)``.
State is written before the commands that follow from it are published, and every command
carries its idempotency key as ``Nats-Msg-Id``, so a crash in between only delays the gang:
resync re-drives it with the same commands (``redrive``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from opentelemetry import context as otel_context

from phalanx_bus import Bus, Delivery, Record, read_one
from phalanx_bus.declare import declare_consumer
from phalanx_gang_coordinator import effects, fairness, saga
from phalanx_gang_coordinator.compensate import Compensator
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.queuebook import QueueBook
from phalanx_gang_coordinator.store import GangStore, Transition
from phalanx_kube.port import ClusterPort
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindFailed,
    Bound,
    GangDeadline,
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    Placed,
    PlacementFailed,
    Released,
    ReleaseRequested,
)
from phalanx_proto.state import MAX_GANG_TIMEOUT_S, GangState, alloc_key, mig_slot
from phalanx_proto.vocab import IDLE
from phalanx_proto.vocab import RefusalRule as R
from phalanx_telemetry import log, metrics, refused, tracer, warn

WAKE = 8
"""Gangs retried at once when GPUs are released (``SagaDriver.wake``)."""


class SagaDriver:
    def __init__(self, bus: Bus, cluster: ClusterPort, store: GangStore, notifier: Notifier, config,
                 queues: QueueBook | None = None) -> None:
        self.bus = bus
        self.cluster = cluster
        self.store = store
        self.notifier = notifier
        self.config = config
        self.queues = queues
        self.compensator = Compensator(store, cluster, notifier, self.execute, backoff_base_s=config.backoff_base_s,
                                       backoff_max_s=config.backoff_max_s)
        self.bound_seen: dict[str, str] = {}
        """Pod uid → the node the pod watch last showed it bound to (kept by the intake)."""
        self.gate: Callable[[GangState, float], fairness.Gate] = lambda state, now: fairness.Gate()
        """The fairness gate for ``state`` now (set by resync, which holds the queue)."""
        self._node_consumers: set[str] = set()

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
                    await self.bus.publish(subject, event, msg_id=msg_id)
                case effects.ScheduleDeadline(event=event, at=at):
                    await self.bus.publish_scheduled(S.deadline_schedule_subject(event.gang_id), event, at=at,
                                                     target=S.deadline_fired_subject(event.gang_id))
                case effects.Notify(pods=pods, reason=reason, message=message, condition=condition):
                    await self.notifier.tell(pods, reason, message, condition=condition)
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
        await self.execute(effects.entered(t.before, t.after, now=time.time(), timeout_s=self.timeout_of(t.after)))
        return t.after

    async def roll_back(self, gang_id: str, attempt: int) -> None:
        state = await self.store.get(gang_id)
        if state is None or state.attempt != attempt or state.phase != "rolling_back":
            return
        after = await self.compensator.roll_back(state)
        if after is not None and after.phase == "backoff":
            await self.apply(Transition(state, after))

    async def redrive(self, state: GangState) -> None:
        """Publish what ``state`` waits for again (idempotent: same commands, same message ids)."""
        await self.execute(effects.redrive(state, timeout_s=self.timeout_of(state)))

    # -- attempts ----------------------------------------------------------------------------
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
            t = await self.store.transition(gang_id, lambda s: None if s is None or (s.held and s.reason == reason) or (
                s.phase not in IDLE) else msgspec.structs.replace(s, reason=reason, held=True))
            if t is not None:
                log("held back", gang=gang_id, reason=reason)
                await self.execute(effects.pending(t.after, now))
            return
        def start(s: GangState | None, trace_id: str = "") -> GangState | None:
            new = saga.start_attempt(s, now=now, settle_s=self.config.settle_s, avoid=gate.avoid, avoid_for=gate.head)
            return msgspec.structs.replace(new, trace_id=trace_id) if new is not None and trace_id else new

        if start(current) is None:
            return  # not complete yet, or its backoff is not over: no trace, no write
        # One trace per attempt: a root span whose context travels in every command's headers;
        # its id goes into the record with the attempt, in one compare-and-set.
        with tracer().start_as_current_span("gang.attempt", context=otel_context.Context(), attributes={
                "phalanx.gang": gang_id, "phalanx.members": len(current.members),
                "phalanx.min_member": current.min_member}) as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            t = await self.store.transition(gang_id, lambda s: start(s, trace_id))
            if t is None:
                span.set_attribute("phalanx.outcome", "not_started")
                return
            state = t.after
            span.set_attribute("phalanx.attempt", state.attempt)
            if gate.avoid:
                log("backfill", gang=gang_id, head=gate.head, avoid=",".join(gate.avoid))
            metrics.GANG_ATTEMPTS.inc()
            log("attempt started", gang=gang_id, attempt=state.attempt, members=len(state.members), trace=trace_id)
            await self.apply(t)

    # -- replies -----------------------------------------------------------------------------
    async def on_reply(self, event, delivery: Delivery) -> None:
        match event:
            case Placed():
                await self.on_placed(event)
            case PlacementFailed():
                c = self.config
                await self.apply(await self.store.transition(event.gang_id, lambda s: saga.placement_failed(
                    s, event, now=time.time(), base_s=c.backoff_base_s, max_s=c.backoff_max_s)))
            case Bound():
                await self.on_bound(event)
            case BindFailed():
                await self.apply(await self.store.transition(event.gang_id, lambda s: saga.bind_failed(s, event)))
            case Released():
                await self.wake()  # GPUs came free: gangs that did not fit may now
            case _:
                warn("unexpected event on coordinator subject", kind=type(event).__name__)

    async def wake(self, now: float | None = None) -> list[str]:
        """GPUs were released: the first ``WAKE`` gangs waiting in backoff after a failed
        placement try again now instead of at the end of their backoff — those of queues below
        their quota first, then by priority and arrival (as kube-scheduler moves unschedulable
        pods back to its active queue on a cluster event). Returns the gangs woken."""
        now = time.time() if now is None else now
        states, _ = await self.store.all()
        waiting = [s for s in states if s.phase == "backoff" and s.failure == "placement_failed" and s.backoff_until > now]
        owed = self.queues.below_quota if self.queues is not None else (lambda q: False)
        waiting.sort(key=lambda s: (not owed(saga.queue_of(s)), saga.queue_key(s)))
        woken = []
        for s in waiting[:WAKE]:
            t = await self.store.transition(s.gang_id, lambda cur: msgspec.structs.replace(cur, backoff_until=now)
                                            if cur is not None and cur.phase == "backoff" and cur.backoff_until > now
                                            else None)
            if t is not None:
                woken.append(s.gang_id)
                await self.start(s.gang_id)
        if woken:
            log("gangs woken: GPUs were released", gangs=",".join(woken))
        return woken

    async def on_node_reply(self, event, delivery: Delivery) -> None:
        match event:
            case MigReady():
                if await self._mig_recorded(event):
                    await self.apply(await self.store.transition(event.gang_id, lambda s: saga.mig_ready(s, event)))
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

    async def on_placed(self, ev: Placed) -> None:
        """Act on a ``Placed`` only for an attempt this gang started, and only as far as the
        ledger confirms it: the reservations must be there for (gang, attempt, pod uid)."""
        current = await self.store.get(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused(R.UNSTARTED_ATTEMPT, f"Placed for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        held = await self._recorded(ev.gang_id, ev.attempt, ev.assignments)
        if current.attempt != ev.attempt or current.phase != "placing":
            # Late or redelivered: a reservation nobody will use (old attempt, or rolled back).
            pods = tuple(a.pod for a in held)
            if pods and not (current.attempt == ev.attempt and current.phase in ("preparing", "binding", "scheduled")):
                release = ReleaseRequested(gang_id=ev.gang_id, attempt=ev.attempt, reason="reply for a stale attempt",
                                           pods=pods)
                await self.bus.publish(S.placement_subject(ev.gang_id), release, msg_id=f"{release.key()}:after-placed")
            return
        if len(held) != len(ev.assignments):
            refused(R.NOT_RECORDED, f"{len(ev.assignments) - len(held)} of {len(ev.assignments)} assignment(s) are not "
                                    "in the ledger for this gang attempt", gang=ev.gang_id, attempt=ev.attempt)
            return
        state = await self.apply(await self.store.transition(ev.gang_id, lambda s: saga.placed(s, ev)))
        if state is not None:
            log("placed", gang=ev.gang_id, attempt=ev.attempt, phase=state.phase,
                nodes=",".join(sorted({a.node for a in ev.assignments})))

    async def _recorded(self, gang_id: str, attempt: int, assignments) -> list:
        """The ``assignments`` the ledger holds for exactly (gang, attempt, pod uid)."""
        ledger_kv = await self.bus.kv(S.KV_LEDGER)
        ledgers = {}
        for node in {a.node for a in assignments}:
            rec = await read_one(ledger_kv, S.token(node))
            ledgers[node] = rec.value if isinstance(rec, Record) else None
        out = []
        for a in assignments:
            ledger = ledgers.get(a.node)
            alloc = ledger.allocations.get(alloc_key(a.pod)) if ledger is not None else None
            if alloc is not None and (alloc.gang_id, alloc.attempt) == (gang_id, attempt) and alloc.assignment == a:
                out.append(a)
        return out

    async def _mig_recorded(self, ev: MigReady) -> bool:
        """A ``MigReady`` is believed only when the node's mig-manager recorded that instance
        ready for this gang attempt and pod in ``phx-mig``."""
        state = await self.store.get(ev.gang_id)
        a = next((a for a in (state.assignments if state else ()) if a.pod == ev.pod and a.node == ev.node), None)
        if a is None or not a.mig_profile:
            return False  # the transition ignores it anyway
        rec = await read_one(await self.bus.kv(S.KV_MIG), S.token(a.node))
        book = rec.value if isinstance(rec, Record) else None
        record = book.instances.get(mig_slot(a.gpus[0] if a.gpus else 0, max(0, a.mig_start))) if book else None
        if record is None or record.state != "ready" or record.uuid != ev.instance_uuid or \
                not record.owned_by(ev.gang_id, ev.attempt, ev.pod):
            refused(R.NOT_RECORDED, f"no ready MIG instance {ev.instance_uuid} is recorded in phx-mig for {ev.pod} "
                                    f"attempt {ev.attempt}", gang=ev.gang_id, node=ev.node)
            return False
        return True

    async def on_bound(self, ev: Bound) -> None:
        """Record a member bound only for an attempt this gang started and only when the
        cluster shows that pod (uid) bound to that node; a bind the attempt no longer wants is
        undone (``Compensator.undo_late_bind``)."""
        current = await self.store.get(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused(R.UNSTARTED_ATTEMPT, f"Bound for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt, pod=str(ev.pod))
            return
        # The pod watch usually showed the binding already (a binding is never undone while
        # the uid lives); otherwise the API server is asked.
        seen = bool(ev.pod.uid) and self.bound_seen.get(ev.pod.uid) == ev.node
        pod = None if seen else await self.cluster.get_pod(ev.pod)
        if not seen and (pod is None or pod.uid != ev.pod.uid or pod.node_name != ev.node):
            refused(R.NOT_BOUND, f"{ev.pod} (uid {ev.pod.uid or '-'}) is not bound to {ev.node}",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        t = await self.store.transition(ev.gang_id, lambda s: saga.bound(s, ev))
        if t is None:
            pod = pod or await self.cluster.get_pod(ev.pod)
            if pod is not None and pod.uid == ev.pod.uid and pod.node_name == ev.node:
                await self.compensator.undo_late_bind(ev, pod)
            return
        if t.after.phase == "scheduled":
            log("gang scheduled", gang=ev.gang_id, attempt=ev.attempt)
        await self.apply(t)
