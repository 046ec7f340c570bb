"""The DRA book: DeviceClasses, ResourceSlices and ResourceClaims as gang-coordinator knows them,
brought onto the bus for placement, and the claims each pod uses (docs/dra.md).

* **Pools.** Three watches (``ClusterPort.watch_device_classes``/``watch_resource_slices``/
  ``watch_resource_claims``) keep the objects, read by ``phalanx_kubeobjects.dra``. Each pool
  (``(driver, pool)``) becomes one ``DraPool`` in KV ``phx-dra``: every slice of it, of every
  generation seen (which count is the engine's rule), and every device a ResourceClaim's
  allocation holds in it — whoever allocated it. Changes are gathered for ``flush_s`` and each
  changed pool written once; a pool with no slice and nothing in use leaves the bucket. A slice
  that does not read is left out of its pool with a warning naming field and rule, and the pool
  says so (``problem``): its devices are not given until the slice reads.
* **Which claims a pod uses.** ``resolve(pod)`` answers with each ``spec.resourceClaims`` entry's
  claim (``PodClaim``: its requests, each request's DeviceClass resolved), or why the pod must wait
  (a template's claim not created yet, a claim not seen yet: read from the API server before the
  pod is told to wait), or why it cannot be admitted (the claim does not read, or was made for
  another pod). The pod's watch event that brings ``status.resourceClaimStatuses`` admits it. A
  pod asking for an extended resource that a DeviceClass serves (``extendedResourceName``,
  KEP-5004) also carries the claim Phalanx would make for it, used only on nodes without that
  resource's device plugin.
* **Wake-ups.** Once the objects are listed, a pool that gained devices or lost a holder, or a
  class that changed, fires ``changed``: the gangs that fit no node set are tried again (a claim
  merely allocated takes devices, which no waiting gang needs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from phalanx_bus import Bus
from phalanx_gang_coordinator.changes import Signal
from phalanx_kube.port import ClaimRef, ClusterPort, ObjectEvent, Pod
from phalanx_kubeobjects import dra as K
from phalanx_kubeobjects.violations import Violation
from phalanx_proto import subjects as S
from phalanx_proto.dra import (
    ClaimSpec,
    DeviceClassRef,
    DeviceRequest,
    DraPool,
    ExactRequest,
    InUse,
    PodClaim,
    Slice,
    pool_key,
)
from phalanx_proto.events import encoder
from phalanx_telemetry import log, warn

FLUSH_S = 0.05
"""How long changes are gathered before the changed pools are written."""

PoolId = tuple[str, str]


class Waiting(str):
    """Why a pod waits for its claims (it is not refused: the claims are on their way)."""


class DraBook:
    def __init__(self, bus: Bus, cluster: ClusterPort, *, changed: Signal | None = None,
                 flush_s: float = FLUSH_S) -> None:
        self.bus = bus
        self.cluster = cluster
        self.changed = changed or Signal()
        self.flush_s = flush_s
        self.classes: dict[str, DeviceClassRef] = {}
        self.class_problems: dict[str, str] = {}
        self._class_objects: dict[str, dict[str, Any]] = {}
        self.extended: dict[str, str] = {}
        """Extended resource name → the DeviceClass that serves it on nodes without its device
        plugin (KEP-5004, ``phalanx_kubeobjects.dra.extended_resource_classes``)."""
        self.slices: dict[str, tuple[PoolId, Slice | None, str]] = {}
        """Slice name → its pool, the slice (None: it does not read) and why not."""
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        """(namespace, name) → the claim object as last seen."""
        self._in_use: dict[str, tuple[tuple[PoolId, InUse], ...]] = {}
        """Claim key → the devices its allocation holds."""
        self._pools: dict[PoolId, set[str]] = {}
        """Pool → its slice names."""
        self._holders: dict[PoolId, dict[str, tuple[InUse, ...]]] = {}
        """Pool → claim key → what that claim holds there."""
        self._dirty: set[PoolId] = set()
        self._written: dict[PoolId, DraPool] = {}
        self._kick = anyio.Event()
        self._flushing = anyio.Lock()
        """One flush at a time: a caller that flushes returns once what it saw is written."""
        self._listed: set[str] = set()

    @property
    def listed(self) -> bool:
        """All three kinds were listed once."""
        return len(self._listed) == 3

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the three kinds until cancelled; started once each was listed and the pools written."""
        async with anyio.create_task_group() as tg:
            for kind, watch, on in (("classes", self.cluster.watch_device_classes, self._class),
                                    ("slices", self.cluster.watch_resource_slices, self._slice),
                                    ("claims", self.cluster.watch_resource_claims, self._claim)):
                await tg.start(self._follow, kind, watch, on)
            await self.flush()
            tg.start_soon(self._flusher)
            task_status.started()

    async def _follow(self, kind: str, watch: Callable[[], AsyncIterator[ObjectEvent | None]],
                      on: Callable[[ObjectEvent], None], *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        async for ev in watch():
            if ev is None:
                self._listed.add(kind)
                if not started:
                    started = True
                    task_status.started()
                continue
            try:
                on(ev)
            except Exception as e:  # noqa: BLE001 - one object never stops the watch
                warn("dra object not handled", kind=kind, name=f"{ev.namespace}/{ev.name}", error=repr(e)[:300])
            self._kick.set()

    # -- the watches' callbacks ------------------------------------------------------------------
    def _class(self, ev: ObjectEvent) -> None:
        if ev.type == "DELETED":
            self.classes.pop(ev.name, None)
            self.class_problems.pop(ev.name, None)
            self._class_objects.pop(ev.name, None)
        else:
            self._class_objects[ev.name] = ev.obj
            got = K.device_class(ev.obj)
            if isinstance(got, Violation):
                self.classes.pop(ev.name, None)
                self.class_problems[ev.name] = str(got)
                warn("device class unreadable", device_class=ev.name, error=str(got))
            else:
                self.classes[got.name] = got
                self.class_problems.pop(got.name, None)
        self.extended = K.extended_resource_classes(self._class_objects.values())
        if self.listed:
            self.changed.fire()

    def _slice(self, ev: ObjectEvent) -> None:
        old = self.slices.pop(ev.name, None)
        if old is not None:
            self._pools.get(old[0], set()).discard(ev.name)
            self._dirty.add(old[0])
        if ev.type == "DELETED":
            return
        got = K.resource_slice(ev.obj)
        if isinstance(got, Violation):
            spec = ev.obj.get("spec") or {}
            pool = (str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or ""))
            warn("resource slice unreadable", slice=ev.name, error=str(got))
            self.slices[ev.name] = (pool, None, str(got))
        else:
            driver, name, s = got
            pool = (driver, name)
            self.slices[ev.name] = (pool, s, "")
        self._pools.setdefault(pool, set()).add(ev.name)
        self._dirty.add(pool)

    def _claim(self, ev: ObjectEvent) -> None:
        key = (ev.namespace, ev.name)
        if ev.type == "DELETED":
            self.claims.pop(key, None)
        else:
            self.claims[key] = ev.obj
        ck = K.claim_key(ev.obj)
        held = () if ev.type == "DELETED" else tuple(((d, p), u) for d, p, u in K.claim_in_use(ev.obj))
        before = self._in_use.pop(ck, ())
        if held:
            self._in_use[ck] = held
        for pool, _ in before:
            self._holders.get(pool, {}).pop(ck, None)
            self._dirty.add(pool)
        for pool in {p for p, _ in held}:
            self._holders.setdefault(pool, {})[ck] = tuple(u for p, u in held if p == pool)
            self._dirty.add(pool)

    # -- writing the pools -------------------------------------------------------------------------
    async def _flusher(self) -> None:
        while True:
            await self._kick.wait()
            await anyio.sleep(self.flush_s)
            self._kick = anyio.Event()
            try:
                await self.flush()
            except Exception as e:  # noqa: BLE001 - the pools stay dirty; the next change or kick retries
                warn("dra pools not written", error=repr(e)[:300])
                self._kick.set()
                await anyio.sleep(1.0)

    def pool(self, pool: PoolId) -> DraPool | None:
        """The pool's value as the book holds it now; None when it has no slice and nothing in use."""
        names = sorted(self._pools.get(pool, ()))
        slices = [self.slices[n] for n in names if n in self.slices]
        holders = self._holders.get(pool, {})
        if not slices and not holders:
            return None
        problems = [f"slice {n}: {why}" for n, (_, s, why) in zip(names, slices, strict=True) if s is None]
        in_use = tuple(u for ck in sorted(holders) for u in holders[ck])
        return DraPool(driver=pool[0], pool=pool[1], slices=tuple(s for _, s, _ in slices if s is not None),
                       in_use=in_use, problem="; ".join(problems)[:1000])

    async def flush(self) -> None:
        """Write every changed pool to ``phx-dra`` (delete those that are gone)."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        kv = await self.bus.kv(S.KV_DRA)
        woken = False
        try:
            for pool in sorted(dirty):
                value, before = self.pool(pool), self._written.get(pool)
                if value == before:
                    continue
                key = pool_key(*pool)
                if value is None:
                    await kv.delete(key)
                    self._written.pop(pool, None)
                else:
                    await kv.put(key, encoder.encode(value))
                    self._written[pool] = value
                    log("dra pool written", driver=pool[0], pool=pool[1], slices=len(value.slices),
                        in_use=len(value.in_use))
                woken = woken or _frees(before, value)
                dirty.discard(pool)
        finally:
            self._dirty |= dirty
        if woken and self.listed:
            self.changed.fire()

    # -- a pod's claims ------------------------------------------------------------------------------
    def concerns(self, pod: Pod) -> bool:
        """Does the pod name ResourceClaims, or ask for an extended resource a DeviceClass serves?"""
        spec = pod.raw.get("spec") or {}
        if spec.get("resourceClaims"):
            return True
        if not self.extended:
            return False
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            res = (c or {}).get("resources") or {}
            if any(k in self.extended for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}):
                return True
        return False

    async def resolve(self, pod: Pod) -> tuple[PodClaim, ...] | Waiting | Violation:
        """The claims ``pod`` uses (module docstring); ``()`` for a pod without claims. A pod
        asking for an extended resource a DeviceClass serves also gets the claim Phalanx would
        make for it on a node without that resource's device plugin (``ClaimSpec.extended``:
        the engine uses it only on such a node, binder creates it)."""
        claims = await self._named(pod)
        if not isinstance(claims, tuple):
            return claims
        await self.flush()  # placement decides on the pools as this book has seen them now
        ext = self._extended(pod)
        return claims if not isinstance(ext, PodClaim) else (*claims, ext)

    def _extended(self, pod: Pod) -> PodClaim | Violation | None:
        if not self.extended:
            return None
        requests = K.extended_requests(pod.raw, self.extended)
        if isinstance(requests, Violation) or not requests:
            return requests or None
        spec = ClaimSpec(namespace=pod.namespace, name="", uid=f"extended:{pod.uid}", extended=True,
                         extended_requests=requests, requests=tuple(
                             DeviceRequest(name=r.request, exactly=ExactRequest(
                                 device_class=self.classes.get(r.device_class) or DeviceClassRef(
                                     name=r.device_class, missing=True), count=r.count))
                             for r in requests))
        return PodClaim(name="", claim=spec)

    async def _named(self, pod: Pod) -> tuple[PodClaim, ...] | Waiting | Violation:
        entries = K.pod_claims(pod.raw)
        if isinstance(entries, Violation):
            return entries
        out = []
        for pod_claim, name in entries:
            if name is None:
                continue  # the template said no claim is needed
            if isinstance(name, K.Waiting):
                return Waiting(name.reason)
            obj = self.claims.get((pod.namespace, name))
            if obj is None:
                obj = await self.cluster.get_resource_claim(ClaimRef(namespace=pod.namespace, name=name))
                if obj is None:
                    return Waiting(f'pod "{pod.namespace}/{pod.name}": ResourceClaim {pod.namespace}/{name} '
                                   "does not exist yet")
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                return Waiting(f'resourceclaim "{name}" is being deleted')
            why = K.claim_for_pod(obj, pod.raw, pod_claim)
            if why:
                return Violation(f"spec.resourceClaims[{pod_claim}]", name, why)
            spec = K.claim_spec(obj, self.classes)
            if isinstance(spec, Violation):
                return spec
            out.append(PodClaim(name=pod_claim, claim=spec))
        return tuple(out)


def _frees(before: DraPool | None, after: DraPool | None) -> bool:
    """Could a gang that did not fit fit now: the pool has other slices, or a holder let go?"""
    if after is None:
        return False
    if before is None or before.slices != after.slices:
        return True
    held = {(u.device, u.claim) for u in after.in_use}
    return any((u.device, u.claim) not in held for u in before.in_use)
