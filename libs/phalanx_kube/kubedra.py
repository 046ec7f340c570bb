"""The Dynamic Resource Allocation objects of a real API server (``resource.k8s.io/v1``): the
part of ``ClusterPort`` gang-coordinator reads (DeviceClasses, ResourceSlices, ResourceClaims,
listed and watched through ``phalanx_kube.reflector``) and binder writes (a claim's finalizer,
``status.allocation`` and ``status.reservedFor``, the extended-resource claim, the pod's
``status.extendedResourceClaimStatus``). ``KubeCluster`` mixes it in.

The write rules are ``phalanx_kube.claimwrites``'s, over the API's claims: updates are ``PUT``
with the resourceVersion read (409 is a conflict: read again), status updates ``PUT .../status``
(the API server also checks ``resourceclaims/binding`` for them, at the cluster scope); a write
the server refuses outright (400, 403, 422: validation, admission, authorization) is a
``ClaimRefused`` with its message, deletes carry the uid as precondition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kubernetes_asyncio import client

from phalanx_kube import claimwrites
from phalanx_kube.objtable import ObjectTable
from phalanx_kube.port import ClaimGone, ClaimRef, ClaimRefused, ObjectEvent
from phalanx_kube.reflector import Listed, Reflector, Watched
from phalanx_proto.dra import ClaimAllocation
from phalanx_proto.events import PodRef


class KubeDra:
    """Needs ``self._call``, ``self._acquire``, ``self._client`` and ``self._patch_pod`` (``KubeCluster``)."""

    @property
    def _resource(self) -> client.ResourceV1Api:
        api = self.__dict__.get("_resource_api")
        if api is None:
            api = self.__dict__["_resource_api"] = client.ResourceV1Api(self._client)  # type: ignore[attr-defined]
        return api

    def _reflector(self, what: str, method: Any) -> Reflector:
        return Reflector(what, method, call=self._call, acquire=self._acquire)  # type: ignore[attr-defined]

    async def _follow(self, reflector: Reflector) -> AsyncIterator[ObjectEvent | None]:
        table = ObjectTable()
        async with aclosing(reflector.changes()) as changes:
            async for change in changes:
                match change:
                    case Listed(items=items):
                        for ev in table.relisted(items):
                            yield ev
                        yield None
                    case Watched(type=etype, obj=obj):
                        for ev in table.watched(etype, obj):
                            yield ev

    # -- reads -------------------------------------------------------------------------------
    async def list_device_classes(self) -> list[dict[str, Any]]:
        items, _ = await self._reflector("deviceclasses", self._resource.list_device_class).list()
        return sorted(items, key=_name)

    def watch_device_classes(self) -> AsyncIterator[ObjectEvent | None]:
        return self._follow(self._reflector("deviceclasses", self._resource.list_device_class))

    async def list_resource_slices(self) -> list[dict[str, Any]]:
        items, _ = await self._reflector("resourceslices", self._resource.list_resource_slice).list()
        return sorted(items, key=_name)

    def watch_resource_slices(self) -> AsyncIterator[ObjectEvent | None]:
        return self._follow(self._reflector("resourceslices", self._resource.list_resource_slice))

    async def list_resource_claims(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return await _KubeClaims(self).list(namespace)

    def watch_resource_claims(self) -> AsyncIterator[ObjectEvent | None]:
        return self._follow(self._reflector("resourceclaims", self._resource.list_resource_claim_for_all_namespaces))

    async def get_resource_claim(self, claim: ClaimRef) -> dict[str, Any] | None:
        return await _KubeClaims(self).read(claim)

    # -- writes (binder) ---------------------------------------------------------------------
    async def reserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None) -> dict[str, Any]:
        return await claimwrites.reserve(_KubeClaims(self), claim, pod, allocation)

    async def unreserve_claim(self, claim: ClaimRef, pod: PodRef, allocation: ClaimAllocation | None = None) -> None:
        await claimwrites.unreserve(_KubeClaims(self), claim, pod, allocation)

    async def create_resource_claim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await claimwrites.create(_KubeClaims(self), obj)

    async def delete_resource_claim(self, claim: ClaimRef) -> None:
        body = {"preconditions": {"uid": claim.uid}} if claim.uid else {}
        await self._call(f"delete claim {claim}", self._resource.delete_namespaced_resource_claim,  # type: ignore[attr-defined]
                         claim.name, claim.namespace, body=body, ok=(404, 409))

    async def set_extended_claim_status(self, pod: PodRef, status: dict[str, Any] | None) -> None:
        await self._patch_pod(pod, {"status": {"extendedResourceClaimStatus": status}}, status=True)  # type: ignore[attr-defined]


class _KubeClaims:
    """``claimwrites.ClaimStore`` over the API server."""

    def __init__(self, kube: KubeDra) -> None:
        self._kube, self._api, self._call = kube, kube._resource, kube._call  # type: ignore[attr-defined]

    async def read(self, claim: ClaimRef) -> dict[str, Any] | None:
        status, body = await self._call(f"get claim {claim}", self._api.read_namespaced_resource_claim, claim.name,
                                        claim.namespace, ok=(404,))
        return None if status == 404 else body

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        if namespace is None:
            items, _ = await self._kube._reflector("resourceclaims",
                                                   self._api.list_resource_claim_for_all_namespaces).list()
        else:
            _, body = await self._call(f"list claims of {namespace}", self._api.list_namespaced_resource_claim,
                                       namespace)
            items = body.get("items") or []
        return sorted(items, key=lambda o: (_namespace(o), _name(o)))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ns = _namespace(obj) or "default"
        status, body = await self._call(f"create claim in {ns}", self._api.create_namespaced_resource_claim, ns, obj,
                                        ok=(409, *REFUSED))
        _refused(f"create claim in {ns}", status, body)
        if status == 409:
            raise claimwrites.StoreConflict(body.get("message", "exists"))
        return body

    async def _replace(self, what: str, method: Any, obj: dict[str, Any]) -> dict[str, Any]:
        obj = {**obj, "metadata": {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}}
        ref = f"{_namespace(obj)}/{_name(obj)}"
        status, body = await self._call(f"{what} claim {ref}", method, _name(obj), _namespace(obj), obj,
                                        ok=(404, 409, *REFUSED))
        _refused(f"{what} claim {ref}", status, body)
        if status == 404:
            raise ClaimGone(f"claim {ref} not found")
        if status == 409:
            raise claimwrites.StoreConflict(body.get("message", "conflict"))
        return body

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._replace("update", self._api.replace_namespaced_resource_claim, obj)

    async def update_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._replace("update status of", self._api.replace_namespaced_resource_claim_status, obj)


REFUSED = (400, 403, 422)
"""Statuses of a claim write the API server refuses outright (``ClaimRefused``)."""


def _refused(what: str, status: int, body: Any) -> None:
    if status in REFUSED:
        msg = body.get("message", body) if isinstance(body, dict) else body
        raise ClaimRefused(f"{what}: HTTP {status}: {msg}")


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name") or ""


def _namespace(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("namespace") or ""
