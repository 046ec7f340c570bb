"""The ResourceClaim writes binder makes before a pod's Binding, written once for both adapters
over a small store (``ClaimStore``: the API server's claims and ``/status``, or the simulator's
KV bucket), so the real cluster and the simulator follow the same rules (and the contract suite
checks that they do).

``reserve``, as kube-scheduler's PreBind ``bindClaim``: with an allocation of Phalanx's, the
finalizer ``resource.kubernetes.io/delete-protection`` first (an update of the claim), then
``status.allocation`` and the pod appended to ``status.reservedFor`` in one status update; each
write carries the resourceVersion read, and a conflict reads again. A claim that got another
allocation meanwhile, lost its allocation, or is being deleted is refused (``ClaimConflict``).

``unreserve`` is its compensation: the pod out of ``reservedFor``, and Phalanx's allocation
cleared (then the finalizer removed) once nobody else holds the claim, as kube-scheduler's
PostFilter deallocates and the resourceclaim controller drops the finalizer.

``create`` makes a claim at most once per owner and content (``generateName`` makes a new name
on every call, so a repeated call must find the first one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from phalanx_kube.port import ClaimConflict, ClaimGone, ClaimRef
from phalanx_kubeobjects import dra
from phalanx_kubeobjects.violations import Violation
from phalanx_proto.dra import FINALIZER, MAX_RESERVED_FOR, ClaimAllocation
from phalanx_proto.events import PodRef

RETRIES = 20


class StoreConflict(Exception):
    """The claim changed since its resourceVersion was read (or, on create, the name is taken)."""


class ClaimStore(Protocol):
    """What the writes need of a backend. Objects carry ``metadata.resourceVersion``; ``update``
    and ``update_status`` write only when it is still current (else ``StoreConflict``) and raise
    ``ClaimGone`` when the claim is gone; ``update`` ignores ``status``, ``update_status`` all but it."""

    async def read(self, claim: ClaimRef) -> dict[str, Any] | None: ...

    async def list(self, namespace: str) -> list[dict[str, Any]]: ...

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def update_status(self, obj: dict[str, Any]) -> dict[str, Any]: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _status(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def devices_of(allocation: Mapping[str, Any] | None) -> frozenset[tuple[str, ...]]:
    """What identifies an allocation: its results' (request, driver, pool, device, share)."""
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return frozenset((r.get("request", ""), r.get("driver", ""), r.get("pool", ""), r.get("device", ""),
                      r.get("shareID") or "") for r in results if isinstance(r, Mapping))


def _with_finalizers(obj: dict[str, Any], finalizers: list[str]) -> dict[str, Any]:
    meta = {**_meta(obj), "finalizers": finalizers}
    if not finalizers:
        meta.pop("finalizers")
    return {**obj, "metadata": meta}


async def _read(store: ClaimStore, claim: ClaimRef) -> dict[str, Any]:
    obj = await store.read(claim)
    if obj is None or (claim.uid and _meta(obj).get("uid") != claim.uid):
        raise ClaimGone(f"claim {claim} not found" + (f" with uid {claim.uid}" if obj is not None else ""))
    return obj


async def reserve(store: ClaimStore, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> dict[str, Any]:
    """``ClusterPort.reserve_claim`` (module docstring)."""
    want = None if allocation is None else dra.allocation_status(allocation)
    for _ in range(RETRIES):
        obj = await _read(store, claim)
        status = _status(obj)
        current, reserved = status.get("allocation"), list(status.get("reservedFor") or [])
        if want is not None and current and devices_of(current) != devices_of(want):
            raise ClaimConflict(f"claim {claim} got allocated elsewhere in the meantime")
        if current and any(r.get("uid") == pod.uid for r in reserved):
            return obj  # done before: the pod is reserved, with this allocation
        if deleting(obj):
            raise ClaimConflict(f"claim {claim} is being deleted")
        if want is None and not current:
            raise ClaimConflict(f"claim {claim} is not allocated (its allocation was removed in the meantime)")
        if len(reserved) >= MAX_RESERVED_FOR:
            raise ClaimConflict(f"claim {claim} is reserved for {len(reserved)} consumers, the most it may have")
        try:
            finalizers = list(_meta(obj).get("finalizers") or [])
            if want is not None and FINALIZER not in finalizers:
                obj = await store.update(_with_finalizers(obj, [*finalizers, FINALIZER]))
            status = {**_status(obj), "allocation": current or want, "reservedFor": [*reserved, dra.reserved_for_entry(pod)]}
            return await store.update_status({**obj, "status": status})
        except StoreConflict:
            continue
    raise RuntimeError(f"claim {claim}: too many concurrent updates")


async def unreserve(store: ClaimStore, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> None:
    """``ClusterPort.unreserve_claim`` (module docstring)."""
    ours = None if allocation is None else devices_of(dra.allocation_status(allocation))
    for _ in range(RETRIES):
        try:
            obj = await _read(store, claim)
        except ClaimGone:
            return
        status = _status(obj)
        reserved = list(status.get("reservedFor") or [])
        left = [r for r in reserved if r.get("uid") != pod.uid]
        current = status.get("allocation")
        clear = ours is not None and bool(current) and not left and devices_of(current) == ours
        try:
            if len(left) != len(reserved) or clear:
                status.pop("reservedFor", None)
                if left:
                    status["reservedFor"] = left
                if clear:
                    status.pop("allocation", None)
                    status.pop("devices", None)
                obj = await store.update_status({**obj, "status": status})
            finalizers = list(_meta(obj).get("finalizers") or [])
            if ours is not None and not _status(obj).get("allocation") and FINALIZER in finalizers:
                await store.update(_with_finalizers(obj, [f for f in finalizers if f != FINALIZER]))
            return
        except StoreConflict:
            continue
        except ClaimGone:
            return
    raise RuntimeError(f"claim {claim}: too many concurrent updates")


def _controller(obj: Mapping[str, Any]) -> str:
    owners = [o for o in _meta(obj).get("ownerReferences") or [] if isinstance(o, Mapping) and o.get("controller")]
    return owners[0].get("uid", "") if owners else ""


def _content(obj: Mapping[str, Any]) -> object:
    spec = dra.claim_spec({**obj, "metadata": {"name": "x", "namespace": "x"}, "status": {}}, {})
    if isinstance(spec, Violation):
        return (obj.get("spec") or {})
    return (spec.requests, spec.constraints, spec.config)


def same_claim(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """``existing`` is the claim ``wanted`` describes: same controller owner, the annotations
    asked, the same requests, constraints and config (defaults applied)."""
    annotations = _meta(existing).get("annotations") or {}
    return (_controller(existing) == _controller(wanted)
            and all(annotations.get(k) == v for k, v in (_meta(wanted).get("annotations") or {}).items())
            and _content(existing) == _content(wanted))


async def create(store: ClaimStore, obj: dict[str, Any]) -> dict[str, Any]:
    """``ClusterPort.create_resource_claim`` (module docstring)."""
    meta = _meta(obj)
    namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
    if not name:
        for existing in await store.list(namespace):
            if not deleting(existing) and same_claim(existing, obj):
                return existing
        return await store.create(obj)
    for _ in range(2):
        named = await store.read(ClaimRef(namespace=namespace, name=name))
        if named is not None:
            if same_claim(named, obj):
                return named
            raise ClaimConflict(f"claim {namespace}/{name} exists and is another claim")
        try:
            return await store.create(obj)
        except StoreConflict:
            continue
    raise ClaimConflict(f"claim {namespace}/{name} exists and is another claim")
