"""Compensations: give back what a failed attempt took, in reverse order of the steps.

``unbind`` (delete the members already bound, so their controllers recreate them), ``claims``
(binder takes the members out of their ResourceClaims' ``reservedFor`` and clears each
allocation Phalanx wrote that nobody else holds, docs/dra.md), ``mig`` (destroy the attempt's MIG instances),
``release`` (the reservation, exactly by pod uid).
Each runs shielded and time-limited, and is recorded in ``GangState.rollback_done`` as soon
as it completed, so a coordinator that dies part-way leaves ``rolling_back`` with the steps
done so far and its successor's resync continues with the next one (style rule 3). Every
compensation may run more than once, and when its step never happened: deleting an absent
pod is success; unreserving a claim never reserved, destroying a MIG instance that was never
made and releasing an attempt that holds nothing change nothing.

Also here: undoing a late bind (a member reported bound for an attempt that was rolled back),
the one other place a pod is ever deleted — only a bound member of the gang, by uid.

What an attempt holds is read from the ledger (``held``: the driver's view of its mirror), the
one home of its assignments: the reservations are released last, so they are there while the
steps before the release run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from phalanx_gang_coordinator import effects
from phalanx_gang_coordinator.notify import Notifier
from phalanx_gang_coordinator.store import GangStore
from phalanx_kube.port import ClusterPort, NotOurs, Pod
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.kubeapi import SCHEDULER_NAMES
from phalanx_proto.state import GangState
from phalanx_proto.vocab import BOUND_WANTED
from phalanx_proto.vocab import RefusalRule as R
from phalanx_rules import saga
from phalanx_telemetry import log, metrics, refused, warn

COMPENSATION_LIMIT_S = 15.0

Execute = Callable[[tuple[effects.Effect, ...]], Awaitable[None]]
Held = Callable[[GangState], tuple[Assignment, ...]]


class Compensator:
    def __init__(self, store: GangStore, cluster: ClusterPort, notifier: Notifier, execute: Execute, reservations_of: Held, *,
                 backoff_base_s: float, backoff_max_s: float) -> None:
        self.store = store
        self.cluster = cluster
        self.notifier = notifier
        self.execute = execute
        """Carries out ``effects.compensation``'s commands (the driver's executor)."""
        self.reservations_of = reservations_of
        """The attempt's assignments as the ledger holds them."""
        self.backoff = dict(base_s=backoff_base_s, max_s=backoff_max_s)

    async def roll_back(self, state: GangState) -> GangState | None:
        """Run the attempt's compensations not yet done, in order, recording each; returns
        the state after the last one (``backoff``), or whatever stopped the loop."""
        if not state.rollback_done:
            metrics.GANG_ROLLBACKS.inc(reason=state.failure or "other")
            warn("rolling back", gang=state.gang_id, attempt=state.attempt, reason=state.reason)
        while state is not None and state.phase == "rolling_back":
            step = saga.next_compensation(state)
            if step is None:
                break
            with anyio.fail_after(COMPENSATION_LIMIT_S, shield=True):
                unbound = await self.unbind(state) if step == "unbind" else ()
                await self.execute(effects.compensation(state, step, self.reservations_of(state)))
            t = await self.store.transition(state.gang_id, lambda s, a=state.attempt, st=step, u=unbound: saga.compensated(
                s, a, st, now=time.time(), unbound=u, **self.backoff))
            state = t.after if t is not None else None
        if state is not None and state.phase == "backoff":
            log("rolled back", gang=state.gang_id, attempt=state.attempt)
        return state

    async def unbind(self, state: GangState) -> tuple[PodRef, ...]:
        """Delete every member of the attempt found bound (by uid, with a Phalanx schedulerName),
        each with a Warning event saying why. A bind still queued at binder finds its
        reservation released and is refused; one already in binder's hands is undone when its
        late reply arrives (``undo_late_bind``)."""
        reason = f"gang {state.gang_id} attempt {state.attempt} rolled back: {state.reason}"
        deleted = []
        for a in self.reservations_of(state):
            pod = await self.cluster.get_pod(a.pod)
            if pod is None or not pod.node_name or pod.uid != a.pod.uid or pod.scheduler_name not in SCHEDULER_NAMES:
                continue
            self.notifier.event(a.pod, "GangRollback", f"{reason}; deleting this bound pod so its controller "
                                                       "recreates it")
            if await self._delete(a.pod):
                deleted.append(a.pod)
        return tuple(deleted)

    async def _delete(self, pod: PodRef) -> bool:
        """Delete a bound member so its controller recreates it; a pod of another scheduler is
        refused by the adapter (``NotOurs``), logged, and left alone."""
        try:
            await self.cluster.delete_pod(pod)
            return True
        except NotOurs as e:
            warn("refused to delete a pod of another scheduler", pod=str(pod), error=str(e))
            return False

    async def undo_late_bind(self, gang_id: str, attempt: int, ref: PodRef, node: str, pod: Pod) -> None:
        """A bind of an attempt that was rolled back (binder was slow): its reservation is
        released, so the pod must not stay bound. Delete it, with an event saying why — only a
        pod (by uid) that is a member of this gang, has a Phalanx schedulerName and is bound
        where the ledger held it (the caller checked that), and only when the gang's live
        attempt does not want it there."""
        current = await self.store.get(gang_id)
        if current is None or ref not in {m.pod for m in current.members}:
            refused(R.NOT_MEMBER, f"{ref} (uid {ref.uid or '-'}) is not a member of {gang_id}",
                    gang=gang_id, attempt=attempt)
            return
        if current.phase in BOUND_WANTED and any(
                a.pod == ref and a.node == node for a in self.reservations_of(current)):
            return  # a duplicate reply, or the current attempt wants the pod on that node too
        if pod.scheduler_name not in SCHEDULER_NAMES:
            refused(R.FOREIGN_SCHEDULER, f"{ref} has schedulerName {pod.scheduler_name!r}", gang=gang_id)
            return
        self.notifier.event(ref, "GangRollback", f"gang {gang_id} attempt {attempt} was rolled back "
                                                 "before this pod was bound; deleting it so its controller "
                                                       "recreates it")
        await self._delete(ref)
