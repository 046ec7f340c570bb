"""Leases on a real API server (``coordination.k8s.io/v1``; the per-node fences of
``phalanx_kube.fence``): ``KubeCluster`` mixes it in. Every write is a compare-and-set on the
lease's resourceVersion; a lost race is ``LeaseConflict``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from phalanx_kube.apitime import epoch, iso
from phalanx_kube.port import Lease, LeaseConflict


class KubeLeases:
    """Needs ``self._call`` and ``self._coordination`` (``KubeCluster``)."""

    @staticmethod
    def _lease_body(lease: Lease) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": lease.name, "namespace": lease.namespace,
                                "annotations": dict(lease.annotations)}
        if lease.resource_version:
            meta["resourceVersion"] = lease.resource_version
        spec: dict[str, Any] = {"holderIdentity": lease.holder, "leaseDurationSeconds": lease.duration_s}
        if lease.acquired:
            spec["acquireTime"] = iso(lease.acquired, micro=True)
        if lease.renewed:
            spec["renewTime"] = iso(lease.renewed, micro=True)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    @staticmethod
    def _lease_of(obj: dict[str, Any]) -> Lease:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        return Lease(namespace=meta.get("namespace") or "", name=meta.get("name") or "",
                     holder=spec.get("holderIdentity") or "", duration_s=int(spec.get("leaseDurationSeconds") or 0),
                     acquired=epoch(spec.get("acquireTime")), renewed=epoch(spec.get("renewTime")),
                     annotations=dict(meta.get("annotations") or {}), resource_version=meta.get("resourceVersion") or "")

    async def get_lease(self, namespace: str, name: str) -> Lease | None:
        status, body = await self._call(f"get lease {namespace}/{name}", self._coordination.read_namespaced_lease,
                                        name, namespace, ok=(404,))
        return None if status == 404 else self._lease_of(body)

    async def create_lease(self, lease: Lease) -> Lease:
        body = self._lease_body(msgspec.structs.replace(lease, resource_version=""))
        status, created = await self._call(f"create lease {lease.namespace}/{lease.name}",
                                           self._coordination.create_namespaced_lease, lease.namespace, body, ok=(409,))
        if status == 409:
            raise LeaseConflict(f"lease {lease.namespace}/{lease.name} exists")
        return self._lease_of(created)

    async def update_lease(self, lease: Lease) -> Lease:
        """A JSON patch, not a PUT: a PUT re-creates a deleted lease (leases allow create on
        update), a patch of a missing one is a 404; the ``resourceVersion`` it sets is the
        apiserver's precondition (409 when the lease changed)."""
        what = f"lease {lease.namespace}/{lease.name}"
        if not lease.resource_version:
            raise LeaseConflict(f"{what}: no resource_version to update from")
        body = self._lease_body(lease)
        patch = [{"op": "add", "path": "/metadata/resourceVersion", "value": lease.resource_version},
                 {"op": "add", "path": "/metadata/annotations", "value": body["metadata"]["annotations"]},
                 {"op": "add", "path": "/spec", "value": body["spec"]}]
        status, updated = await self._call(f"update {what}", self._coordination.patch_namespaced_lease, lease.name,
                                           lease.namespace, patch, _content_type="application/json-patch+json",
                                           ok=(404, 409))
        if status in (404, 409):
            raise LeaseConflict(f"{what} {'is gone' if status == 404 else 'changed since ' + lease.resource_version}")
        return self._lease_of(updated)

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str = "") -> None:
        opts: dict[str, Any] = {}
        if resource_version:
            opts["preconditions"] = {"resourceVersion": resource_version}
        status, _ = await self._call(f"delete lease {namespace}/{name}", self._coordination.delete_namespaced_lease,
                                     name, namespace, body=opts, ok=(404, 409))
        if status == 409:
            raise LeaseConflict(f"lease {namespace}/{name} changed since {resource_version}")
