"""The simulated cluster's Dynamic Resource Allocation objects (KV ``phx-sim-deviceclasses``,
``phx-sim-resourceslices`` by name, ``phx-sim-resourceclaims`` by ``<namespace>.<name>``): the
part of ``ClusterPort`` gang-coordinator reads and binder writes, and what the simulator and
the tests load (``apply_*``). ``KvCluster`` mixes it in; the buckets are opened on first use.

Objects are stored as the API server returns them (camelCase), without ``resourceVersion``: a
read sets it to the KV revision, and a write with a stale one conflicts, as on the API server.
The API server's rules the writes rely on are kept too: a claim with finalizers is only marked
deleting (``deletionTimestamp``) and goes when its last finalizer is removed; a status update
may not add a ``reservedFor`` entry to a deleting claim, nor reserve an unallocated one, nor
change an allocation (only set or clear it). The write rules themselves are
``phalanx_kube.claimwrites``'s, shared with the real adapter.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from phalanx_bus import KvConflict
from phalanx_kube import claimwrites
from phalanx_kube.apitime import iso
from phalanx_kube.objtable import ObjectTable
from phalanx_kube.port import ClaimGone, ClaimRef, ClaimRefused, ObjectEvent
from phalanx_proto import subjects as S
from phalanx_proto.dra import ClaimAllocation
from phalanx_proto.events import PodRef
from phalanx_proto.subjects import token

_json = msgspec.json.Encoder()
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server's generateName draws from


class ClaimInvalid(ClaimRefused, ValueError):
    """A write the API server refuses (422), with its words."""


def claim_key(namespace: str, name: str) -> str:
    return f"{token(namespace)}.{token(name)}"


def _read(entry: Any) -> dict[str, Any]:
    obj = msgspec.json.decode(entry.value)
    obj.setdefault("metadata", {})["resourceVersion"] = str(entry.revision)
    return obj


def _stored(obj: dict[str, Any]) -> bytes:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return _json.encode({**obj, "metadata": meta})


def _new_meta(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if namespace is not None:
        meta["namespace"] = meta.get("namespace") or namespace
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = iso(time.time())
    meta.pop("resourceVersion", None)
    return obj


class KvDra:
    """Needs ``self._bus`` and ``self._modify`` (``KvCluster``)."""

    async def _dra_kv(self, bucket: str):
        return await self._bus.kv(bucket, history=2)  # type: ignore[attr-defined]

    # -- loading (the simulator, tests: what a DRA driver or a user would create) --------------
    async def apply_device_class(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a DeviceClass (its uid kept when it exists)."""
        return await self._apply(S.KV_SIM_DEVICE_CLASSES, obj)

    async def apply_resource_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a ResourceSlice (its uid kept when it exists)."""
        return await self._apply(S.KV_SIM_RESOURCE_SLICES, obj)

    async def apply_resource_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaim (``kubectl create``: a name that exists is an error)."""
        try:
            return await _KvClaims(self).create(obj)
        except claimwrites.StoreConflict as e:
            raise ValueError(str(e)) from e

    async def delete_device_class(self, name: str) -> None:
        await (await self._dra_kv(S.KV_SIM_DEVICE_CLASSES)).delete(token(name))

    async def delete_resource_slice(self, name: str) -> None:
        await (await self._dra_kv(S.KV_SIM_RESOURCE_SLICES)).delete(token(name))

    async def _apply(self, bucket: str, obj: dict[str, Any]) -> dict[str, Any]:
        kv = await self._dra_kv(bucket)
        key = token(obj["metadata"]["name"])
        old = await kv.get(key)
        new = _new_meta(obj, None)
        if old is not None:
            prior = msgspec.json.decode(old.value)["metadata"]
            new["metadata"].update(uid=prior.get("uid"), creationTimestamp=prior.get("creationTimestamp"))
        rev = await kv.put(key, _stored(new))
        new["metadata"]["resourceVersion"] = str(rev)
        return new

    # -- reads ---------------------------------------------------------------------------------
    async def _list(self, bucket: str, pattern: str = ">") -> list[dict[str, Any]]:
        objs = [_read(e) for e in await (await self._dra_kv(bucket)).items(pattern)]
        return sorted(objs, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"].get("name") or ""))

    async def list_device_classes(self) -> list[dict[str, Any]]:
        return await self._list(S.KV_SIM_DEVICE_CLASSES)

    async def list_resource_slices(self) -> list[dict[str, Any]]:
        return await self._list(S.KV_SIM_RESOURCE_SLICES)

    async def list_resource_claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return await _KvClaims(self).list(namespace)

    def watch_device_classes(self) -> AsyncIterator[ObjectEvent | None]:
        return self._watch(S.KV_SIM_DEVICE_CLASSES)

    def watch_resource_slices(self) -> AsyncIterator[ObjectEvent | None]:
        return self._watch(S.KV_SIM_RESOURCE_SLICES)

    def watch_resource_claims(self) -> AsyncIterator[ObjectEvent | None]:
        return self._watch(S.KV_SIM_RESOURCE_CLAIMS)

    async def _watch(self, bucket: str) -> AsyncIterator[ObjectEvent | None]:
        """The bucket's values (a re-list after every break, diffed by ``ObjectTable``), then
        ``None``, then each change."""
        table = ObjectTable()
        by_key: dict[str, dict[str, Any]] = {}
        while True:
            listing: list[tuple[str, dict[str, Any]]] | None = []
            try:
                async for entry in (await self._dra_kv(bucket)).watch():
                    if entry is None:
                        if listing is not None:
                            by_key = dict(listing)
                            for ev in table.relisted([o for _, o in listing]):
                                yield ev
                            listing = None
                            yield None
                        continue
                    if listing is not None:
                        if not entry.deleted:
                            listing.append((entry.key, _read(entry)))
                        continue
                    if entry.deleted:
                        old = by_key.pop(entry.key, None)
                        events = table.watched("DELETED", old) if old is not None else []
                    else:
                        obj = by_key[entry.key] = _read(entry)
                        events = table.watched("MODIFIED", obj)
                    for ev in events:
                        yield ev
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - watch broke (server restart): list again
                await asyncio.sleep(0.5)

    async def get_resource_claim(self, claim: ClaimRef) -> dict[str, Any] | None:
        return await _KvClaims(self).read(claim)

    # -- writes (binder) -----------------------------------------------------------------------
    async def reserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> dict[str, Any]:
        return await claimwrites.reserve(_KvClaims(self), claim, pod, allocation)

    async def unreserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None = None) -> None:
        await claimwrites.unreserve(_KvClaims(self), claim, pod, allocation)

    async def create_resource_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await claimwrites.create(_KvClaims(self), obj)

    async def delete_resource_claim(self, claim: ClaimRef) -> None:
        await _KvClaims(self).delete(claim)

    async def set_extended_claim_status(self, pod: PodRef, status: dict[str, Any] | None) -> None:
        def change(obj: dict[str, Any]) -> None:
            st = obj.setdefault("status", {})
            if status is None:
                st.pop("extendedResourceClaimStatus", None)
            else:
                st["extendedResourceClaimStatus"] = status
        await self._modify(pod, change)  # type: ignore[attr-defined]


