"""A lease in KV ``phx-leases``: one holder at a time, by owner and expiry, compare-and-set.

``hold()`` takes the lease when it is free or expired and renews it when this owner holds it;
every write expects the revision it read, so two replicas racing for it cannot both win. The
holder must renew well within ``ttl_s`` (the reconciler renews every pass); a holder that dies
loses the lease when it expires. Expiry is wall-clock time, so replicas' clocks are assumed
to agree to well within ``ttl_s`` (NTP).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phalanx_bus import BadEntry, Kv, KvConflict, read_one
from phalanx_proto.events import encoder
from phalanx_proto.kvrules import BucketRule
from phalanx_proto.state import Lease, lease_decoder

_RULE = BucketRule(lease_decoder, lambda key, lease: "" if key == lease.name else f"key {key!r} is not lease {lease.name!r}")


class LeaseHolder:
    def __init__(self, kv: Kv, name: str, owner: str, *, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.kv = kv
        self.name = name
        self.owner = owner
        self.ttl_s = ttl_s
        self.clock = clock
        self.held = False

    async def hold(self) -> bool:
        """Take or renew the lease; True while this owner holds it."""
        now = self.clock()
        fresh = encoder.encode(Lease(name=self.name, owner=self.owner, expires_at=now + self.ttl_s, acquired_at=now))
        rec = await read_one(self.kv, self.name, _RULE)
        try:
            if rec is None:
                await self.kv.create(self.name, fresh)
            elif isinstance(rec, BadEntry) or rec.value.owner == self.owner or rec.value.expires_at < now:
                # An unreadable lease is as good as expired: overwrite it (compare-and-set still).
                if not isinstance(rec, BadEntry) and rec.value.owner == self.owner:
                    fresh = encoder.encode(Lease(name=self.name, owner=self.owner, expires_at=now + self.ttl_s,
                                                 acquired_at=rec.value.acquired_at))
                await self.kv.update(self.name, fresh, last=rec.revision)
            else:
                self.held = False
                return False
        except KvConflict:
            self.held = False
            return False
        self.held = True
        return True

    async def release(self) -> None:
        """Give the lease up (if held), so a successor need not wait for it to expire."""
        if not self.held:
            return
        self.held = False
        rec = await read_one(self.kv, self.name, _RULE)
        if rec is not None and not isinstance(rec, BadEntry) and rec.value.owner == self.owner:
            try:
                await self.kv.delete(self.name, last=rec.revision)
            except KvConflict:
                pass
