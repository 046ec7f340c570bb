"""The Queue objects and namespaces of a real API server (the part of ``ClusterPort`` that
gang-coordinator's queue book reads): ``KubeCluster`` mixes it in.

Queues are a CustomResourceDefinition (deploy/k8s/crds/); when it is not installed the API
server answers 404 and there are no queues (every gang is in ``default``), said once in the log.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from phalanx_proto.queues import GROUP, PLURAL, VERSION
from phalanx_telemetry import warn


class KubeQueues:
    """Needs ``self._call`` and ``self._client`` (``KubeCluster``)."""

    _no_crd_told = False

    async def list_queues(self) -> list[dict[str, Any]]:
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        status, body = await self._call("list queues", custom.list_cluster_custom_object,  # type: ignore[attr-defined]
                                        GROUP, VERSION, PLURAL, ok=(404,))
        if status == 404:
            if not self._no_crd_told:
                KubeQueues._no_crd_told = True
                warn("the Queue CRD is not installed: every gang is in queue 'default' (deploy/k8s/crds/)")
            return []
        return list(body.get("items") or [])

    async def list_namespaces(self) -> dict[str, dict[str, str]]:
        core = client.CoreV1Api(self._client)  # type: ignore[attr-defined]
        _, body = await self._call("list namespaces", core.list_namespace)  # type: ignore[attr-defined]
        return {(o.get("metadata") or {}).get("name", ""): dict((o.get("metadata") or {}).get("labels") or {})
                for o in body.get("items") or []}

    async def update_queue_status(self, name: str, status: dict[str, Any]) -> None:
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        await self._call(f"update queue {name} status", custom.patch_cluster_custom_object_status,  # type: ignore[attr-defined]
                         GROUP, VERSION, PLURAL, name, {"status": status},
                         _content_type="application/merge-patch+json", ok=(404,))
