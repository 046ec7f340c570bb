"""placement's allocation gauges (``phalanx_telemetry.allocation``: GPUs, core % and memory
allocated by node, model and mode, fragmentation) and its node counts
(``phalanx_placement_nodes``), recomputed from the cache at most every ``metrics_every_s``."""

from __future__ import annotations

import time

import anyio

from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_telemetry import allocation, metrics, warn


class Gauges:
    def __init__(self, cache: ClusterCache, config: Config) -> None:
        self.cache, self.config = cache, config
        self._recorded_at = 0.0
        self._allocation_stale = True

    def committed(self) -> None:
        """A commit changed the ledger: the gauges, now if they are due, else at the next flush."""
        self._allocation_stale = True
        self.record_allocation(force=False)

    def record_allocation(self, *, force: bool) -> None:
        """Allocation gauges from the cache (a pass over every node): after a commit at most
        every ``metrics_every_s``; ``flush_allocation`` catches up the rest."""
        now = time.monotonic()
        if not force and now - self._recorded_at < self.config.metrics_every_s:
            return
        self._recorded_at, self._allocation_stale = now, False
        self.cache.refresh()
        try:
            allocation.record(allocation.NodeAllocation(node=v.name, topology=v.topology, enabled=v.enabled,
                                                        assignments=v.allocations)
                              for v in self.cache.views.values() if not v.invalid)
        except Exception as e:  # noqa: BLE001 - metrics never stop a commit or a decision
            warn("allocation metrics not computed", error=repr(e)[:300])

    async def flush(self) -> None:
        """Every ``metrics_every_s``: the allocation gauges if a commit is not yet in them, and
        how many nodes the cache holds (a node whose heartbeat went late shows without a request)."""
        while True:
            self.record_nodes()
            await anyio.sleep(self.config.metrics_every_s)
            if self._allocation_stale:
                self.record_allocation(force=True)

    def record_nodes(self) -> None:
        self.cache.refresh()
        metrics.PLACEMENT_NODES.replace(({"state": k}, n) for k, n in self.cache.node_counts().items())
