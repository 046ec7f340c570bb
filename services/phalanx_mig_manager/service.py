"""mig-manager: the node agent that creates and destroys MIG instances per pod (R3, R9).

It consumes its node's commands on ``phx.node.<node>.mig`` and replies on
``phx.node.<node>.reply``:

* ``MigPrepareRequested`` → create a GPU instance of ``profile`` at ``start`` on ``gpu`` (plus
  its compute instance), **list the GPU again to verify it exists**, and reply ``MigReady``
  with its MIG device UUID; any NVML refusal, a GPU not in MIG mode, or an instance that does not
  show up replies ``MigFailed`` with the reason. MIG mode itself is never changed.
* ``MigDestroyRequested`` → destroy the pod's instance (idempotent: nothing there is success)
  and reply ``MigDestroyed``.

Idempotency: ownership lives in KV ``phx-mig`` under ``<node>.<gpu>.<start>``. The record is
written *before* the create (state ``creating``, the intent) and updated after the verify
(``ready`` + UUID). A redelivered prepare (the process died between create and reply) finds the
record and the instance and replies ready without a second create.

Reconciliation (at start and every ``reconcile_s``): an instance owned neither by a live ledger
reservation (``phx-ledger``: an allocation on this node with ``mig_start``) nor by a record
(``creating``, or ``ready`` with its pod's reservation still there) is an orphan; one still
orphaned after ``orphan_grace_s`` is destroyed, logged and counted. Records whose instance is
missing are logged. A ``phx-mig`` or ``phx-ledger`` value that cannot be read is skipped and
counted (``phalanx_bus.records``) and never leads to a destroy. See ``docs/mig.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import msgspec

from phalanx_bus import (
    BadEntry,
    Bus,
    Delivery,
    Kv,
    KvConflict,
    KvEntry,
    TemporaryError,
    consume,
    read_all,
    read_one,
)
from phalanx_bus.records import check
from phalanx_nvml import MigDevices, MigError, MigInstanceInfo
from phalanx_proto import subjects as S
from phalanx_proto.events import (
    MigDestroyed,
    MigDestroyRequested,
    MigFailed,
    MigPrepareRequested,
    MigReady,
    node_decoder,
)
from phalanx_proto.state import MigRecord, mig_record_key
from phalanx_telemetry import log, warn

KV_MIG = S.KV_MIG
"""Ownership records of MIG instances (keys ``<node>.<gpu>.<start>``; a node's agent may
write its own node's keys only)."""
record_key = mig_record_key


def _slot_of(key: str) -> tuple[int, int] | None:
    """(gpu, start) from a record key ``<node>.<gpu>.<start>``."""
    parts = key.rsplit(".", 2)
    return (int(parts[1]), int(parts[2])) if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() else None


def not_mig_mode(gpu: int) -> str:
    return f"GPU {gpu} is not in MIG mode; an admin enables it with nvidia-smi -i {gpu} -mig 1"


@dataclass
class Counters:
    created: int = 0
    destroyed: int = 0
    orphans_destroyed: int = 0
    missing_instances: int = 0


@dataclass
class MigManager:
    bus: Bus
    node: str
    devices: MigDevices
    records: Kv
    """The ``phx-mig`` bucket."""
    ledger: Kv | None = None
    orphan_grace_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    counters: Counters = field(default_factory=Counters)
    _orphans_seen: dict[tuple[int, int], float] = field(default_factory=dict)
    _nvml_warned: bool = False

    # --- NVML in a worker thread --------------------------------------------------------

    async def _nvml(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args)

    async def _find(self, gpu: int, start: int, profile: str = "") -> MigInstanceInfo | None:
        for inst in await self._nvml(self.devices.list_instances, gpu):
            if inst.start == start and (not profile or inst.profile == profile):
                return inst
        return None

    # --- commands -----------------------------------------------------------------------

    async def on_command(self, event, delivery: Delivery) -> None:
        match event:
            case MigPrepareRequested():
                await self._reply(await self.prepare(event, delivery))
            case MigDestroyRequested():
                await self._reply(await self.destroy(event, delivery))
            case _:
                warn("unexpected event on mig subject", node=self.node, kind=type(event).__name__)

    async def _reply(self, event) -> None:
        await self.bus.publish(S.node_reply_subject(self.node), event)

    def _failed(self, ev, reason: str) -> MigFailed:
        warn("mig prepare failed", node=self.node, gang=ev.gang_id, attempt=ev.attempt, pod=str(ev.pod),
             gpu=ev.gpu, profile=ev.profile, start=ev.start, reason=reason)
        return MigFailed(node=self.node, gang_id=ev.gang_id, attempt=ev.attempt, pod=ev.pod, reason=reason)

    async def _mig_mode_problem(self, gpu: int) -> str:
        try:
            count = await self._nvml(self.devices.gpu_count)
        except MigError as e:
            return f"NVML is not usable on node {self.node}: {e}"
        if gpu >= count:
            return f"GPU {gpu} does not exist on node {self.node}"
        try:
            if not await self._nvml(self.devices.mig_enabled, gpu):
                return not_mig_mode(gpu)
        except MigError as e:
            try:
                model, _ = await self._nvml(self.devices.describe, gpu)
            except MigError:
                model = "unknown model"
            return f"GPU {gpu} ({model}) does not support MIG: {e}"
        return ""

    async def prepare(self, ev: MigPrepareRequested, delivery: Delivery) -> MigReady | MigFailed:
        """Create-and-verify with an intent record first (overview in the module docstring)."""
        problem = await self._mig_mode_problem(ev.gpu)
        if problem:
            return self._failed(ev, problem)
        key = record_key(self.node, ev.gpu, ev.start)
        entry = await self.records.get(key)
        checked = check(S.KV_MIG, entry) if entry else None
        if isinstance(checked, BadEntry):
            return self._failed(ev, f"GPU {ev.gpu} slot {ev.start}: its ownership record cannot be read ({checked.error})")
        record = checked.value if checked else None
        if record is not None and not record.owned_by(ev.gang_id, ev.attempt, ev.pod):
            return self._failed(ev, f"GPU {ev.gpu} slot {ev.start} is held by {record.pod} "
                                    f"(gang {record.gang_id} attempt {record.attempt})")
        await delivery.in_progress()
        existing = await self._find(ev.gpu, ev.start, ev.profile)
        if record is None:
            record = MigRecord(node=self.node, gpu=ev.gpu, start=ev.start, profile=ev.profile, gang_id=ev.gang_id,
                               attempt=ev.attempt, pod=ev.pod, updated_at=time.time())
            try:
                revision = await self.records.create(key, msgspec.json.encode(record))
            except KvConflict as e:
                raise TemporaryError("mig record written concurrently", delay=0.5) from e
            if existing is not None:  # not ours by record, and no record: someone else's instance
                await self.records.delete(key, last=revision)
                return self._failed(ev, f"GPU {ev.gpu} slot {ev.start} already has a {existing.profile} instance "
                                        "not made for this pod")
        else:
            revision = entry.revision
        if existing is None:
            try:
                await self._nvml(self.devices.create, ev.gpu, ev.profile, ev.start)
            except MigError as e:
                await self.records.delete(key, last=revision)
                return self._failed(ev, f"NVML refused {ev.profile} at slot {ev.start} on GPU {ev.gpu}: {e}")
            self.counters.created += 1
            await delivery.in_progress()
            existing = await self._find(ev.gpu, ev.start, ev.profile)
            if existing is None or not existing.uuid:
                await self.records.delete(key, last=revision)
                return self._failed(ev, f"NVML reported {ev.profile} at slot {ev.start} on GPU {ev.gpu} created, "
                                        "but the instance is not listed")
        ready = msgspec.structs.replace(record, state="ready", uuid=existing.uuid, gi_id=existing.gi_id,
                                        updated_at=time.time())
        if record != ready:
            await self.records.update(key, msgspec.json.encode(ready), last=revision)
        log("mig instance ready", node=self.node, gang=ev.gang_id, attempt=ev.attempt, pod=str(ev.pod), gpu=ev.gpu,
            profile=ev.profile, start=ev.start, uuid=existing.uuid)
        return MigReady(node=self.node, gang_id=ev.gang_id, attempt=ev.attempt, pod=ev.pod,
                        instance_uuid=existing.uuid)

    async def destroy(self, ev: MigDestroyRequested, delivery: Delivery) -> MigDestroyed:
        """Destroy every instance recorded for this pod on ``gpu`` (by UUID when given, else for
        this gang and attempt). Nothing to destroy is success: the take may never have happened."""
        good, _ = await read_all(self.records, pattern=f"{S.token(self.node)}.>")
        for rec in good:
            record, entry = rec.value, rec
            if record.node != self.node or record.gpu != ev.gpu or str(record.pod) != str(ev.pod):
                continue
            if ev.instance_uuid and record.uuid and record.uuid != ev.instance_uuid:
                continue
            if not ev.instance_uuid and (record.gang_id, record.attempt) != (ev.gang_id, ev.attempt):
                continue
            await delivery.in_progress()
            inst = await self._find(record.gpu, record.start, record.profile)
            if inst is not None and await self._nvml(self.devices.destroy, inst.gpu, inst.gi_id):
                self.counters.destroyed += 1
                log("mig instance destroyed", node=self.node, gang=ev.gang_id, pod=str(ev.pod), gpu=inst.gpu,
                    start=inst.start, uuid=inst.uuid)
            try:
                await self.records.delete(entry.key, last=entry.revision)
            except KvConflict:
                pass  # rewritten meanwhile (a new owner): leave it
        return MigDestroyed(node=self.node, gang_id=ev.gang_id, attempt=ev.attempt, pod=ev.pod)

    # --- reconciliation -----------------------------------------------------------------

    async def _ledger_slots(self) -> dict[tuple[int, int], str] | BadEntry | None:
        """(gpu, start) → pod of every MIG reservation on this node; None without a ledger;
        the bad entry when this node's ledger value cannot be read."""
        if self.ledger is None:
            return None
        entry = await read_one(self.ledger, S.token(self.node))
        slots: dict[tuple[int, int], str] = {}
        if entry is None:
            return slots
        if isinstance(entry, BadEntry):
            return entry
        for alloc in entry.value.allocations.values():
            a = alloc.assignment
            if a.node == self.node and a.mig_profile and a.mig_start >= 0:
                slots |= {(g, a.mig_start): str(a.pod) for g in a.gpus}
        return slots

    async def reconcile(self) -> None:
        """Destroy instances owned by nothing once they stay so for the grace; log records
        without an instance.

        Owned means: reserved in the ledger, or named by a record that is still ``creating``
        (a prepare in flight), or by a ``ready`` record whose pod still holds the reservation.
        A ``ready`` record whose reservation is gone (the pod was deleted and placement gave
        the reservation back) no longer owns its instance, so it is destroyed after the grace
        and the record removed: R3's "destroyed when the pod goes away" even when no destroy
        command comes. Without a ledger bucket every record owns its slot.

        A value that cannot be read never leads to a destroy: a slot whose record is unreadable
        counts as owned, and while this node's ledger value is unreadable nothing is destroyed.
        """
        records: dict[tuple[int, int], tuple[MigRecord, KvEntry]] = {}
        good, bad = await read_all(self.records, pattern=f"{S.token(self.node)}.>")
        for rec in good:
            r = rec.value
            if r.node == self.node:
                records[(r.gpu, r.start)] = (r, KvEntry(rec.key, b"", rec.revision))
        unreadable = {_slot_of(b.key) for b in bad if b.key.startswith(f"{S.token(self.node)}.")} - {None}
        ledger = await self._ledger_slots()
        if isinstance(ledger, BadEntry):
            return  # the reservations are unknown: destroying anything could hit a running pod
        if ledger is None:
            owned = set(records)
        else:
            owned = set(ledger) | {slot for slot, (r, _) in records.items()
                                   if r.state != "ready" or ledger.get(slot) == str(r.pod)}
        owned |= unreadable
        now, present = self.clock(), set()
        try:
            count = await self._nvml(self.devices.gpu_count)
        except MigError as e:
            if not self._nvml_warned:
                self._nvml_warned = True
                warn("mig reconcile skipped: NVML not usable", node=self.node, error=str(e))
            return
        for gpu in range(count):
            try:
                if not await self._nvml(self.devices.mig_enabled, gpu):
                    continue
            except MigError:
                continue
            for inst in await self._nvml(self.devices.list_instances, gpu):
                slot = (gpu, inst.start)
                present.add(slot)
                if slot in owned:
                    self._orphans_seen.pop(slot, None)
                    continue
                first = self._orphans_seen.setdefault(slot, now)
                if now - first < self.orphan_grace_s:
                    continue
                await self._nvml(self.devices.destroy, gpu, inst.gi_id)
                self._orphans_seen.pop(slot, None)
                if slot in records:
                    try:
                        await self.records.delete(records[slot][1].key, last=records[slot][1].revision)
                    except KvConflict:
                        pass  # a new owner wrote it meanwhile
                self.counters.orphans_destroyed += 1
                warn("orphan mig instance destroyed", node=self.node, gpu=gpu, start=inst.start,
                     profile=inst.profile, uuid=inst.uuid, orphans_destroyed=self.counters.orphans_destroyed)
        for slot in list(self._orphans_seen):
            if slot not in present:
                del self._orphans_seen[slot]
        for slot, (r, _) in records.items():
            if slot not in present and r.state == "ready":
                self.counters.missing_instances += 1
                warn("mig record without instance", node=self.node, gpu=r.gpu, start=r.start, pod=str(r.pod),
                     gang=r.gang_id, uuid=r.uuid)


async def _reconcile_loop(manager: MigManager, every_s: float, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        await anyio.sleep(every_s)
        try:
            await manager.reconcile()
        except Exception as e:  # noqa: BLE001 - the loop outlives a failed pass
            warn("mig reconcile failed", node=manager.node, error=repr(e))


async def run(bus: Bus, node: str, devices: MigDevices, *, reconcile_s: float = 30.0, orphan_grace_s: float = 60.0,
              clock: Callable[[], float] = time.monotonic, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run mig-manager for ``node`` until cancelled; ready once it has reconciled once and its
    consumer is live."""
    own = S.durable("mig-manager-{node}", node)
    records = await bus.kv(S.KV_MIG)
    ledger = await bus.kv(S.KV_LEDGER)
    manager = MigManager(bus, node, devices, records, ledger, orphan_grace_s=orphan_grace_s, clock=clock)
    await manager.reconcile()
    async with anyio.create_task_group() as tg:
        await tg.start(_reconcile_loop, manager, reconcile_s)
        await tg.start(lambda task_status: consume(
            bus, stream=own.stream, durable=own.durable, filter_subject=own.filter,
            decoder=node_decoder, handler=manager.on_command, task_status=task_status))
        task_status.started(manager)
