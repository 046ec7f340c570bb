"""Each queue's recent usage on the bus (docs/queues.md, "Fair share that remembers"): placement
keeps one ``QueueHistory`` per queue in ``phx-ledger`` (key ``history.<queue>``) — its
GPU-seconds decayed by ``--usage-half-life-s``, as of a time, and the units it holds from then
on — and advances it with the rulebook's ``phalanx_rules.usage.advance`` whenever what the
queue holds changed. Called by ``service.run`` (``UsageHistory.run``).

* **Every second once.** A record says from when it counts (``at``); advancing it integrates
  exactly the time since then at the units it said, and writes ``at = now``. The write is a
  compare-and-set on the revision read: of two replicas, or a replica and its restarted self,
  one advances the record and the other, losing the compare-and-set, finds it advanced and
  leaves it (its mirror catches up before its next look). Nothing is counted twice; a time
  when no placement ran is counted when the next one starts, at the units the record said,
  which are what the ledger held all along (only placement changes it).
* **When.** Every ``--usage-every-s`` placement compares what each queue holds (its cache's
  units, its subtree's included) with its record's, and advances the records that differ: a
  change is counted from that look on, at most that late (and an end that late), which at
  hours of half-life is noise. An idle queue's record is not rewritten: the usage at any time
  follows from it (``usage.usage_at``).
* **Off** (``--usage-half-life-s 0``, the default): no record is written, and those left from
  a run with it on are removed, so that nobody weighs shares by a usage that stopped.
"""

from __future__ import annotations

import anyio

from phalanx_bus import Bus, KvConflict
from phalanx_placement.cache import ClusterCache
from phalanx_placement.config import Config
from phalanx_placement.queues import PlacementQueues
from phalanx_proto import subjects as S
from phalanx_proto.events import encoder
from phalanx_proto.queues import history_key
from phalanx_rules import usage
from phalanx_telemetry import log, warn


class UsageHistory:
    def __init__(self, bus: Bus, cache: ClusterCache, queues: PlacementQueues, config: Config) -> None:
        self.bus, self.cache, self.queues, self.config = bus, cache, queues, config

    async def run(self) -> None:
        """Look every ``usage_every_s`` until cancelled; a failed look is logged and retried."""
        while True:
            await anyio.sleep(self.config.usage_every_s)
            try:
                await self.once()
            except Exception as e:  # noqa: BLE001 - the bus is away: the next look counts the time since
                warn("queue usage history not advanced", error=repr(e)[:300])

    async def once(self, now: float | None = None) -> int:
        """Advance the records of the queues whose holding changed (or remove them all when the
        half-life is 0); the number written. ``KvConflict``: another writer was first, and its
        record stands."""
        now = self.cache.clock() if now is None else now
        kv = await self.bus.kv(S.KV_LEDGER)
        half_life = self.config.usage_half_life_s
        written = 0
        if half_life <= 0:
            for entry in self.cache.history:
                try:
                    await kv.delete(entry.key, last=entry.revision)
                    written += 1
                except KvConflict:
                    continue
            return written
        have = {e.value.queue: e for e in self.cache.history}
        for queue in sorted(self.queues.tree().specs):
            held = max(0, self.cache.queue_units.get(queue, 0))
            entry = have.get(queue)
            record = entry.value if entry is not None else None
            if not usage.stale(record, held, half_life):
                continue
            new = usage.advance(record, queue, now, held, half_life)
            try:
                if entry is None:
                    await kv.create(history_key(queue), encoder.encode(new))
                else:
                    await kv.update(entry.key, encoder.encode(new), last=entry.revision)
                written += 1
            except KvConflict:
                log("queue usage advanced by another writer", level=10, queue=queue)
        return written
