"""placement's allocation gauges (``phalanx_telemetry.allocation``: GPUs, core % and memory
allocated by node, model and mode, fragmentation) and its node counts
(``phalanx_placement_nodes``), computed from the cache when ``/metrics`` is read
(``Registry.collect_on_render``): each is a pass over every node, which a timer would pay for
whether anybody reads them or not (at 1,000 nodes about 4 % of placement's CPU in
``bench/scale.py``)."""

from __future__ import annotations

import time

from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_telemetry import allocation, metrics, warn

MIN_INTERVAL_S = 1.0
"""The allocation gauges are recomputed at most this often, however often they are read."""


class Gauges:
    def __init__(self, cache: ClusterCache, config: Config) -> None:
        self.cache, self.config = cache, config
        self._recorded_at = float("-inf")
        self._allocation_stale = True

    def committed(self) -> None:
        """A commit changed the ledger: the allocation gauges are recomputed when next read."""
        self._allocation_stale = True

    def collect(self) -> None:
        """Before ``/metrics`` renders: the node counts, and the allocation gauges when a commit
        is not yet in them (at most once per ``MIN_INTERVAL_S``: a pass over every node)."""
        self.record_nodes()
        if self._allocation_stale and time.monotonic() - self._recorded_at >= MIN_INTERVAL_S:
            self.record_allocation()

    def record_allocation(self) -> None:
        """Allocation gauges from the cache (a pass over every node)."""
        self._recorded_at, self._allocation_stale = time.monotonic(), False
        self.cache.refresh()
        try:
            allocation.record(allocation.NodeAllocation(node=v.name, topology=v.topology, enabled=v.enabled,
                                                        assignments=v.allocations)
                              for v in self.cache.views.values() if not v.invalid)
        except Exception as e:  # noqa: BLE001 - metrics never stop a commit or a decision
            warn("allocation metrics not computed", error=repr(e)[:300])

    def record_nodes(self) -> None:
        self.cache.refresh()
        metrics.PLACEMENT_NODES.replace(({"state": k}, n) for k, n in self.cache.node_counts().items())
