"""The node agent's report of its node's Kubernetes state (contract C7): ``NodeKubeState`` in
KV ``phx-node-state`` under the node's token, for placement's non-GPU filters.

``NodeStateReporter.observe`` takes the node and the pods bound to it (``NodeObjects``),
leaves out the pods Phalanx placed (they carry the assignment annotation and are in the
ledger with their requests), builds the state (``phalanx_engine.nodekube``) and writes it when
it differs from what this reporter last wrote. A Node that is gone, or one whose state breaks
a wire bound, has its key deleted: placement then treats the node as unreported (it takes no
pod once reports flow) instead of believing a stale state.

``follow`` drives it from ``ClusterPort.watch_node`` (a list + watch on a real API server, a
poll in the simulator) and writes at most once per ``debounce_s``: a burst of pod changes on a
busy node costs one write. The simulator's node fleet calls ``observe`` itself from one listing
per round.
"""

from __future__ import annotations

from contextlib import aclosing

import anyio

from phalanx_bus import Bus
from phalanx_engine.nodekube import node_kube_state
from phalanx_engine.quantity import Violation
from phalanx_kube.port import ASSIGNMENT_ANNOTATION, ClusterPort, NodeObjects
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_telemetry import log, warn

DEBOUNCE_S = 0.5


class NodeStateReporter:
    """Writes node ``node``'s ``NodeKubeState`` when it changes."""

    def __init__(self, bus: Bus, node: str) -> None:
        self.bus = bus
        self.node = node
        self._written: bytes | None = None
        self.writes = 0

    async def observe(self, objs: NodeObjects) -> bool:
        """Report ``objs``; True when the stored state changed."""
        kv = await self.bus.kv(S.KV_NODE_STATE)
        key = S.token(self.node)
        if objs.node is None:
            return await self._drop(kv, key, "the Node object does not exist")
        foreign = [p.raw for p in objs.pods if ASSIGNMENT_ANNOTATION not in p.annotations]
        state = node_kube_state(objs.node.raw, foreign)
        if isinstance(state, Violation):
            return await self._drop(kv, key, str(state))
        raw = encoder.encode(state)
        if raw == self._written:
            return False
        await kv.put(key, raw)
        self._written, self.writes = raw, self.writes + 1
        log("node state reported", level=10, node=self.node, pods=state.pods, unschedulable=state.unschedulable,
            ready=state.ready, taints=len(state.taints))
        return True

    async def _drop(self, kv, key: str, why: str) -> bool:
        if self._written == b"":
            return False
        await kv.delete(key)
        self._written = b""
        warn("node state not reported", node=self.node, why=why)
        return True

    async def follow(self, cluster: ClusterPort, *, debounce_s: float = DEBOUNCE_S,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Report from ``cluster.watch_node`` until cancelled, at most one write per
        ``debounce_s``; a failed write is retried with the next change or after ``debounce_s``.
        Started once the first state was reported (or its report failed)."""
        latest: list[NodeObjects] = []
        changed = anyio.Event()

        async def watch() -> None:
            nonlocal changed
            async with aclosing(cluster.watch_node(self.node)) as updates:
                async for objs in updates:
                    latest[:] = [objs]
                    changed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            first = True
            while True:
                await changed.wait()
                changed = anyio.Event()
                if not first:
                    await anyio.sleep(debounce_s)
                try:
                    await self.observe(latest[0])
                except Exception as e:  # noqa: BLE001 - bus away: try again shortly
                    warn("node state report failed", node=self.node, error=repr(e)[:300])
                    changed.set()
                if first:
                    first = False
                    task_status.started()
