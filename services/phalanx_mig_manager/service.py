"""mig-manager: the node agent that creates and destroys MIG instances per pod (R3, R9).

It consumes its node's commands on ``phx.node.<node>.mig`` and replies on
``phx.node.<node>.reply``:

* ``MigPrepareRequested`` → create a GPU instance of ``profile`` at ``start`` on ``gpu`` (plus
  its compute instance), **list the GPU again to verify it exists**, and reply ``MigReady``
  with its MIG device UUID; any NVML refusal, a GPU not in MIG mode, or an instance that does not
  show up replies ``MigFailed`` with the reason. MIG mode itself is never changed.
* ``MigDestroyRequested`` → destroy the pod's instance (idempotent: nothing there is success)
  and reply ``MigDestroyed``.

Idempotency: ownership lives in KV ``phx-mig`` under the node's own key, one ``NodeMig``
holding a record per slot ``<gpu>.<start>`` (``MigBook``, changed by compare-and-set). The
record is written *before* the create (state ``creating``, the intent) and updated after the
verify (``ready`` + UUID). A redelivered prepare (the process died between create and reply)
finds the record and the instance and replies ready without a second create.

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
    TemporaryError,
    consume,
    read_one,
)
from phalanx_mig_manager.devices import devices_from
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
from phalanx_proto.state import MigRecord, NodeMig, mig_slot
from phalanx_service.config import option, required
from phalanx_telemetry import log, warn

KV_MIG = S.KV_MIG


@dataclass(frozen=True)
class Config:
    """mig-manager's configuration: each ``option``/``required`` field is a flag of ``phalanx run mig-manager``."""

    node: str = required("this node's name", env="NODE_NAME")
    nvml: str = option("real", "'real' (the driver), or 'fake:<model>x<count>[@off][,...]' (tests and the "
                       "simulator only: phalanx_mig_manager.devices)", env="PHALANX_MIG_NVML")
    reconcile_s: float = option(30.0, "seconds between reconciliation passes")
    orphan_grace_s: float = option(60.0, "an instance owned by nothing is destroyed after this many seconds")
    devices: MigDevices | None = None  # no flag: the tests' devices (None: what ``nvml`` names)
    clock: Callable[[], float] = time.monotonic  # no flag: the tests' clock
"""Ownership records of MIG instances: one ``NodeMig`` per node, under the node's token (a
node's agent may write its own node's key only)."""
CAS_RETRIES = 20


