"""What DRA devices are taken, cluster-wide: the devices every ResourceClaim holds (any
scheduler's, read by gang-coordinator into ``DraPool.in_use``) plus the allocations Phalanx
holds that the API may not show yet (its ledger's ``ClaimAllocated``). Built by the caller of
``phalanx_engine.dra.allocate`` (placement) once per cycle; the caller owns it, copies it for a
trial (``copy``) and adds each allocation it keeps (``add``), so that the next member of a gang
sees the devices the previous ones got.

Three things are tracked, upstream's allocated state (``GatherAllocatedState``):

* exclusive devices: any allocation without a share id;
* shared devices (``allowMultipleAllocations``): per device, the sum of the capacity each share
  consumed;
* counters: a device that is allocated at all (exclusively or with at least one share) uses the
  counters it declares (``consumesCounters``, from the pool's newest slices) once; per
  (driver, pool) the sum by (counter set, counter).

An entry is a (claim, device, share) triple and counts once however often it is reported, so a
claim both in the API and in the ledger is not booked twice. Results with admin access never
count (they only watch a device).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from phalanx_engine.dra.pools import CounterKey, DeviceKey, nanos, newest_devices
from phalanx_proto.dra import ClaimAllocated, ClaimAllocation, Device, DraPool

_Entry = tuple[str, DeviceKey, str]  # (claim, device, share id)


class Usage:
    """The devices, shares and counters taken. Not thread-safe; ``copy`` is cheap (the big
    per-pool device index is shared, everything else copied)."""

    __slots__ = ("_devices", "_entries", "_exclusive", "_shares", "_active", "_counters", "_blocked")

    def __init__(self, pools: Iterable[DraPool] = (), held: Iterable[ClaimAllocated] = ()) -> None:
        pools = tuple(pools)
        self._devices: dict[tuple[str, str], dict[str, Device]] = {(p.driver, p.pool): newest_devices(p) for p in pools}
        self._entries: set[_Entry] = set()
        self._exclusive: dict[DeviceKey, int] = {}
        self._shares: dict[DeviceKey, dict[str, int]] = {}
        self._active: dict[DeviceKey, int] = {}
        self._counters: dict[tuple[str, str], dict[CounterKey, int]] = {}
        self._blocked: frozenset[DeviceKey] = frozenset()
        for p in pools:
            for use in p.in_use:
                self._take(use.claim, (p.driver, p.pool, use.device), use.share_id, use.consumed)
        for a in held:
            self.add(a.claim, a.allocation)

    def copy(self) -> Usage:
        other = Usage.__new__(Usage)
        other._devices = self._devices
        other._entries = set(self._entries)
        other._exclusive = dict(self._exclusive)
        other._shares = {k: dict(v) for k, v in self._shares.items()}
        other._active = dict(self._active)
        other._counters = {k: dict(v) for k, v in self._counters.items()}
        other._blocked = self._blocked
        return other

    def blocking(self, keys: frozenset[DeviceKey]) -> Usage:
        """This usage with ``keys`` also taken, exclusively: a view for one ``allocate`` call,
        sharing everything with this one (do not ``add`` to it). Placement blocks the DRA
        devices that are, or sit on, GPUs its device-plugin reservations hold (docs/dra.md,
        "Side by side")."""
        if not keys:
            return self
        other = Usage.__new__(Usage)
        other._devices, other._entries, other._exclusive = self._devices, self._entries, self._exclusive
        other._shares, other._active, other._counters = self._shares, self._active, self._counters
        other._blocked = self._blocked | keys
        return other

    def add(self, claim: str, allocation: ClaimAllocation) -> None:
        """Book ``allocation`` of ``claim`` (``<namespace>/<name>/<uid>``). Adding what is
        already booked changes nothing."""
        for d in allocation.devices:
            if not d.admin_access:
                self._take(claim, (d.driver, d.pool, d.device), d.share_id, d.consumed_capacity)

    def add_allocated(self, allocated: Iterable[ClaimAllocated]) -> None:
        """Book every allocation of an ``Allocation`` (``allocate``'s ``claims``)."""
        for a in allocated:
            self.add(a.claim, a.allocation)

    # --- what the allocator asks ---------------------------------------------------------------

    def exclusive(self, key: DeviceKey) -> bool:
        """Is the device allocated without a share (no one else may have it)?"""
        return key in self._exclusive or key in self._blocked

    def allocated(self, key: DeviceKey) -> bool:
        """Is the device allocated at all (its counters are in use)?"""
        return key in self._active or key in self._blocked

    def shared(self, key: DeviceKey) -> Mapping[str, int] | None:
        """The capacity (nanos by capacity name) the device's shares consume, or None when it
        has none."""
        return self._shares.get(key)

    def counters(self, driver: str, pool: str) -> Mapping[CounterKey, int]:
        """Counters in use in one pool, in nanos."""
        return self._counters.get((driver, pool), {})

    # --- internals -----------------------------------------------------------------------------

    def _take(self, claim: str, key: DeviceKey, share_id: str, consumed: Mapping[str, str]) -> None:
        entry = (claim, key, share_id)
        if entry in self._entries:
            return
        self._entries.add(entry)
        if share_id:
            have = self._shares.setdefault(key, {})
            for name, value in consumed.items():
                have[name] = have.get(name, 0) + nanos(value)
        else:
            self._exclusive[key] = self._exclusive.get(key, 0) + 1
        first = key not in self._active
        self._active[key] = self._active.get(key, 0) + 1
        if first:
            device = self._devices.get(key[:2], {}).get(key[2])
            if device is not None and device.consumes_counters:
                used = self._counters.setdefault(key[:2], {})
                for use in device.consumes_counters:
                    for name, value in use.counters.items():
                        ck = (use.counter_set, name)
                        used[ck] = used.get(ck, 0) + nanos(value)
