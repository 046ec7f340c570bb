"""gang-coordinator: the orchestrator of the gang saga (docs/saga.md).

It watches pending pods with our scheduler names, groups them into gangs (``gangs.py``), and
drives each gang through ``waiting → placing → preparing → binding → scheduled``, or through
``rolling_back → backoff → placing`` when an attempt fails or its deadline fires. The rules
are pure functions in ``saga.py``; this module applies them by compare-and-set on KV
``phx-gangs`` and performs the side effects the new state calls for.

Crash safety: state is written before the command that follows from it is published; the
resync loop re-drives a gang that sits in a running phase (or in ``rolling_back``) without
progress by re-publishing the same commands (same ``Nats-Msg-Id``) or re-running the
compensations not yet recorded as done; every downstream handler and every compensation is
idempotent, so a crash between two steps loses nothing and doubles nothing. The attempt
deadline is a JetStream scheduled message, so it fires even while this service is down.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from dataclasses import dataclass

import anyio
import msgspec
from opentelemetry import context as otel_context

from phalanx_bus import Bus, Delivery, KvConflict, Record, consume, read_one
from phalanx_gang_coordinator import saga
from phalanx_gang_coordinator.gangs import InvalidMember, identity, member_spec
from phalanx_kube.port import SCHEDULER_NAMES, ClusterPort, NotOurs, Pod
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindFailed,
    BindRequested,
    Bound,
    GangAdmitted,
    GangDeadline,
    GangPending,
    GangScheduled,
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    Placed,
    PlacementFailed,
    PlacementRequested,
    PodRef,
    Released,
    ReleaseRequested,
    RollbackStarted,
    encoder,
    gang_decoder,
    node_decoder,
)
from phalanx_proto.state import MAX_GANG_TIMEOUT_S, GangState, alloc_key, gang_state_decoder
from phalanx_telemetry import log, metrics, refused, tracer, warn

DURABLE = "gang-coordinator"
DURABLE_NODE = "gang-coordinator-node"
DURABLE_DEADLINE = "gang-coordinator-deadline"
COMPENSATION_LIMIT_S = 15.0


@dataclass(frozen=True)
class Config:
    resync_s: float = 2.0
    redrive_after_s: float = 5.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    default_timeout_s: float = 180.0
    settle_s: float = 2.0
    """An undeclared gang (no min-member) starts once no member arrived for this long."""
    starve_after_s: float = 60.0
    """A head-of-line gang waiting longer than this holds back the gangs behind it (0: off)."""


def _rollback_reason(reason: str) -> str:
    """A bounded metric label for a free-text rollback reason."""
    text = reason.lower()
    for needle, label in (("deadline", "deadline"), ("bind", "bind_failed"), ("mig", "mig_failed"),
                          ("deleted", "member_deleted"), ("nodes are available", "placement_failed")):
        if needle in text:
            return label
    return "other"


class Coordinator:
    def __init__(self, bus: Bus, cluster: ClusterPort, gangs_kv, config: Config) -> None:
        self.bus = bus
        self.cluster = cluster
        self.kv = gangs_kv
        self.config = config
        self._queue: list[GangState] = []
        """Gang states as of the last resync: the view the fairness gate decides on."""

    # -- state -----------------------------------------------------------------------------
    async def load(self, gang_id: str) -> tuple[GangState | None, int | None]:
        entry = await self.kv.get(S.gang_key(gang_id))
        if entry is None:
            return None, None
        return gang_state_decoder.decode(entry.value), entry.revision

    async def transition(self, gang_id: str, change) -> GangState | None:
        """Apply ``change(state) -> new state | None`` by compare-and-set, retrying on conflict.
        Returns the stored new state, or None when ``change`` declined."""
        for _ in range(50):
            state, rev = await self.load(gang_id)
            new = change(state)
            if new is None:
                return None
            data = encoder.encode(msgspec.structs.replace(new, updated_at=time.time()))
            try:
                if rev is None:
                    await self.kv.create(S.gang_key(gang_id), data)
                else:
                    await self.kv.update(S.gang_key(gang_id), data, last=rev)
                return new
            except KvConflict:
                continue
        raise RuntimeError(f"gang {gang_id}: too many concurrent updates")

    # -- pods ------------------------------------------------------------------------------
    async def on_pod(self, pod: Pod) -> None:
        if pod.node_name or pod.deleting:
            return
        try:
            ident = identity(pod)
            spec = member_spec(pod)
        except InvalidMember as e:
            await self._reject(pod, e)
            return
        now = time.time()
        state = await self.transition(ident.gang_id, lambda s: saga.add_member(
            s, spec, gang_id=ident.gang_id, min_member=ident.min_member, timeout_s=ident.timeout_s,
            priority=ident.priority, now=now))
        if state is not None:
            await self._warn_membership(pod, ident.min_member, state)
        await self.maybe_start(ident.gang_id)

    async def _warn_membership(self, pod: Pod, declared: int | None, s: GangState) -> None:
        """Tell the pod what its gang is when that is not plain (no silent guesses)."""
        msg = ""
        if not s.min_member_declared and s.gang_id != f"{pod.namespace}/{pod.name}":
            msg = (f"gang {s.gang_id}: no pod says min-member (aliyun.com/min-member); the gang is taken as the "
                   f"pods present once none arrived for {self.config.settle_s:g}s ({len(s.members)} so far)")
        elif declared is not None and declared != s.min_member:
            msg = f"gang {s.gang_id}: this pod says min-member {declared}, others say {s.min_member}; using {s.min_member}"
        elif len(s.members) > s.min_member:
            msg = (f"gang {s.gang_id}: {len(s.members)} pods present but min-member is {s.min_member}; every "
                   "present pod is placed, all or nothing")
        elif len(s.members) < s.min_member:
            await self._condition(pod.ref, saga.pending_reason(s, time.time()))
        if msg:
            await self._event(pod.ref, "GangMembership", msg)

    async def _reject(self, pod: Pod, error: InvalidMember) -> None:
        """Warning event + PodScheduled=False naming field, value and rule; once per message
        (the condition on the pod is the record, so a restart does not repeat it)."""
        message = f"invalid request: {error}"
        for c in ((pod.raw.get("status") or {}).get("conditions") or []):
            if c.get("type") == "PodScheduled" and c.get("message") == message:
                return
        warn("pod rejected", pod=f"{pod.namespace}/{pod.name}", reason=str(error))
        await self._event(pod.ref, "FailedScheduling", message)
        await self._condition(pod.ref, message)

    async def _event(self, ref: PodRef, reason: str, message: str) -> None:
        try:
            await self.cluster.record_event(ref, reason=reason, message=message, type="Warning")
        except Exception as e:  # noqa: BLE001 - the pod may be gone; the gang state says it all
            warn("cannot record event", pod=str(ref), error=repr(e))

    async def _condition(self, ref: PodRef, message: str) -> None:
        try:
            await self.cluster.set_scheduled_condition(ref, status=False, reason="Unschedulable", message=message)
        except Exception as e:  # noqa: BLE001 - as above
            warn("cannot set PodScheduled", pod=str(ref), error=repr(e))

    async def on_pod_deleted(self, pod: Pod, gang_id: str | None = None) -> None:
        if gang_id is None:
            try:
                gang_id = identity(pod).gang_id
            except InvalidMember:
                return
        ref = PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)
        before, _ = await self.load(gang_id)
        if before is None or saga.drop_member(before, ref) is None:
            return
        # Forget the member first, then give back what it held: placement refuses to release a
        # reservation of a live member (docs/saga.md, Checks). A crash in between leaves a
        # reservation without a pod, which the reconciler releases.
        new = await self.transition(gang_id, lambda s: saga.drop_member(s, ref))
        if new is None:
            return
        log("member gone", gang=gang_id, pod=str(ref))
        if before.attempt >= 1:
            # Destroy the pod's MIG instance before its reservation is released, so the slot is
            # never rebooked while an instance still sits in it (R3: reclaimed with the pod).
            for a in before.assignments:
                if a.pod == ref and a.mig_profile:
                    await self.bus.publish(S.mig_subject(a.node), MigDestroyRequested(
                        node=a.node, gang_id=gang_id, attempt=before.attempt, pod=a.pod,
                        gpu=a.gpus[0] if a.gpus else 0, instance_uuid=a.mig_instance_uuid))
            await self.bus.publish(S.placement_subject(gang_id), ReleaseRequested(
                gang_id=gang_id, attempt=before.attempt, reason="pod deleted", pods=(ref,)))
        if not new.members:
            await self.kv.delete(S.gang_key(gang_id))
            log("gang gone", gang=gang_id)
            return
        if new.phase in saga.RUNNING and ref not in new.unbound:
            failed = await self.transition(gang_id, lambda s: saga.fail(s, new.attempt, f"member {ref} was deleted"))
            if failed is not None:
                await self.roll_back(failed)

    # -- saga steps ------------------------------------------------------------------------
    async def maybe_start(self, gang_id: str) -> None:
        """Start a new attempt when the gang is complete and waiting (or its backoff is over),
        unless the fairness gate holds it back behind a starving head-of-line gang."""
        now = time.time()
        current, _ = await self.load(gang_id)
        if current is None or current.phase not in ("waiting", "backoff"):
            return
        head = saga.held_back_by(current, [s for s in self._queue if s.gang_id != gang_id], now=now,
                                 starve_after_s=self.config.starve_after_s)
        if head is not None:
            reason = f"held back behind {head.gang_id}, first in queue and waiting too long (fairness)"
            held = await self.transition(gang_id, lambda s: None if s is None or s.reason == reason or s.phase not in (
                "waiting", "backoff") else msgspec.structs.replace(s, reason=reason))
            if held is not None:
                log("held back", gang=gang_id, head=head.gang_id, head_waited_s=round(now - head.created_at))
                await self._tell_pending(held)
            return
        state = await self.transition(gang_id, lambda s: saga.start_attempt(s, now=now, settle_s=self.config.settle_s))
        if state is None:
            return
        metrics.GANG_ATTEMPTS.inc()
        # One trace per attempt: a root span whose context travels in every command's headers.
        with tracer().start_as_current_span("gang.attempt", context=otel_context.Context(), attributes={
                "phalanx.gang": gang_id, "phalanx.attempt": state.attempt,
                "phalanx.members": len(state.members), "phalanx.min_member": state.min_member}) as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            traced = await self.transition(gang_id, lambda s, a=state.attempt: None if s is None or s.attempt != a
                                           else msgspec.structs.replace(s, trace_id=trace_id))
            state = traced or state
            log("attempt started", gang=gang_id, attempt=state.attempt, members=len(state.members), trace=trace_id)
            await self._schedule_deadline(state)
            await self.bus.publish(S.status_subject(gang_id), GangAdmitted(
                gang_id=gang_id, attempt=state.attempt, members=tuple(m.pod for m in state.members),
                min_member=state.min_member))
            await self._request_placement(state)

    def timeout_of(self, state: GangState) -> float:
        return min(state.timeout_s or self.config.default_timeout_s, MAX_GANG_TIMEOUT_S)

    async def _schedule_deadline(self, state: GangState) -> None:
        at = state.attempt_started_at + self.timeout_of(state)
        await self.bus.publish_scheduled(S.deadline_schedule_subject(state.gang_id), GangDeadline(
            gang_id=state.gang_id, attempt=state.attempt, members_digest=saga.members_digest(state)),
            at=at, target=S.deadline_fired_subject(state.gang_id))

    async def _request_placement(self, state: GangState) -> None:
        await self.bus.publish(S.placement_subject(state.gang_id), PlacementRequested(
            gang_id=state.gang_id, attempt=state.attempt, members=state.members))

    async def _request_mig(self, state: GangState) -> None:
        for a in state.assignments:
            if a.mig_profile and not a.mig_instance_uuid:
                await self.bus.publish(S.mig_subject(a.node), MigPrepareRequested(
                    node=a.node, gang_id=state.gang_id, attempt=state.attempt, pod=a.pod,
                    gpu=a.gpus[0] if a.gpus else 0, profile=a.mig_profile, start=max(0, a.mig_start)))

    async def _request_binds(self, state: GangState) -> None:
        done = set(state.bound)
        for a in state.assignments:
            if a.pod not in done:
                await self.bus.publish(S.binder_subject(state.gang_id), BindRequested(
                    gang_id=state.gang_id, attempt=state.attempt, assignment=a))

    async def drive(self, state: GangState) -> None:
        """Publish what ``state`` waits for (idempotent: same commands, same message ids)."""
        match state.phase:
            case "placing":
                await self._request_placement(state)
            case "preparing":
                await self._request_mig(state)
            case "binding":
                await self._request_binds(state)
            case "rolling_back":
                await self.roll_back(state)

    # -- replies ---------------------------------------------------------------------------
    async def on_reply(self, event, delivery: Delivery) -> None:
        match event:
            case Placed():
                await self.on_placed(event)
            case PlacementFailed():
                await self.on_placement_failed(event)
            case Bound():
                await self.on_bound(event)
            case BindFailed():
                state = await self.transition(event.gang_id, lambda s: saga.bind_failed(s, event))
                if state is not None:
                    await self.roll_back(state)
            case Released():
                pass  # release is fire-and-forget on a durable stream (docs/saga.md)
            case _:
                warn("unexpected event on coordinator subject", kind=type(event).__name__)

    async def on_node_reply(self, event, delivery: Delivery) -> None:
        match event:
            case MigReady():
                state = await self.transition(event.gang_id, lambda s: saga.mig_ready(s, event))
                if state is not None and state.phase == "binding":
                    log("mig ready", gang=event.gang_id, attempt=event.attempt)
                    await self._request_binds(state)
            case MigFailed():
                state = await self.transition(event.gang_id, lambda s: saga.mig_failed(s, event))
                if state is not None:
                    await self.roll_back(state)
            case MigDestroyed():
                pass
            case _:
                pass  # commands to node agents share the stream; not ours

    async def on_deadline(self, event, delivery: Delivery) -> None:
        if not isinstance(event, GangDeadline):
            return
        state = await self.transition(event.gang_id, lambda s: saga.deadline(s, event))
        if state is None:
            log("deadline ignored", gang=event.gang_id, attempt=event.attempt)
            return
        warn("deadline fired", gang=event.gang_id, attempt=event.attempt)
        await self.roll_back(state)

    async def on_placed(self, ev: Placed) -> None:
        """Act on a ``Placed`` only for an attempt this gang started, and only as far as the
        ledger confirms it: the reservations must be there for (gang, attempt, pod uid)."""
        current, _ = await self.load(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused("unstarted_attempt", f"Placed for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        held = await self._recorded(ev.gang_id, ev.attempt, ev.assignments)
        if current.attempt != ev.attempt or current.phase != "placing":
            # Late or redelivered: a reservation nobody will use (old attempt, or rolled back).
            pods = tuple(a.pod for a in ev.assignments if a in held)
            if pods and not (current.attempt == ev.attempt and current.phase in ("preparing", "binding", "scheduled")):
                release = ReleaseRequested(gang_id=ev.gang_id, attempt=ev.attempt, reason="reply for a stale attempt",
                                           pods=pods)
                await self.bus.publish(S.placement_subject(ev.gang_id), release, msg_id=f"{release.key()}:after-placed")
            return
        if len(held) != len(ev.assignments):
            refused("not_recorded", f"{len(ev.assignments) - len(held)} of {len(ev.assignments)} assignment(s) are not "
                                    "in the ledger for this gang attempt", gang=ev.gang_id, attempt=ev.attempt)
            return
        state = await self.transition(ev.gang_id, lambda s: saga.placed(s, ev))
        if state is None:
            return
        log("placed", gang=ev.gang_id, attempt=ev.attempt, phase=state.phase,
            nodes=",".join(sorted({a.node for a in ev.assignments})))
        await self.drive(state)

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

    async def on_placement_failed(self, ev: PlacementFailed) -> None:
        c = self.config
        state = await self.transition(ev.gang_id, lambda s: saga.placement_failed(
            s, ev, now=time.time(), base_s=c.backoff_base_s, max_s=c.backoff_max_s))
        if state is not None:
            log("pending", gang=ev.gang_id, attempt=ev.attempt, reason=ev.summary)
            await self._tell_pending(state)

    async def on_bound(self, ev: Bound) -> None:
        """Record a member bound only for an attempt this gang started and only when the
        cluster shows that pod (uid) bound to that node; a bind the attempt no longer wants is
        undone (``_undo_late_bind``)."""
        current, _ = await self.load(ev.gang_id)
        if current is None or ev.attempt > current.attempt:
            refused("unstarted_attempt", f"Bound for attempt {ev.attempt}, which this gang never started",
                    gang=ev.gang_id, attempt=ev.attempt, pod=str(ev.pod))
            return
        pod = await self.cluster.get_pod(ev.pod)
        if pod is None or pod.uid != ev.pod.uid or pod.node_name != ev.node:
            refused("not_bound", f"{ev.pod} (uid {ev.pod.uid or '-'}) is not bound to {ev.node}",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        state = await self.transition(ev.gang_id, lambda s: saga.bound(s, ev))
        if state is None:
            await self._undo_late_bind(ev, pod)
            return
        if state.phase == "scheduled":
            log("gang scheduled", gang=ev.gang_id, attempt=ev.attempt)
            await self.bus.publish(S.status_subject(ev.gang_id), GangScheduled(
                gang_id=ev.gang_id, attempt=ev.attempt, assignments=state.assignments))

    async def _undo_late_bind(self, ev: Bound, pod: Pod) -> None:
        """A bind of an attempt that was rolled back (binder was slow): its reservation is
        released, so the pod must not stay bound. Delete it, with an event saying why — but
        only a pod (by uid) that is a member of this gang, has a Phalanx schedulerName and is
        bound where the reply says, and only when the gang's live attempt does not want it
        there."""
        current, _ = await self.load(ev.gang_id)
        if current is None or ev.pod not in {m.pod for m in current.members}:
            refused("not_member", f"{ev.pod} (uid {ev.pod.uid or '-'}) is not a member of {ev.gang_id}",
                    gang=ev.gang_id, attempt=ev.attempt)
            return
        if current.phase in ("binding", "scheduled") and any(
                a.pod == ev.pod and a.node == ev.node for a in current.assignments):
            return  # a duplicate reply, or the current attempt wants the pod on that node too
        if pod.scheduler_name not in SCHEDULER_NAMES:
            refused("foreign_scheduler", f"{ev.pod} has schedulerName {pod.scheduler_name!r}", gang=ev.gang_id)
            return
        await self._event(ev.pod, "GangRollback", f"gang {ev.gang_id} attempt {ev.attempt} was rolled back before "
                                                  "this pod was bound; deleting it so its controller recreates it")
        await self._delete(ev.pod)

    async def _delete(self, pod) -> bool:
        """Delete a bound member so its controller recreates it; a pod of another scheduler is
        refused by the adapter (``NotOurs``), logged, and left alone."""
        try:
            await self.cluster.delete_pod(pod)
            return True
        except NotOurs as e:
            warn("refused to delete a pod of another scheduler", pod=str(pod), error=str(e))
            return False

    # -- rollback --------------------------------------------------------------------------
    async def roll_back(self, state: GangState) -> None:
        """Run the attempt's compensations not yet done, in reverse order of the steps, each
        shielded and time-limited, recording each in ``phx-gangs`` as it completes. Resumable:
        a crash part-way leaves ``rolling_back`` with the done steps, and resync continues."""
        if not state.rollback_done:
            metrics.GANG_ROLLBACKS.inc(reason=_rollback_reason(state.reason))
            warn("rolling back", gang=state.gang_id, attempt=state.attempt, reason=state.reason)
            await self.bus.publish(S.status_subject(state.gang_id), RollbackStarted(
                gang_id=state.gang_id, attempt=state.attempt, reason=state.reason,
                members_digest=saga.members_digest(state)))
        c = self.config
        while state is not None and state.phase == "rolling_back":
            step = saga.next_compensation(state)
            if step is None:
                break
            with anyio.fail_after(COMPENSATION_LIMIT_S, shield=True):
                unbound = await self._compensate(state, step)
            state = await self.transition(state.gang_id, lambda s, a=state.attempt, st=step, u=unbound: saga.compensated(
                s, a, st, now=time.time(), base_s=c.backoff_base_s, max_s=c.backoff_max_s, unbound=u))
        if state is not None and state.phase == "backoff":
            log("rolled back", gang=state.gang_id, attempt=state.attempt)
            await self._tell_pending(state)

    async def _compensate(self, state: GangState, step: str) -> tuple[PodRef, ...]:
        """One compensation; may run more than once, and when its step never happened."""
        reason = f"gang {state.gang_id} attempt {state.attempt} rolled back: {state.reason}"
        match step:
            case "unbind":
                # Delete the members already bound. A bind still queued at binder finds its
                # reservation released and is refused; one already in binder's hands is
                # undone when its late ``Bound`` arrives (``_undo_late_bind``).
                deleted = []
                for a in state.assignments:
                    pod = await self.cluster.get_pod(a.pod)
                    if pod is None or not pod.node_name or pod.uid != a.pod.uid or \
                            pod.scheduler_name not in SCHEDULER_NAMES:
                        continue
                    await self._event(a.pod, "GangRollback", f"{reason}; deleting this bound pod so its "
                                                             "controller recreates it")
                    if await self._delete(a.pod):
                        deleted.append(a.pod)
                return tuple(deleted)
            case "mig":
                for a in state.assignments:
                    if a.mig_profile:
                        await self.bus.publish(S.mig_subject(a.node), MigDestroyRequested(
                            node=a.node, gang_id=state.gang_id, attempt=state.attempt, pod=a.pod,
                            gpu=a.gpus[0] if a.gpus else 0, instance_uuid=a.mig_instance_uuid))
            case "release":
                pods = tuple(a.pod for a in state.assignments) or tuple(m.pod for m in state.members)
                if pods:
                    await self.bus.publish(S.placement_subject(state.gang_id), ReleaseRequested(
                        gang_id=state.gang_id, attempt=state.attempt, reason=state.reason, pods=pods))
        return ()

    async def _tell_pending(self, state: GangState) -> None:
        reason = saga.pending_reason(state, time.time())
        await self.bus.publish(S.status_subject(state.gang_id), GangPending(
            gang_id=state.gang_id, attempt=max(1, state.attempt), reason=reason),
            msg_id=f"gang.pending:{state.gang_id}:{state.attempt}:{saga.members_digest(state)}:{state.failures}:"
                   f"{zlib.crc32(reason.encode())}")
        for m in state.members:
            await self._event(m.pod, "FailedScheduling", reason)
            await self._condition(m.pod, reason)

    # -- loops -----------------------------------------------------------------------------
    async def watch_pods(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        async for ev in self.cluster.watch_pods():
            if ev is None:
                if not started:
                    started = True
                    task_status.started()
                continue
            try:
                if ev.type == "DELETED":
                    await self.on_pod_deleted(ev.pod)
                else:
                    await self.on_pod(ev.pod)
            except Exception:  # noqa: BLE001 - resync covers whatever this missed
                log("pod event failed", level=40, exc_info=True)

    async def resync(self) -> None:
        """Re-list pods and re-drive stalled gangs: the informer-resync safety net."""
        while True:
            await anyio.sleep(self.config.resync_s)
            try:
                await self.resync_once()
            except Exception:  # noqa: BLE001 - retried on the next tick
                log("resync failed", level=40, exc_info=True)

    async def resync_once(self) -> None:
        pods = await self.cluster.list_pods()
        live = {(p.namespace, p.name, p.uid) for p in pods}
        states = [gang_state_decoder.decode(e.value) for e in await self.kv.items()]
        # Pods already members of a gang need no re-admission (that is two KV reads a pod a
        # tick); their gang is re-driven below. Only pods the watch may have missed go through.
        members = {(m.pod.namespace, m.pod.name, m.pod.uid) for st in states for m in st.members}
        unknown = [p for p in pods if (p.namespace, p.name, p.uid) not in members]
        for pod in unknown:
            await self.on_pod(pod)
        if unknown:
            states = [gang_state_decoder.decode(e.value) for e in await self.kv.items()]
        self._queue = [s for s in states if s.phase != "scheduled"]
        metrics.GANGS.replace(({"phase": p}, n) for p, n in Counter(s.phase for s in states).items())
        now = time.time()
        for state in sorted(states, key=saga.queue_key):
            try:
                await self._resync_gang(state, live, now)
            except Exception:  # noqa: BLE001 - one gang's trouble must not stall the others
                log("resync of gang failed", level=40, exc_info=True, gang=state.gang_id)

    async def _resync_gang(self, state: GangState, live: set, now: float) -> None:
        """Re-drive one gang: drop gone members, start it, re-publish its commands, resume its rollback."""
        gone = [m.pod for m in state.members if (m.pod.namespace, m.pod.name, m.pod.uid) not in live]
        for ref in gone:
            await self.on_pod_deleted(Pod(namespace=ref.namespace, name=ref.name, uid=ref.uid), state.gang_id)
        if gone:
            return
        stalled = now - state.updated_at > self.config.redrive_after_s
        if state.phase in ("waiting", "backoff"):
            await self.maybe_start(state.gang_id)
        elif state.phase in saga.RUNNING and stalled:
            await self._schedule_deadline(state)
            await self.drive(state)
        elif state.phase == "rolling_back" and stalled:
            await self.roll_back(state)


async def run(bus: Bus, cluster: ClusterPort, config: Config = Config(), *,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run gang-coordinator until cancelled; ready once its three consumers and the pod watch are live."""
    gangs_kv = await bus.kv(S.KV_GANGS)
    coord = Coordinator(bus, cluster, gangs_kv, config)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE].stream, durable=DURABLE, filter_subject=S.CONSUMER[DURABLE].filter,
            decoder=gang_decoder, handler=coord.on_reply, task_status=task_status))
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE_NODE].stream, durable=DURABLE_NODE, filter_subject=S.CONSUMER[DURABLE_NODE].filter,
            decoder=node_decoder, handler=coord.on_node_reply, task_status=task_status))
        await tg.start(lambda task_status: consume(
            bus, stream=S.CONSUMER[DURABLE_DEADLINE].stream, durable=DURABLE_DEADLINE, filter_subject=S.CONSUMER[DURABLE_DEADLINE].filter,
            decoder=gang_decoder, handler=coord.on_deadline, task_status=task_status))
        await tg.start(coord.watch_pods)
        tg.start_soon(coord.resync)
        task_status.started()
