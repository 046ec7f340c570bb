"""The node agent's report of its node's Kubernetes state (contract C7): ``NodeKubeState`` in
KV ``phx-node-state`` under the node's token, for placement's non-GPU filters.

``NodeStateReporter.observe`` takes the node and the pods bound to it (``NodeObjects``),
leaves out the pods Phalanx placed (they carry the assignment annotation and are in the
ledger with their requests) from what the filters count, lists them apart as what runs there
(``NodeKubeState.phalanx_pods``: placement frees no reservation of a pod listed there), builds
the state (``phalanx_kubeobjects.nodekube``) and writes it when it differs from what this reporter
last wrote. Every ``REASSERT_S`` it also reads its key back and writes the state again when
the stored value is not its own (deleted, lost with a server's disk): a node's record never
stays gone because nothing on the node changed. A Node that is gone, or one whose state breaks
a wire bound, has its key deleted: placement then treats the node as unreported (it takes no
pod once reports flow) instead of believing a stale state.

``follow`` drives it from ``ClusterPort.watch_node`` (a list + watch on a real API server, a
poll in the simulator) and writes at most once per ``debounce_s``: a burst of pod changes on a
busy node costs one write. A Phalanx pod that no longer runs here (deleted, or terminal) is
reported at once, without the debounce: placement frees a reservation only once its node's
report no longer lists the pod, and a preemptor waits for exactly that (docs/preemption.md).
The simulator's node fleet calls ``observe`` itself from one listing per round, and at once for
a node one of whose Phalanx pods went (``phalanx_node_fleet``).
"""

from __future__ import annotations

from contextlib import aclosing

import anyio

from phalanx_bus import Bus
from phalanx_kube.port import ClusterPort, NodeObjects, Pod
from phalanx_kubeobjects.nodekube import node_kube_state
from phalanx_kubeobjects.violations import Violation
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder, pod_key
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION
from phalanx_telemetry import log, warn

DEBOUNCE_S = 0.5
REASSERT_S = 30.0


def placed_pods(pods: tuple[Pod, ...]) -> tuple[str, ...]:
    """``<namespace>/<name>/<uid>`` of every pod Phalanx placed (it carries the assignment
    annotation) that is bound here and not terminal (one being deleted still runs), sorted."""
    return tuple(sorted({pod_key(p.ref) for p in pods if ASSIGNMENT_ANNOTATION in p.annotations and not p.terminal}))


class NodeStateReporter:
    """Writes node ``node``'s ``NodeKubeState`` when it changes."""

    def __init__(self, bus: Bus, node: str) -> None:
        self.bus = bus
        self.node = node
        self._written: bytes | None = None
        self._placed: frozenset[str] = frozenset()
        """The Phalanx pods the last state written lists running here (``phalanx_pods``)."""
        self.writes = 0
        self._lock = anyio.Lock()

    def departed(self, objs: NodeObjects) -> bool:
        """A Phalanx pod the last written state lists is no longer running here in ``objs``:
        reported without delay."""
        return bool(self._placed - set(placed_pods(objs.pods)))

    async def observe(self, objs: NodeObjects) -> bool:
        """Report ``objs``; True when the stored state changed. One report at a time."""
        async with self._lock:
            return await self._observe(objs)

    async def _observe(self, objs: NodeObjects) -> bool:
        kv = await self.bus.kv(S.KV_NODE_STATE)
        key = S.token(self.node)
        if objs.node is None:
            return await self._drop(kv, key, "the Node object does not exist")
        foreign = [p.raw for p in objs.pods if ASSIGNMENT_ANNOTATION not in p.annotations]
        state = node_kube_state(objs.node.raw, foreign, placed=placed_pods(objs.pods))
        if isinstance(state, Violation):
            return await self._drop(kv, key, str(state))
        raw = encoder.encode(state)
        if raw == self._written:
            return False
        await kv.put(key, raw)
        self._written, self._placed, self.writes = raw, frozenset(state.phalanx_pods), self.writes + 1
        for r in state.running:
            if r.unread:  # reported, counted conservatively by pod (anti-)affinity (docs/placement.md)
                warn("pod on the node not read for pod affinity", node=self.node, reason=r.unread)
        log("node state reported", level=10, node=self.node, pods=state.pods, unschedulable=state.unschedulable,
            ready=state.ready, taints=len(state.taints))
        return True

    async def reassert(self) -> bool:
        """Write the last state again when the stored value is not it (True when written)."""
        if not self._written:
            return False
        kv = await self.bus.kv(S.KV_NODE_STATE)
        current = await kv.get(S.token(self.node))
        if current is not None and current.value == self._written:
            return False
        await kv.put(S.token(self.node), self._written)
        self.writes += 1
        warn("node state written again: the stored value was not this node's", node=self.node,
             stored="missing" if current is None else f"revision {current.revision}")
        return True

    async def _drop(self, kv, key: str, why: str) -> bool:
        if self._written == b"":
            return False
        await kv.delete(key)
        self._written, self._placed = b"", frozenset()
        warn("node state not reported", node=self.node, why=why)
        return True

    async def follow(self, cluster: ClusterPort, *, debounce_s: float = DEBOUNCE_S, reassert_s: float = REASSERT_S,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Report from ``cluster.watch_node`` until cancelled, at most one write per
        ``debounce_s`` — but at once when a Phalanx pod left (``departed``); a failed write is
        retried with the next change or after ``debounce_s``. Started once the first state was
        reported (or its report failed)."""
        latest: list[NodeObjects] = []
        changed = anyio.Event()

        async def watch() -> None:
            nonlocal changed
            async with aclosing(cluster.watch_node(self.node)) as updates:
                async for objs in updates:
                    latest[:] = [objs]
                    changed.set()

        async def reassert() -> None:
            while True:
                await anyio.sleep(reassert_s)
                try:
                    await self.reassert()
                except Exception as e:  # noqa: BLE001 - bus away: the next period retries
                    warn("node state re-assert failed", node=self.node, error=repr(e)[:300])

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            tg.start_soon(reassert)
            first = True
            while True:
                await changed.wait()
                changed = anyio.Event()
                if not first and not self.departed(latest[0]):
                    await anyio.sleep(debounce_s)
                try:
                    await self.observe(latest[0])
                except Exception as e:  # noqa: BLE001 - bus away: try again shortly
                    warn("node state report failed", node=self.node, error=repr(e)[:300])
                    changed.set()
                if first:
                    first = False
                    task_status.started()
