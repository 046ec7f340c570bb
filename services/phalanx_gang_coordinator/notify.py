"""What gang-coordinator tells pods: Warning events and the ``PodScheduled=False`` condition,
kube-scheduler style, through the cluster port — off the saga's path.

A notice is handed to the notifier and the caller goes on at once: the API calls are made by
``run``'s workers, so a reply handler never waits for the API server or its client rate limiter
(one team's thousands of pending pods being told why they wait must not hold up another team's
binds). As kube-scheduler's API dispatcher does, the notifier keeps

* **at most one call sequence per pod in flight**, pods served first come, first served;
* **the latest condition only**: a newer ``PodScheduled`` message replaces one not yet sent,
  and a message equal to the one last set on the pod is skipped;
* **events in order**, each pod's not yet recorded events queued up to ``MAX_EVENTS`` (the
  oldest dropped beyond, counted in ``phalanx_notices_dropped_total``); an event equal to one
  already waiting is not queued twice.

A notice never fails the caller and is never retried: the pod may be gone by then, and the
gang's record says it all anyway (a failure is logged). Notices waiting when the process ends
are lost, as kube-scheduler's are; the next attempt's notice says the same again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import anyio

from phalanx_kube.port import ClusterPort, Pod
from phalanx_proto.events import PodRef
from phalanx_telemetry import metrics, warn

WORKERS = 4
"""Pods notified at once (each a sequence of calls under the client's rate limiter)."""
MAX_EVENTS = 4
"""Events kept waiting per pod; older ones are dropped when more come before they are sent."""
REMEMBERED = 100_000
"""Pods whose last condition message is remembered (to skip setting it again); oldest forgotten."""


@dataclass(slots=True)
class _Waiting:
    events: list[tuple[str, str]] = field(default_factory=list)
    normal: set[tuple[str, str]] = field(default_factory=set)
    """The events among ``events`` that are of type Normal (news, not trouble)."""
    condition: str | None = None


class Notifier:
    """Queues notices per pod; ``run`` sends them. Without ``run``, notices only wait."""

    def __init__(self, cluster: ClusterPort, *, workers: int = WORKERS) -> None:
        self.cluster = cluster
        self.workers = workers
        self._waiting: dict[PodRef, _Waiting] = {}
        self._order: deque[PodRef] = deque()
        """Pods with a notice waiting and none in flight, first come first served."""
        self._busy: set[PodRef] = set()
        self._set: OrderedDict[PodRef, str] = OrderedDict()
        """The last ``PodScheduled`` message set on each pod (bounded, ``REMEMBERED``)."""
        self._wakeup = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()

    # -- what callers hand in --------------------------------------------------------------------
    def event(self, ref: PodRef, reason: str, message: str, *, normal: bool = False) -> None:
        """A Warning event on the pod (``normal``: a Normal one); the same reason and message
        again bumps its count."""
        w = self._slot(ref)
        if normal:
            w.normal.add((reason, message))
        if (reason, message) not in w.events:
            w.events.append((reason, message))
            if len(w.events) > MAX_EVENTS:
                del w.events[0]
                metrics.NOTICES_DROPPED.inc()
        self._ready(ref)

    def condition(self, ref: PodRef, message: str) -> None:
        """``PodScheduled=False`` with reason ``Unschedulable`` and ``message`` (the latest wins)."""
        self._slot(ref).condition = message
        self._ready(ref)

    def tell(self, pods: tuple[PodRef, ...], reason: str, message: str, *, condition: bool = True,
             normal: bool = False) -> None:
        for ref in pods:
            self.event(ref, reason, message, normal=normal)
            if condition:
                self.condition(ref, message)

    def once(self, pod: Pod, reason: str, message: str) -> None:
        """Event + condition, unless the pod's ``PodScheduled`` already says ``message`` (the
        condition on the pod is the record, so a restart or a resync does not repeat it)."""
        for c in ((pod.raw.get("status") or {}).get("conditions") or []):
            if c.get("type") == "PodScheduled" and c.get("message") == message:
                return
        self.tell((pod.ref,), reason, message)

    @property
    def waiting(self) -> int:
        """Pods with a notice not yet sent (in flight included)."""
        return len(self._waiting) + len(self._busy)

    async def drained(self) -> None:
        """Wait until every notice handed in so far was sent (for tests and shutdown)."""
        while self._waiting or self._busy:
            self._idle = anyio.Event()
            await self._idle.wait()

    # -- the workers -----------------------------------------------------------------------------
    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Send notices until cancelled, ``workers`` pods at a time."""
        async with anyio.create_task_group() as tg:
            for _ in range(self.workers):
                tg.start_soon(self._work)
            task_status.started()

    async def _work(self) -> None:
        while True:
            while not self._order:
                self._wakeup = anyio.Event() if self._wakeup.is_set() else self._wakeup
                await self._wakeup.wait()
            ref = self._order.popleft()
            w = self._waiting.pop(ref, None)
            if w is None:
                continue
            self._busy.add(ref)
            try:
                await self._send(ref, w)
            finally:
                self._busy.discard(ref)
                if ref in self._waiting:  # more came while this was in flight
                    self._order.append(ref)
                    self._wakeup.set()
                metrics.NOTICES_WAITING.set(len(self._waiting) + len(self._busy))
                if not self._waiting and not self._busy:
                    self._idle.set()

    async def _send(self, ref: PodRef, w: _Waiting) -> None:
        for reason, message in w.events:
            try:
                await self.cluster.record_event(ref, reason=reason, message=message,
                                                type="Normal" if (reason, message) in w.normal else "Warning")
            except Exception as e:  # noqa: BLE001 - the pod may be gone; the gang state says it all
                warn("cannot record event", pod=str(ref), error=repr(e))
        if w.condition is None or self._set.get(ref) == w.condition:
            return
        try:
            await self.cluster.set_scheduled_condition(ref, status=False, reason="Unschedulable", message=w.condition)
        except Exception as e:  # noqa: BLE001 - as above
            warn("cannot set PodScheduled", pod=str(ref), error=repr(e))
            return
        self._set[ref] = w.condition
        self._set.move_to_end(ref)
        if len(self._set) > REMEMBERED:
            self._set.popitem(last=False)

    def _slot(self, ref: PodRef) -> _Waiting:
        w = self._waiting.get(ref)
        if w is None:
            w = self._waiting[ref] = _Waiting()
            if ref not in self._busy:
                self._order.append(ref)
        return w

    def _ready(self, ref: PodRef) -> None:
        metrics.NOTICES_WAITING.set(len(self._waiting) + len(self._busy))
        self._wakeup.set()
