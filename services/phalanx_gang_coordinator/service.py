"""gang-coordinator: the orchestrator of the gang saga.

It watches pending pods with our scheduler names, groups them into gangs, and drives each
gang through ``waiting → placing → binding → scheduled`` (or back to ``backoff`` on a failed
attempt) by publishing commands and consuming replies. Saga state lives in KV ``phx-gangs``
and every transition is a compare-and-set, so replicas and restarts never fork a gang.

Crash safety: state is written before the command that follows from it is published; a
resync loop re-drives gangs that sit in ``placing``/``binding`` without progress by
re-publishing the same command (same ``Nats-Msg-Id``), and every downstream handler is
idempotent, so a crash between the two loses nothing and doubles nothing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import anyio
import msgspec

from phalanx_bus import Bus, Delivery, KvConflict, consume
from phalanx_gang_coordinator.gangs import InvalidMember, identity, member_spec
from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    BindFailed,
    BindRequested,
    Bound,
    GangAdmitted,
    GangPending,
    GangScheduled,
    Placed,
    PlacementFailed,
    PlacementRequested,
    PodRef,
    Released,
    ReleaseRequested,
    RollbackStarted,
    encoder,
    gang_decoder,
)
from phalanx_proto.state import GangState, gang_state_decoder
from phalanx_telemetry import log, warn

DURABLE = "gang-coordinator"


@dataclass(frozen=True)
class Config:
    resync_s: float = 2.0
    redrive_after_s: float = 5.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0


class Coordinator:
    def __init__(self, bus: Bus, cluster: ClusterPort, gangs_kv, config: Config) -> None:
        self.bus = bus
        self.cluster = cluster
        self.kv = gangs_kv
        self.config = config
        self._warned: set[tuple[str, str]] = set()

    # -- state -----------------------------------------------------------------------------
    async def load(self, gang_id: str) -> tuple[GangState | None, int | None]:
        entry = await self.kv.get(S.gang_key(gang_id))
        if entry is None:
            return None, None
        return gang_state_decoder.decode(entry.value), entry.revision

    async def save(self, state: GangState, revision: int | None) -> int:
        state = msgspec.structs.replace(state, updated_at=time.time())
        data = encoder.encode(state)
        if revision is None:
            return await self.kv.create(S.gang_key(state.gang_id), data)
        return await self.kv.update(S.gang_key(state.gang_id), data, last=revision)

    async def transition(self, gang_id: str, change) -> GangState | None:
        """Apply ``change(state) -> new state | None`` by compare-and-set, retrying on conflict.
        Returns the stored new state, or None when ``change`` declined."""
        for _ in range(50):
            state, rev = await self.load(gang_id)
            new = change(state)
            if new is None:
                return None
            try:
                await self.save(new, rev)
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
            await self._reject(pod, str(e))
            return

        def add(state: GangState | None) -> GangState | None:
            if state is None:
                state = GangState(gang_id=ident.gang_id, min_member=ident.min_member or 1, created_at=time.time())
            if any(m.pod.namespace == pod.namespace and m.pod.name == pod.name and m.pod.uid == pod.uid
                   for m in state.members):
                return None
            members = tuple(m for m in state.members if not (m.pod.namespace == pod.namespace and m.pod.name == pod.name))
            members += (spec,)
            min_member = ident.min_member or max(state.min_member, len(members))
            return msgspec.structs.replace(state, members=members, min_member=min_member)

        await self.transition(ident.gang_id, add)
        await self.maybe_start(ident.gang_id)

    async def _reject(self, pod: Pod, message: str) -> None:
        key = (f"{pod.namespace}/{pod.name}", pod.uid)
        if key in self._warned:
            return
        self._warned.add(key)
        warn("pod rejected", pod=f"{pod.namespace}/{pod.name}", reason=message)
        await self.cluster.record_event(pod.ref, reason="FailedScheduling", message=f"invalid request: {message}",
                                        type="Warning")
        await self.cluster.set_scheduled_condition(pod.ref, status=False, reason="Unschedulable",
                                                   message=f"invalid request: {message}")

    async def on_pod_deleted(self, pod: Pod, gang_id: str | None = None) -> None:
        if gang_id is None:
            try:
                gang_id = identity(pod).gang_id
            except InvalidMember:
                return
        state, _ = await self.load(gang_id)
        if state is None:
            return
        ref = PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)

        def drop(s: GangState | None) -> GangState | None:
            if s is None or not any(m.pod == ref for m in s.members):
                return None
            return msgspec.structs.replace(
                s, members=tuple(m for m in s.members if m.pod != ref),
                bound=tuple(b for b in s.bound if b != ref),
                assignments=tuple(a for a in s.assignments if a.pod != ref))

        new = await self.transition(gang_id, drop)
        if new is None:
            return
        if state.attempt >= 1:
            await self.bus.publish(S.placement_subject(gang_id), ReleaseRequested(
                gang_id=gang_id, attempt=state.attempt, reason="pod deleted", pods=(ref,)))
        log("member gone", gang=gang_id, pod=str(ref))
        if not new.members:
            await self.kv.delete(S.gang_key(gang_id))
            log("gang gone", gang=gang_id)

    # -- saga steps ------------------------------------------------------------------------
    async def maybe_start(self, gang_id: str) -> None:
        """Start a new attempt when the gang is complete and waiting (or its backoff is over)."""
        now = time.time()

        def start(s: GangState | None) -> GangState | None:
            if s is None or len(s.members) < s.min_member:
                return None
            if s.phase == "backoff" and now < s.updated_at + self.backoff_delay(s.attempt):
                return None
            if s.phase not in ("waiting", "backoff"):
                return None
            return msgspec.structs.replace(s, phase="placing", attempt=s.attempt + 1)

        state = await self.transition(gang_id, start)
        if state is None:
            return
        log("attempt started", gang=gang_id, attempt=state.attempt, members=len(state.members))
        await self.bus.publish(S.status_subject(gang_id), GangAdmitted(
            gang_id=gang_id, attempt=state.attempt, members=tuple(m.pod for m in state.members),
            min_member=state.min_member))
        await self._request_placement(state)

    async def _request_placement(self, state: GangState) -> None:
        await self.bus.publish(S.placement_subject(state.gang_id), PlacementRequested(
            gang_id=state.gang_id, attempt=state.attempt, members=state.members))

    def backoff_delay(self, attempt: int) -> float:
        """Exponential backoff with deterministic jitter per attempt (so every replica agrees)."""
        base = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** max(0, attempt - 1))
        return base * (0.75 + 0.5 * random.Random(attempt).random())

    async def on_reply(self, event, delivery: Delivery) -> None:
        match event:
            case Placed():
                await self.on_placed(event)
            case PlacementFailed():
                await self.on_placement_failed(event)
            case Bound():
                await self.on_bound(event)
            case BindFailed():
                await self.on_bind_failed(event)
            case Released():
                pass
            case _:
                warn("unexpected event on coordinator subject", kind=type(event).__name__)

    async def on_placed(self, ev: Placed) -> None:
        def to_binding(s: GangState | None) -> GangState | None:
            if s is None or s.attempt != ev.attempt or s.phase != "placing":
                return None
            return msgspec.structs.replace(s, phase="binding", assignments=ev.assignments, reason="")

        state = await self.transition(ev.gang_id, to_binding)
        if state is None:
            current, _ = await self.load(ev.gang_id)
            if current is None or current.attempt != ev.attempt or current.phase in ("backoff", "waiting"):
                # A reservation nobody will use (old attempt, or gang gone): give it back.
                await self.bus.publish(S.placement_subject(ev.gang_id), ReleaseRequested(
                    gang_id=ev.gang_id, attempt=ev.attempt, reason="reply for a stale attempt"))
            return
        log("placed", gang=ev.gang_id, attempt=ev.attempt,
            nodes=",".join(sorted({a.node for a in ev.assignments})))
        await self._request_binds(state)

    async def _request_binds(self, state: GangState) -> None:
        bound = set(state.bound)
        for a in state.assignments:
            if a.pod not in bound:
                await self.bus.publish(S.binder_subject(state.gang_id), BindRequested(
                    gang_id=state.gang_id, attempt=state.attempt, assignment=a))

    async def on_placement_failed(self, ev: PlacementFailed) -> None:
        def to_backoff(s: GangState | None) -> GangState | None:
            if s is None or s.attempt != ev.attempt or s.phase != "placing":
                return None
            return msgspec.structs.replace(s, phase="backoff", reason=ev.summary)

        state = await self.transition(ev.gang_id, to_backoff)
        if state is None:
            return
        reason = f"{ev.summary} (attempt {ev.attempt})"
        log("pending", gang=ev.gang_id, attempt=ev.attempt, reason=ev.summary)
        await self._tell_pending(state, reason)

    async def _tell_pending(self, state: GangState, reason: str) -> None:
        await self.bus.publish(S.status_subject(state.gang_id), GangPending(
            gang_id=state.gang_id, attempt=max(1, state.attempt), reason=reason))
        for m in state.members:
            try:
                await self.cluster.record_event(m.pod, reason="FailedScheduling", message=reason, type="Warning")
                await self.cluster.set_scheduled_condition(m.pod, status=False, reason="Unschedulable", message=reason)
            except Exception as e:  # noqa: BLE001 - the pod may be gone; the gang state says it all
                warn("cannot report pending reason", pod=str(m.pod), error=repr(e))

    async def on_bound(self, ev: Bound) -> None:
        def add_bound(s: GangState | None) -> GangState | None:
            if s is None or s.attempt != ev.attempt or s.phase != "binding" or ev.pod in s.bound:
                return None
            bound = s.bound + (ev.pod,)
            done = {a.pod for a in s.assignments} <= set(bound)
            return msgspec.structs.replace(s, bound=bound, phase="scheduled" if done else "binding")

        state = await self.transition(ev.gang_id, add_bound)
        if state is not None and state.phase == "scheduled":
            log("gang scheduled", gang=ev.gang_id, attempt=ev.attempt)
            await self.bus.publish(S.status_subject(ev.gang_id), GangScheduled(
                gang_id=ev.gang_id, attempt=ev.attempt, assignments=state.assignments))

    async def on_bind_failed(self, ev: BindFailed) -> None:
        def to_backoff(s: GangState | None) -> GangState | None:
            if s is None or s.attempt != ev.attempt or s.phase != "binding":
                return None
            return msgspec.structs.replace(s, phase="backoff", reason=f"bind failed: {ev.reason}",
                                           assignments=(), bound=())

        state = await self.transition(ev.gang_id, to_backoff)
        if state is None:
            return
        warn("bind failed, rolling back", gang=ev.gang_id, attempt=ev.attempt, reason=ev.reason)
        await self.bus.publish(S.status_subject(ev.gang_id), RollbackStarted(
            gang_id=ev.gang_id, attempt=ev.attempt, reason=ev.reason))
        await self.bus.publish(S.placement_subject(ev.gang_id), ReleaseRequested(
            gang_id=ev.gang_id, attempt=ev.attempt, reason=f"bind failed: {ev.reason}"))
        await self._tell_pending(state, f"bind failed: {ev.reason} (attempt {ev.attempt})")

    # -- loops -----------------------------------------------------------------------------
    async def watch_pods(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        async for ev in self.cluster.watch_pods():
            if ev is None:
                if not started:
                    started = True
                    task_status.started()
                continue
            if ev.type == "DELETED":
                await self.on_pod_deleted(ev.pod)
            else:
                await self.on_pod(ev.pod)

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
        for pod in pods:
            await self.on_pod(pod)
        now = time.time()
        for entry in await self.kv.items():
            state = gang_state_decoder.decode(entry.value)
            gone = [m.pod for m in state.members if (m.pod.namespace, m.pod.name, m.pod.uid) not in live]
            for ref in gone:
                await self.on_pod_deleted(Pod(namespace=ref.namespace, name=ref.name, uid=ref.uid), state.gang_id)
            if gone:
                continue
            if state.phase in ("waiting", "backoff"):
                await self.maybe_start(state.gang_id)
            elif state.phase == "placing" and now - state.updated_at > self.config.redrive_after_s:
                await self._request_placement(state)
            elif state.phase == "binding" and now - state.updated_at > self.config.redrive_after_s:
                await self._request_binds(state)


async def run(bus: Bus, cluster: ClusterPort, config: Config = Config(), *,
              task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run gang-coordinator until cancelled; ready once the reply consumer and pod watch are live."""
    gangs_kv = await bus.kv(S.KV_GANGS)
    coord = Coordinator(bus, cluster, gangs_kv, config)
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: consume(
            bus, stream=S.STREAM_GANG, durable=DURABLE, filter_subject="phx.gang.coord.>",
            decoder=gang_decoder, handler=coord.on_reply, task_status=task_status))
        await tg.start(coord.watch_pods)
        tg.start_soon(coord.resync)
        task_status.started()
