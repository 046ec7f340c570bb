"""``LedgerBook``: the reservations of ``phx-ledger``, mirrored, found by gang and by pod.

The ledger is the one home of every assignment (placement writes it, nobody copies it):
gang-coordinator reads an attempt's assignments from here when placement says it reserved
them, binder reads the one it binds, and neither asks the bucket per node — a ``KvMirror`` of
the node keys (``*``; the ``queue.*`` usage records are not reservations) feeds two indexes,
kept inline by the mirror's callbacks, in revision order:

    by gang  gang id → the node keys holding any of its reservations
    by pod   allocation key (``<namespace>/<name>/<uid>``) → the node key holding it

A node whose value is poisoned holds nothing here (the mirror calls ``on_delete`` for its last
good value); ``poisoned`` names it, so a caller can refuse with the reason rather than wait.
"""

from __future__ import annotations

import anyio

from phalanx_bus.bus import Bus
from phalanx_bus.mirror import KvMirror, MirrorEntry, Poisoned
from phalanx_proto import subjects as S
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.state import Allocation, NodeLedger, Nomination, alloc_key, victim_of


class LedgerBook:
    def __init__(self, bus: Bus) -> None:
        self.mirror: KvMirror[NodeLedger] = KvMirror.of_bucket(bus, S.KV_LEDGER, keys="*", on_put=self._put,
                                                              on_delete=self._delete)
        self._by_gang: dict[str, set[str]] = {}
        self._by_pod: dict[str, str] = {}

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the bucket until cancelled (started once it is listed)."""
        await self.mirror.run(task_status=task_status)

    async def catch_up(self) -> None:
        """Return once every write the bucket had when called is in (a reservation committed a
        moment ago, whose reply came first)."""
        await self.mirror.catch_up()

    # -- reading ------------------------------------------------------------------------------
    def reservations(self, gang_id: str, attempt: int) -> dict[str, Assignment]:
        """Allocation key → assignment of every reservation of exactly (gang, attempt)."""
        out = {}
        for key in self._by_gang.get(gang_id, ()):
            entry = self.mirror.get(key)
            for k, alloc in (entry.value.allocations.items() if entry is not None else ()):
                if alloc.gang_id == gang_id and alloc.attempt == attempt:
                    out[k] = alloc.assignment
        return out

    def gang_pods(self, victim: str) -> list[PodRef]:
        """Every pod the ledger holds a reservation of the gang ``victim`` for (any attempt), by
        pod key; of an elastic gang's extra member (``state.victim_of``), that pod alone."""
        gang_id, pod = victim_of(victim)
        out = {}
        for key in self._by_gang.get(gang_id, ()):
            entry = self.mirror.get(key)
            for k, alloc in (entry.value.allocations.items() if entry is not None else ()):
                if alloc.gang_id == gang_id and (not pod or alloc.assignment.pod.name == pod):
                    out[k] = alloc.assignment.pod
        return [out[k] for k in sorted(out)]

    def nominations(self, gang_id: str, attempt: int, now: float) -> list[Nomination]:
        """The nominations in force at ``now`` of exactly (preemptor gang, attempt), on every node."""
        return [n for e in self.mirror.entries.values() for n in e.value.nominations.values()
                if n.gang_id == gang_id and n.attempt == attempt and n.active(now)]

    def allocation(self, pod: PodRef) -> Allocation | None:
        """The reservation recorded for exactly this pod (by uid), on whichever node."""
        key = self._by_pod.get(alloc_key(pod))
        entry = self.mirror.get(key) if key is not None else None
        return entry.value.allocations.get(alloc_key(pod)) if entry is not None else None

    def ledger(self, node: str) -> NodeLedger | None:
        entry = self.mirror.get(S.token(node))
        return entry.value if entry is not None and entry.value.node == node else None

    def poisoned(self, node: str) -> Poisoned | None:
        return self.mirror.poisoned.get(S.token(node))

    def ledgers(self) -> list[NodeLedger]:
        return [e.value for e in self.mirror.entries.values()]

    # -- the indexes --------------------------------------------------------------------------
    def _put(self, entry: MirrorEntry[NodeLedger], previous: MirrorEntry[NodeLedger] | None) -> None:
        if previous is not None:
            self._forget(previous)
        for k, alloc in entry.value.allocations.items():
            self._by_gang.setdefault(alloc.gang_id, set()).add(entry.key)
            self._by_pod[k] = entry.key

    def _delete(self, previous: MirrorEntry[NodeLedger]) -> None:
        self._forget(previous)

    def _forget(self, entry: MirrorEntry[NodeLedger]) -> None:
        for k, alloc in entry.value.allocations.items():
            keys = self._by_gang.get(alloc.gang_id)
            if keys is not None:
                keys.discard(entry.key)
                if not keys:
                    del self._by_gang[alloc.gang_id]
            if self._by_pod.get(k) == entry.key:
                del self._by_pod[k]