@dataclass
class MigBook:
    """One node's ``NodeMig`` in ``phx-mig``: read it, change it by compare-and-set."""

    kv: Kv
    node: str

    @property
    def key(self) -> str:
        return S.token(self.node)

    async def read(self) -> tuple[NodeMig, int] | BadEntry:
        """The node's records and their revision (an empty book at revision 0 when absent), or
        the bad entry when the value cannot be believed."""
        rec = await read_one(self.kv, self.key)
        if rec is None:
            return NodeMig(node=self.node), 0
        if isinstance(rec, BadEntry):
            return rec
        return rec.value, rec.revision

    async def records(self) -> dict[str, MigRecord] | BadEntry:
        got = await self.read()
        return got if isinstance(got, BadEntry) else dict(got[0].instances)

    async def change(self, fn) -> NodeMig | BadEntry | None:
        """Apply ``fn(records) -> records | None`` (None: no change) by compare-and-set,
        retrying on conflict; returns the stored book, None when ``fn`` declined."""
        for _ in range(CAS_RETRIES):
            got = await self.read()
            if isinstance(got, BadEntry):
                return got
            book, revision = got
            new = fn(dict(book.instances))
            if new is None:
                return None
            stored = NodeMig(node=self.node, instances=dict(sorted(new.items())))
            data = msgspec.json.encode(stored)
            try:
                if revision:
                    await self.kv.update(self.key, data, last=revision)
                else:
                    await self.kv.create(self.key, data)
            except KvConflict:
                continue
            return stored
        raise TemporaryError(f"{KV_MIG}/{self.key} kept changing", delay=0.5)

    async def put(self, record: MigRecord, *, only_if: MigRecord | None = None) -> bool:
        """Store ``record`` at its slot when the slot holds ``only_if`` (None: is empty)."""
        slot = mig_slot(record.gpu, record.start)
        done = await self.change(lambda rs: {**rs, slot: record} if rs.get(slot) == only_if else None)
        return isinstance(done, NodeMig)

    async def drop(self, record: MigRecord) -> None:
        """Remove ``record`` from its slot, unless another record took the slot meanwhile."""
        slot = mig_slot(record.gpu, record.start)
        await self.change(lambda rs: {k: v for k, v in rs.items() if k != slot} if rs.get(slot) == record else None)


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
    """The ``phx-mig`` bucket (this node's key of it: ``book``)."""
    ledger: Kv | None = None
    orphan_grace_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    counters: Counters = field(default_factory=Counters)
    _orphans_seen: dict[tuple[int, int], float] = field(default_factory=dict)
    _nvml_warned: bool = False

    @property
    def book(self) -> MigBook:
        return MigBook(self.records, self.node)

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
        book = self.book
        records = await book.records()
        if isinstance(records, BadEntry):
            return self._failed(ev, f"GPU {ev.gpu} slot {ev.start}: the node's ownership records cannot be read "
                                    f"({records.error})")
        record = records.get(mig_slot(ev.gpu, ev.start))
        if record is not None and not record.owned_by(ev.gang_id, ev.attempt, ev.pod):
            return self._failed(ev, f"GPU {ev.gpu} slot {ev.start} is held by {record.pod} "
                                    f"(gang {record.gang_id} attempt {record.attempt})")
        await delivery.in_progress()
        existing = await self._find(ev.gpu, ev.start, ev.profile)
        if record is None:
            record = MigRecord(node=self.node, gpu=ev.gpu, start=ev.start, profile=ev.profile, gang_id=ev.gang_id,
                               attempt=ev.attempt, pod=ev.pod, updated_at=time.time())
            if not await book.put(record):
                raise TemporaryError("mig record written concurrently", delay=0.5)
            if existing is not None:  # not ours by record, and no record: someone else's instance
                await book.drop(record)
                return self._failed(ev, f"GPU {ev.gpu} slot {ev.start} already has a {existing.profile} instance "
                                        "not made for this pod")
        if existing is None:
            try:
                await self._nvml(self.devices.create, ev.gpu, ev.profile, ev.start)
            except MigError as e:
                await book.drop(record)
                return self._failed(ev, f"NVML refused {ev.profile} at slot {ev.start} on GPU {ev.gpu}: {e}")
            self.counters.created += 1
            await delivery.in_progress()
            existing = await self._find(ev.gpu, ev.start, ev.profile)
            if existing is None or not existing.uuid:
                await book.drop(record)
                return self._failed(ev, f"NVML reported {ev.profile} at slot {ev.start} on GPU {ev.gpu} created, "
                                        "but the instance is not listed")
        ready = msgspec.structs.replace(record, state="ready", uuid=existing.uuid, gi_id=existing.gi_id,
                                        updated_at=time.time())
        if record != ready and not await book.put(ready, only_if=record):
            raise TemporaryError("mig record changed while the instance was made", delay=0.5)
        log("mig instance ready", node=self.node, gang=ev.gang_id, attempt=ev.attempt, pod=str(ev.pod), gpu=ev.gpu,
            profile=ev.profile, start=ev.start, uuid=existing.uuid)
        return MigReady(node=self.node, gang_id=ev.gang_id, attempt=ev.attempt, pod=ev.pod,
                        instance_uuid=existing.uuid)

    async def destroy(self, ev: MigDestroyRequested, delivery: Delivery) -> MigDestroyed:
        """Destroy every instance recorded for this pod on ``gpu`` (by UUID when given, else for
        this gang and attempt). Nothing to destroy is success: the take may never have happened."""
        records = await self.book.records()
        if isinstance(records, BadEntry):
            raise TemporaryError(f"the node's MIG records cannot be read: {records.error}", delay=2.0)
        for record in records.values():
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
            await self.book.drop(record)  # a new owner's record written meanwhile stays
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

        A value that cannot be read never leads to a destroy: while this node's records or its
        ledger value are unreadable nothing is destroyed.
        """
        book = await self.book.records()
        if isinstance(book, BadEntry):
            return  # who owns what is unknown: destroying anything could hit a running pod
        records = {(r.gpu, r.start): r for r in book.values() if r.node == self.node}
        ledger = await self._ledger_slots()
        if isinstance(ledger, BadEntry):
            return  # the reservations are unknown: destroying anything could hit a running pod
        if ledger is None:
            owned = set(records)
        else:
            owned = set(ledger) | {slot for slot, r in records.items()
                                   if r.state != "ready" or ledger.get(slot) == str(r.pod)}
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
                    await self.book.drop(records[slot])  # a new owner's record written meanwhile stays
                self.counters.orphans_destroyed += 1
                warn("orphan mig instance destroyed", node=self.node, gpu=gpu, start=inst.start,
                     profile=inst.profile, uuid=inst.uuid, orphans_destroyed=self.counters.orphans_destroyed)
        for slot in list(self._orphans_seen):
            if slot not in present:
                del self._orphans_seen[slot]
        for slot, r in records.items():
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


async def run(bus: Bus, config: Config, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    """Run mig-manager for ``config.node`` until cancelled; ready once it has reconciled once.
    Its durable consumer is made by gang-coordinator before the node's first MIG command (a
    node agent may create no consumer: docs/security.md); until then it waits for it, and the
    commands wait in the stream."""
    node = config.node
    own = S.durable("mig-manager-{node}", node)
    records = await bus.kv(S.KV_MIG)
    ledger = await bus.kv(S.KV_LEDGER)
    devices = config.devices if config.devices is not None else devices_from(config.nvml, node)
    manager = MigManager(bus, node, devices, records, ledger, orphan_grace_s=config.orphan_grace_s, clock=config.clock)
    await manager.reconcile()
    async with anyio.create_task_group() as tg:
        await tg.start(_reconcile_loop, manager, config.reconcile_s)
        tg.start_soon(lambda: consume(
            bus, stream=own.stream, durable=own.durable, filter_subject=own.filter,
            decoder=node_decoder, handler=manager.on_command, create=False))
        task_status.started(manager)
