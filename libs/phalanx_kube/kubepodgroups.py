"""The upstream Workload API's PodGroups on a real API server (``scheduling.k8s.io``: v1beta1
from Kubernetes 1.37, v1alpha2 in 1.36 behind the ``GenericWorkload`` gate): the part of
``ClusterPort`` gang-coordinator's PodGroup book reads and the status it writes. ``KubeCluster``
mixes it in. The version is the first of ``POD_GROUP_VERSIONS`` the server lists; none served:
there are no PodGroups (pods naming one wait, told why), said once in the log and looked for
again every ``RECHECK_S``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Literal

from kubernetes_asyncio import client

from phalanx_kube.reflector import Listed, Reflector, Watched
from phalanx_proto.kubeapi import POD_GROUP_GROUP, POD_GROUP_PLURAL, POD_GROUP_VERSIONS
from phalanx_telemetry import log, warn

RECHECK_S = 60.0
"""How often a server that serves no PodGroup version is asked again."""

Change = tuple[Literal["listed"], list[dict[str, Any]]] | tuple[Literal["put", "deleted"], dict[str, Any]]


class KubePodGroups:
    """Needs ``self._call``, ``self._acquire`` and ``self._client`` (``KubeCluster``)."""

    _pod_group_version: str | None = None
    _pod_groups_told = False

    async def _pod_groups_served(self) -> str:
        """The PodGroup version the server serves ("" when none), asked once."""
        if self._pod_group_version is None:
            custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
            for version in POD_GROUP_VERSIONS:
                status, _ = await self._call(  # type: ignore[attr-defined]
                    f"list podgroups {version}", custom.list_cluster_custom_object, POD_GROUP_GROUP, version,
                    POD_GROUP_PLURAL, limit=1, ok=(404,))
                if status != 404:
                    log("reading the Workload API's PodGroups", version=f"{POD_GROUP_GROUP}/{version}")
                    self._pod_group_version = version
                    break
            else:
                if not self._pod_groups_told:  # once per process: looked for again every RECHECK_S
                    warn("the API server serves no PodGroup version: pods naming one in spec.schedulingGroup wait",
                         versions=",".join(POD_GROUP_VERSIONS))
                    self._pod_groups_told = True
                self._pod_group_version = ""
        return self._pod_group_version

    async def get_pod_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        version = await self._pod_groups_served()
        if not version:
            return None
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        status, body = await self._call(  # type: ignore[attr-defined]
            f"get podgroup {namespace}/{name}", custom.get_namespaced_custom_object, POD_GROUP_GROUP, version,
            namespace, POD_GROUP_PLURAL, name, ok=(404,))
        return None if status == 404 else body

    async def watch_pod_groups(self) -> AsyncIterator[Change]:
        while not await self._pod_groups_served():
            yield "listed", []
            await asyncio.sleep(RECHECK_S)
            self._pod_group_version = None
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        method = functools.partial(custom.list_cluster_custom_object, POD_GROUP_GROUP, self._pod_group_version,
                                   POD_GROUP_PLURAL)
        reflector = Reflector("podgroups", method, call=self._call,  # type: ignore[attr-defined]
                              acquire=self._acquire)  # type: ignore[attr-defined]
        async with aclosing(reflector.changes()) as changes:
            async for change in changes:
                match change:
                    case Listed(items=items):
                        yield "listed", list(items)
                    case Watched(type="DELETED", obj=obj):
                        yield "deleted", obj
                    case Watched(obj=obj):
                        yield "put", obj

    async def update_pod_group_status(self, namespace: str, name: str, conditions: list[dict[str, Any]]) -> None:
        version = await self._pod_groups_served()
        if not version:
            return
        custom = client.CustomObjectsApi(self._client)  # type: ignore[attr-defined]
        await self._call(f"update podgroup {namespace}/{name} status",  # type: ignore[attr-defined]
                         custom.patch_namespaced_custom_object_status, POD_GROUP_GROUP, version, namespace,
                         POD_GROUP_PLURAL, name, {"status": {"conditions": conditions}},
                         _content_type="application/merge-patch+json", ok=(404,))
