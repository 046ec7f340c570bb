"""The Queue objects and namespaces of a real API server (the part of ``ClusterPort`` that
gang-coordinator's queue book reads): ``KubeCluster`` mixes it in.

Queues are a CustomResourceDefinition (deploy/k8s/crds/); when it is not installed the API
server answers 404 and there are no queues (every gang is in ``default``), said once in the log.
Namespaces are followed by a list + watch (``phalanx_kube.reflector``), and one the watch has not
shown yet is read on its own (``get_namespace``): a pod created right after its namespace is put
in the queue its namespace's labels name, never in the one an empty label set would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from kubernetes_asyncio import client

from phalanx_kube.reflector import Listed, Reflector, Watched
from phalanx_proto.queues import GROUP, PLURAL, VERSION
from phalanx_telemetry import warn


class KubeQueues:
    """Needs ``self._call``, ``self._acquire`` and ``self._client`` (``KubeCluster``)."""

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
        return {_name(o): _labels(o) for o in body.get("items") or []}

    async def get_namespace(self, name: str) -> dict[str, str] | None:
        core = client.CoreV1Api(self._client)  # type: ignore[attr-defined]
        status, body = await self._call(f"get namespace {name}", core.read_namespace, name,  # type: ignore[attr-defined]
                                        ok=(404,))
        return None if status == 404 else _labels(body)

    async def watch_namespaces(self) -> AsyncIterator[dict[str, dict[str, str]]]:
        core = client.CoreV1Api(self._client)  # type: ignore[attr-defined]
        reflector = Reflector("namespaces", core.list_namespace, call=self._call,  # type: ignore[attr-defined]
                              acquire=self._acquire)  # type: ignore[attr-defined]
        known: dict[str, dict[str, str]] = {}
        async with aclosing(reflector.changes()) as changes:
            async for change in changes:
                match change:
                    case Listed(items=items):
                        known = {_name(o): _labels(o) for o in items}
                    case Watched(type="DELETED", obj=obj):
                        known.pop(_name(obj), None)
                    case Watched(obj=obj):
                        known[_name(obj)] = _labels(obj)
                yield dict(known)

    async def update_queue_status(self, name: str, status: dict[str, Any]) -> None:
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        await self._call(f"update queue {name} status", custom.patch_cluster_custom_object_status,  # type: ignore[attr-defined]
                         GROUP, VERSION, PLURAL, name, {"status": status},
                         _content_type="application/merge-patch+json", ok=(404,))


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})