class _KvClaims:
    """``claimwrites.ClaimStore`` over ``phx-sim-resourceclaims``, with the API server's rules."""

    def __init__(self, dra: KvDra) -> None:
        self._dra = dra

    async def _kv(self):
        return await self._dra._dra_kv(S.KV_SIM_RESOURCE_CLAIMS)

    async def read(self, claim: ClaimRef) -> dict[str, Any] | None:
        entry = await (await self._kv()).get(claim_key(claim.namespace, claim.name))
        return None if entry is None else _read(entry)

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        return await self._dra._list(S.KV_SIM_RESOURCE_CLAIMS, ">" if namespace is None else f"{token(namespace)}.*")

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        new = _new_meta(obj, "default")
        new.setdefault("status", {})
        meta = new["metadata"]
        try:
            rev = await (await self._kv()).create(claim_key(meta["namespace"], meta["name"]), _stored(new))
        except KvConflict as e:
            raise claimwrites.StoreConflict(f"claim {meta['namespace']}/{meta['name']} exists") from e
        meta["resourceVersion"] = str(rev)
        return new

    async def _current(self, obj: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        meta = obj.get("metadata") or {}
        ref = f"{meta.get('namespace')}/{meta.get('name')}"
        entry = await (await self._kv()).get(claim_key(meta.get("namespace") or "", meta.get("name") or ""))
        if entry is None:
            raise ClaimGone(f"claim {ref} not found")
        if str(entry.revision) != str(meta.get("resourceVersion")):
            raise claimwrites.StoreConflict(f"claim {ref} changed since {meta.get('resourceVersion')}")
        return entry, _read(entry)

    async def _write(self, entry: Any, new: dict[str, Any]) -> dict[str, Any]:
        kv = await self._kv()
        try:
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                await kv.delete(entry.key, last=entry.revision)  # the last finalizer went: the claim goes
                return new
            rev = await kv.update(entry.key, _stored(new), last=entry.revision)
        except KvConflict as e:
            raise claimwrites.StoreConflict(str(e)) from e
        new["metadata"]["resourceVersion"] = str(rev)
        return new

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        entry, current = await self._current(obj)
        fixed = {k: current["metadata"].get(k) for k in ("namespace", "name", "uid", "creationTimestamp",
                                                          "deletionTimestamp") if current["metadata"].get(k)}
        return await self._write(entry, {**current, "metadata": {**obj.get("metadata", {}), **fixed}})

    async def update_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        entry, current = await self._current(obj)
        old, new = current.get("status") or {}, dict(obj.get("status") or {})
        name = f"ResourceClaim.resource.k8s.io \"{current['metadata'].get('name')}\" is invalid"
        added = {r.get("uid") for r in new.get("reservedFor") or []} - {r.get("uid") for r in old.get("reservedFor") or []}
        if new.get("reservedFor") and not new.get("allocation"):
            raise ClaimInvalid(f"{name}: status.reservedFor: Forbidden: may not be specified when `allocated` is not set")
        if old.get("allocation") and new.get("allocation") and old["allocation"] != new["allocation"]:
            raise ClaimInvalid(f"{name}: status.allocation: Invalid value: field is immutable")
        if added and current["metadata"].get("deletionTimestamp"):
            raise ClaimInvalid(f"{name}: status.reservedFor: Forbidden: new entries may not be added while "
                               "`deallocationRequested` or `deletionTimestamp` are set")
        return await self._write(entry, {**current, "status": new})

    async def delete(self, claim: ClaimRef) -> None:
        for _ in range(claimwrites.RETRIES):
            entry = await (await self._kv()).get(claim_key(claim.namespace, claim.name))
            if entry is None:
                return
            current = _read(entry)
            if claim.uid and current["metadata"].get("uid") != claim.uid:
                return
            try:
                if current["metadata"].get("finalizers"):
                    if not current["metadata"].get("deletionTimestamp"):
                        current["metadata"]["deletionTimestamp"] = iso(time.time())
                        await self._write(entry, current)
                    return
                await (await self._kv()).delete(entry.key, last=entry.revision)
                return
            except (KvConflict, claimwrites.StoreConflict):
                continue
