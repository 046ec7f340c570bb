"""placement's copy of every node's Kubernetes state (KV ``phx-node-state``, contract C7) and
the rule for nodes whose agent has not reported it.

``NodeStates`` mirrors the bucket (``phalanx_bus.KvMirror``: watch-fed, a poisoned value
isolated to its key) and answers two questions for a decision:

* ``of(node)`` — the node's ``NodeKubeState`` for ``NodeView.kube`` (``None``: not reported,
  or its value does not decode);
* ``required()`` — must a node without a report be refused (the engine's ``NodeStateReported``
  filter, "node state not reported", resolvable)?

The rule (``Config.node_state`` of the service, ``--node-state``):

* ``auto`` (the default): required once reports have been seen for ``grace_s``, counted from
  the first report this process saw (a listed one included). Nodes that did report are
  checked from their first report on; the grace only lets unreported ones through. A
  cluster whose agents report checks every node, and a node whose agent has not reported (yet,
  or any more: a deleted key) is refused with that reason; a cluster where no agent reports
  at all keeps placing by GPUs alone, each reservation naming the unchecked nodes. The grace
  lets the agents of a cluster that starts all at once report before any node is refused.
* ``required``: always; ``optional``: never (unchecked nodes are named in the log).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import anyio

from phalanx_bus import Bus, KvMirror
from phalanx_proto import subjects as S
from phalanx_proto.scheduling import NodeKubeState

POLICIES = ("auto", "required", "optional")
GRACE_S = 30.0


class NodeStates:
    """The mirror of ``phx-node-state`` and the reporting rule (module docstring)."""

    def __init__(self, bus: Bus, *, policy: str = "auto", grace_s: float = GRACE_S,
                 clock: Callable[[], float] = time.monotonic, on_change: Callable[[str], object] | None = None) -> None:
        """``on_change``: called with a node's key whenever its state changes or goes (placement's
        cache marks the node to rebuild)."""
        if policy not in POLICIES:
            raise ValueError(f"node state policy {policy!r}: one of {', '.join(POLICIES)}")
        self.policy = policy
        self.grace_s = grace_s
        self._clock = clock
        self._since: float | None = None
        """When this process first saw a report (``auto``)."""
        self.on_change = on_change
        self._waiters: dict[str, set[anyio.Event]] = {}
        self.mirror: KvMirror[NodeKubeState] = KvMirror.of_bucket(bus, S.KV_NODE_STATE, on_put=self._seen,
                                                                   on_delete=self._gone)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the bucket until cancelled; started once the bucket is listed."""
        await self.mirror.run(task_status=task_status)

    def _seen(self, entry, previous) -> None:
        if self._since is None:
            self._since = self._clock()
        self._changed(entry.key)

    def _gone(self, previous) -> None:
        self._changed(previous.key)

    def _changed(self, key: str) -> None:
        if self.on_change is not None:
            self.on_change(key)
        for event in self._waiters.pop(key, ()):
            event.set()

    async def changed(self, nodes: Iterable[str], timeout_s: float) -> bool:
        """Wait until the state of any of ``nodes`` is written again (or goes); False when
        ``timeout_s`` passes first."""
        event = anyio.Event()
        keys = {S.token(n) for n in nodes}
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)
        try:
            with anyio.move_on_after(timeout_s):
                await event.wait()
        finally:
            for key in keys:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[key]
        return event.is_set()

    def of(self, node: str) -> NodeKubeState | None:
        entry = self.mirror.get(S.token(node))
        return entry.value if entry is not None else None

    def required(self) -> bool:
        if self.policy != "auto":
            return self.policy == "required"
        return self._since is not None and self._clock() - self._since >= self.grace_s
