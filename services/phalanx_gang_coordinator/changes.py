"""Cluster changes: when the nodes change in a way that may let a gang fit that fit no node set
of the cluster before, the gangs waiting for that are tried again (docs/saga.md, "Retried when
something changed").

It follows the nodes as placement decides on them — each node's topology report (``phx-topology``:
its GPUs, links, network tiers, whether Phalanx may use it) and its Kubernetes state
(``phx-node-state``: allocatable, labels, taints, cordon, readiness, the other schedulers' pods)
— through two ``KvMirror``s, and fires its ``Signal`` after a node is added, removed or changed
in any of these. The pods Phalanx itself bound there (``phalanx_pods``) change with every bind
and are no such change: a GPU freed by Phalanx is a release, which wakes the gangs waiting for
GPUs (``Released``). The listing the mirrors start with is no change: a restarted
gang-coordinator retries nothing for it (the timer does, at the latest).

A ``Signal`` gathers what fires together (a node's report and its state; a rack added) into one
wake-up, ``SETTLE_S`` after the first; the queue book fires one when the Queues change.
gang-coordinator's queue book reads the same topology mirror (the enabled nodes' GPUs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec

from phalanx_bus import Bus, KvMirror
from phalanx_proto import subjects as S

SETTLE_S = 0.2
"""How long changes are gathered before ``on_change`` runs once for all of them."""


class Signal:
    """Something changed: ``fire`` (synchronous, from a mirror's callback) and ``changes`` (one
    wake-up for everything fired within ``SETTLE_S`` of the first)."""

    def __init__(self) -> None:
        self.fired = 0
        self._event = anyio.Event()

    def fire(self) -> None:
        self.fired += 1
        self._event.set()

    async def changes(self) -> AsyncIterator[None]:
        while True:
            await self._event.wait()
            await anyio.sleep(SETTLE_S)
            self._event = anyio.Event()
            yield


class ClusterChanges:
    def __init__(self, bus: Bus) -> None:
        self.signal = Signal()
        self.topology: KvMirror = KvMirror.of_bucket(bus, S.KV_TOPOLOGY, on_put=self._put, on_delete=self._gone)
        """Each node's topology report (``NodeTopologyReported``)."""
        self.node_states: KvMirror = KvMirror.of_bucket(bus, S.KV_NODE_STATE, on_put=self._state_put,
                                                        on_delete=self._gone)
        self._listed = False

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the nodes until cancelled; started once both mirrors are listed."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.topology.run)
            await tg.start(self.node_states.run)
            self._listed = True
            task_status.started()

    def _note(self) -> None:
        if self._listed:
            self.signal.fire()

    def _put(self, entry, previous) -> None:
        if previous is None or previous.value != entry.value:
            self._note()

    def _state_put(self, entry, previous) -> None:
        if previous is None or _without_own_pods(previous.value) != _without_own_pods(entry.value):
            self._note()

    def _gone(self, previous) -> None:
        self._note()


def _without_own_pods(state):
    return msgspec.structs.replace(state, phalanx_pods=())
