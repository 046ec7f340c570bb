"""The real Kubernetes adapter: ``ClusterPort`` over kubernetes-asyncio.

``phalanx run SERVICE --cluster kube`` opens it with ``await KubeCluster.open(kubeconfig)``
(a kubeconfig file, else ``KUBECONFIG``, else the in-cluster ServiceAccount). It is the only
module besides its package that may import ``kubernetes_asyncio`` (import-linter contract).

Every call goes through the generated ``CoreV1Api`` methods with ``_preload_content=False`` and
decodes the raw JSON itself: ``Pod.raw``/``Node`` then hold camelCase dicts exactly as
``pod_from_dict``/``node_from_dict`` expect (and as the simulator stores them), no model
round-trip costs time on the watch, and the Binding subresource, whose response is a
``Status`` the generated client cannot deserialize into ``V1Binding``, just works.

Mapping of the port's rules onto the API:

* pods: list + watch (``phalanx_kube.reflector``: bookmarks, a re-list on ``410 Gone``, jittered
  backoff on errors) with ``spec.schedulerName!=default-scheduler`` (a field selector cannot
  OR our two names; the rest is filtered here), turned into ``PodEvent``s by
  ``phalanx_kube.podtable``;
* a uid in a ``PodRef`` is a precondition: patches carry ``metadata.uid`` (a mismatch is a
  422 on ``metadata.uid``, reported as ``PodGone`` like the simulator), the Binding carries it
  too (409, re-read to tell "already bound here" from a conflict), deletes use
  ``preconditions.uid``;
* every request (a watch's start included) first waits for the client-side rate limiter,
  ``--kube-api-qps``/``--kube-api-burst`` as in kube-scheduler (``phalanx_kube.ratelimit``), and
  the HTTP connection pool is sized to the burst;
* events (``phalanx_kube.kubeevents``), leases (``kubeleases``), queues (``kubequeues``), the
  disruption budgets an eviction asks about (``kubebudgets``) and the DRA objects (``kubedra``: DeviceClasses, ResourceSlices, ResourceClaims) are mixed into
  ``KubeCluster`` from their own modules.

RBAC this needs (``deploy/k8s/rbac.yaml`` grants each service only its part): pods
get/list/watch/patch/delete, pods/binding create, pods/eviction create and poddisruptionbudgets list (binder: preemption), pods/status patch, events create/get/patch,
nodes get/list/watch, nodes/status patch (the node agent: its own node's pods list/watch,
``watch_node``); ``list_events`` (tests, CLI) also needs events list;
the per-node fences are ``coordination.k8s.io`` leases (binder: get/create/update/delete; the
node agent: get); DRA (``resource.k8s.io``): deviceclasses, resourceslices, resourceclaims
get/list/watch (gang-coordinator), resourceclaims get/create/update/delete, resourceclaims/status
and resourceclaims/binding update (cluster scope), pods/status patch (binder).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

import msgspec
from kubernetes_asyncio import client, config

from phalanx_kube import nodewatch
from phalanx_kube.apitime import epoch, iso
from phalanx_kube.kubebudgets import KubeBudgets
from phalanx_kube.kubedra import KubeDra
from phalanx_kube.kubeevents import KubeEvents
from phalanx_kube.kubeleases import KubeLeases
from phalanx_kube.kubepodgroups import KubePodGroups
from phalanx_kube.kubequeues import KubeQueues
from phalanx_kube.podtable import PodTable
from phalanx_kube.port import (
    BindConflict,
    EvictionBlocked,
    Node,
    NodeObjects,
    Pod,
    PodEvent,
    PodGone,
    node_from_dict,
    not_ours,
    pod_from_dict,
)
from phalanx_kube.ratelimit import KubeClientSettings, TokenBucket
from phalanx_kube.reflector import Listed, Reflector, Watched
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import SCHEDULER_NAMES

REQUEST_TIMEOUT_S = 30.0
OURS_SEEN_LIMIT = 200_000
"""Pod uids remembered as ours (``_our_uid``); the oldest is forgotten first."""

_decode = msgspec.json.decode
DEFAULT_SETTINGS = KubeClientSettings()


class KubeApiError(RuntimeError):
    """The API server answered with an unexpected status."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {}
        self.reason = self.body.get("reason", "")
        super().__init__(f"{what}: HTTP {status} {self.reason}: {self.body.get('message', body)}")


def pod_from_api(obj: dict[str, Any]) -> Pod:
    """A ``Pod`` from an API object; ``created`` is ``metadata.creationTimestamp``."""
    pod = pod_from_dict(obj)
    return msgspec.structs.replace(pod, created=epoch((obj.get("metadata") or {}).get("creationTimestamp")))


def _uid_mismatch(e: KubeApiError) -> bool:
    causes = (e.body.get("details") or {}).get("causes") or []
    return e.status == 422 and any(c.get("field") == "metadata.uid" for c in causes)


class KubeCluster(KubeQueues, KubePodGroups, KubeEvents, KubeLeases, KubeDra, KubeBudgets):
    """``ClusterPort`` on a real API server. Create with ``await KubeCluster.open(...)``;
    ``await close()`` (or ``async with``) releases the HTTP session."""

    def __init__(self, api_client: client.ApiClient, scheduler_names=SCHEDULER_NAMES, *,
                 limiter: TokenBucket | None = None) -> None:
        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self.scheduler_names = tuple(scheduler_names)
        self._instance = f"{socket.gethostname()}-{os.getpid()}"[:128]
        self._limiter = limiter
        self._ours_seen: dict[str, None] = {}
        """Uids of pods this client has read with one of our scheduler names (insertion order)."""

    @classmethod
    async def open(cls, kubeconfig: str | None = None, *, context: str | None = None,
                   scheduler_names=SCHEDULER_NAMES,
                   settings: KubeClientSettings = DEFAULT_SETTINGS) -> KubeCluster:
        """Connect with ``kubeconfig`` (a path), else ``$KUBECONFIG``, else the in-cluster
        ServiceAccount, else ``~/.kube/config``. Raises ``ConfigException`` when none works.
        ``settings``: client QPS, burst and connection pool (``phalanx_kube.ratelimit``)."""
        cfg = client.Configuration()
        cfg.connection_pool_maxsize = settings.pool_size
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if not path and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            await config.load_kube_config(config_file=path or None, context=context, client_configuration=cfg,
                                          persist_config=False)
        return cls(_without_env_lookups(client.ApiClient(configuration=cfg), cfg), scheduler_names,
                   limiter=settings.limiter())

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> KubeCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transport -------------------------------------------------------------------------
    async def _call(self, what: str, method, *args, ok: tuple[int, ...] = (), **kwargs) -> tuple[int, Any]:
        """Call a generated API method raw: (status, decoded JSON). Non-2xx outside ``ok``
        raises ``KubeApiError``. Waits for the rate limiter first."""
        if self._limiter is not None:
            await self._limiter.acquire()
        resp = await method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        try:
            data = await resp.read()
            status = resp.status
        finally:
            resp.release()
        body = _safe_decode(data) if data else {}
        if not 200 <= status < 300 and status not in ok:
            raise KubeApiError(status, body, what)
        return status, body

    # -- pods ------------------------------------------------------------------------------
    @property
    def _field_selector(self) -> str | None:
        return None if "default-scheduler" in self.scheduler_names else "spec.schedulerName!=default-scheduler"

    def _ours(self, obj: dict[str, Any]) -> bool:
        return ((obj.get("spec") or {}).get("schedulerName") or "default-scheduler") in self.scheduler_names

    def _pods(self) -> Reflector:
        return Reflector("pods", self._core.list_pod_for_all_namespaces, call=self._call, acquire=self._acquire,
                         field_selector=self._field_selector, keep=self._ours)

    async def list_pods(self) -> list[Pod]:
        items, _ = await self._pods().list()
        return sorted((pod_from_api(o) for o in items), key=lambda p: (p.created, p.namespace, p.name))

    async def watch_pods(self) -> AsyncIterator[PodEvent | None]:
        """List (ADDED…, then ``None``), then watch (``phalanx_kube.reflector``); after every
        re-list (``410 Gone``), what changed meanwhile (ADDED/MODIFIED/DELETED), then ``None``
        again."""
        table = PodTable(pod_from_api)
        async with aclosing(self._pods().changes()) as changes:
            async for change in changes:
                match change:
                    case Listed(items=items):
                        events = table.relisted(items)
                        for pod in table.known.values():
                            self._seen(pod)
                        for ev in events:
                            yield ev
                        yield None
                    case Watched(type=etype, obj=obj):
                        pod = pod_from_api(obj)
                        if etype == "DELETED":
                            self._ours_seen.pop(pod.uid, None)
                        else:
                            self._seen(pod)
                        for ev in table.watched(etype, pod):
                            yield ev

    async def get_pod(self, ref: PodRef) -> Pod | None:
        status, body = await self._call(f"get pod {ref}", self._core.read_namespaced_pod, ref.name, ref.namespace,
                                        ok=(404,))
        if status == 404:
            return None
        pod = pod_from_api(body)
        self._seen(pod)
        return pod

    def _seen(self, pod: Pod) -> None:
        """Remember the uid of a pod read with one of our scheduler names (bounded)."""
        if pod.uid and pod.scheduler_name in self.scheduler_names and pod.uid not in self._ours_seen:
            if len(self._ours_seen) >= OURS_SEEN_LIMIT:
                del self._ours_seen[next(iter(self._ours_seen))]
            self._ours_seen[pod.uid] = None

    async def _our_uid(self, ref: PodRef) -> str | None:
        """The uid of the pod ``ref`` names if it has one of our scheduler names; ``None`` when
        it is gone; ``NotOurs`` otherwise. The caller acts with this uid as precondition, so a
        pod recreated in between (under another scheduler) is not touched either.

        A uid this client has already read with one of our scheduler names is returned without
        a read: ``spec.schedulerName`` is immutable, so that uid stays ours, and the request's
        uid precondition turns a pod deleted or recreated since into ``PodGone`` or a conflict."""
        if ref.uid and ref.uid in self._ours_seen:
            return ref.uid
        pod = await self.get_pod(ref)
        if pod is None or (ref.uid and pod.uid != ref.uid):
            return None
        if pod.scheduler_name not in self.scheduler_names:
            raise not_ours(ref, pod.scheduler_name, self.scheduler_names)
        return pod.uid

    async def _patch_pod(self, ref: PodRef, body: dict[str, Any], *, status: bool = False) -> None:
        uid = await self._our_uid(ref)
        if uid is None:
            raise PodGone(f"pod {ref} not found")
        body = {**body, "metadata": {**body.get("metadata", {}), "uid": uid}}
        method = self._core.patch_namespaced_pod_status if status else self._core.patch_namespaced_pod
        ctype = "application/strategic-merge-patch+json" if status else "application/merge-patch+json"
        try:
            code, _ = await self._call(f"patch pod {ref}", method, ref.name, ref.namespace, body,
                                       _content_type=ctype, ok=(404,))
        except KubeApiError as e:
            if _uid_mismatch(e):
                raise PodGone(f"pod {ref} not found (recreated with another uid)") from e
            raise
        if code == 404:
            raise PodGone(f"pod {ref} not found")

    async def annotate_pod(self, ref: PodRef, annotations: dict[str, str]) -> None:
        await self._patch_pod(ref, {"metadata": {"annotations": dict(annotations)}})

    async def bind(self, ref: PodRef, node: str, annotations: Mapping[str, str] | None = None) -> None:
        """The Binding carries ``annotations``: the API server sets them on the pod in the same
        write as ``spec.nodeName``."""
        uid = await self._our_uid(ref)
        if uid is None:
            pod = await self.get_pod(ref)
            if pod is None:
                raise PodGone(f"pod {ref} not found")
            raise BindConflict(f"pod {ref} was recreated (uid {pod.uid})")
        meta: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace, "uid": uid}
        if annotations:
            meta["annotations"] = dict(annotations)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        status, body = await self._call(f"bind pod {ref}", self._core.create_namespaced_pod_binding,
                                        ref.name, ref.namespace, binding, ok=(404, 409))
        if status == 404:
            raise PodGone(f"pod {ref} not found")
        if status != 409:
            return
        # Conflict: a uid precondition that failed, or a pod already bound. Look.
        pod = await self.get_pod(ref)
        if pod is None:
            raise PodGone(f"pod {ref} not found")
        if ref.uid and pod.uid != ref.uid:
            raise BindConflict(f"pod {ref} was recreated (uid {pod.uid})")
        if pod.node_name == node:
            if annotations and any(pod.annotations.get(k) != v for k, v in annotations.items()):
                await self.annotate_pod(ref, annotations)
            return
        if pod.node_name:
            raise BindConflict(f"pod {ref} is already bound to {pod.node_name}")
        raise KubeApiError(status, body, f"bind pod {ref}")

    async def delete_pod(self, ref: PodRef) -> None:
        uid = await self._our_uid(ref)
        if uid is None:
            return
        opts: dict[str, Any] = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        await self._call(f"delete pod {ref}", self._core.delete_namespaced_pod, ref.name, ref.namespace,
                         body=opts, ok=(404, 409))

    async def evict_pod(self, ref: PodRef, *, dry_run: bool = False) -> bool:
        uid = await self._our_uid(ref)
        if uid is None:
            return False
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": ref.name, "namespace": ref.namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        status, resp = await self._call(f"evict pod {ref}", self._core.create_namespaced_pod_eviction, ref.name,
                                        ref.namespace, body, ok=(404, 409, 429),
                                        **({"dry_run": "All"} if dry_run else {}))
        if status == 429:
            raise EvictionBlocked(f"evicting {ref}: {resp.get('message') or 'refused (HTTP 429)'}")
        return status not in (404, 409)  # 409: the uid precondition failed (the pod was recreated)

    async def set_scheduled_condition(self, ref: PodRef, *, status: bool, reason: str, message: str) -> None:
        cond = {"type": "PodScheduled", "status": "True" if status else "False", "reason": reason,
                "message": message}
        pod = await self.get_pod(ref)
        if pod is None or (ref.uid and pod.uid != ref.uid):
            raise PodGone(f"pod {ref} not found")
        old = [c for c in (pod.raw.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
        if not old or old[0].get("status") != cond["status"]:
            cond["lastTransitionTime"] = iso(time.time())
        await self._patch_pod(ref, {"status": {"conditions": [cond]}}, status=True)

    # -- nodes -----------------------------------------------------------------------------
    async def list_nodes(self) -> list[Node]:
        _, body = await self._call("list nodes", self._core.list_node)
        return sorted((node_from_dict(o) for o in body.get("items") or []), key=lambda n: n.name)

    async def get_node(self, name: str) -> Node | None:
        status, body = await self._call(f"get node {name}", self._core.read_node, name, ok=(404,))
        return None if status == 404 else node_from_dict(body)

    async def list_node_pods(self, name: str) -> list[Pod]:
        _, body = await self._call(f"list pods on node {name}", self._core.list_pod_for_all_namespaces,
                                   field_selector=f"spec.nodeName={name}")
        return sorted((pod_from_api(o) for o in body.get("items") or []), key=lambda p: (p.namespace, p.name))

    async def list_bound_pods(self) -> list[Pod]:
        _, body = await self._call("list bound pods", self._core.list_pod_for_all_namespaces,
                                   field_selector="spec.nodeName!=")
        return sorted((pod_from_api(o) for o in body.get("items") or []), key=lambda p: (p.namespace, p.name))

    async def watch_node(self, name: str) -> AsyncIterator[NodeObjects]:
        """List + watch of the node and of its pods (``phalanx_kube.nodewatch``)."""
        async with aclosing(nodewatch.follow(self._core, name, call=self._call, acquire=self._acquire)) as updates:
            async for objs in updates:
                yield objs

    async def _acquire(self) -> None:
        if self._limiter is not None:
            await self._limiter.acquire()

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        res = {k: str(v) for k, v in resources.items()}
        status, _ = await self._call(f"patch node {name} status", self._core.patch_node_status, name,
                                     {"status": {"capacity": res, "allocatable": res}},
                                     _content_type="application/merge-patch+json", ok=(404,))
        if status == 404:
            raise KeyError(f"node {name} not found")


def _without_env_lookups(api_client: client.ApiClient, cfg: client.Configuration) -> client.ApiClient:
    """kubernetes-asyncio opens its HTTP session with ``trust_env``, so aiohttp looks up the
    proxy variables and ``~/.netrc`` (in a thread) on every request. The API server's proxy is
    resolved from the environment once, here, and the per-request lookups are turned off; the
    client authenticates with its kubeconfig or ServiceAccount, never with ``.netrc``."""
    host = urllib.parse.urlsplit(cfg.host).hostname or ""
    if not cfg.proxy and host and not urllib.request.proxy_bypass(host):
        proxy = urllib.request.getproxies().get(urllib.parse.urlsplit(cfg.host).scheme or "https")
        if proxy:
            cfg.proxy = api_client.rest_client.proxy = proxy
    session = api_client.rest_client.pool_manager
    if hasattr(session, "_trust_env"):
        session._trust_env = False
    return api_client


def _safe_decode(data: bytes) -> Any:
    try:
        return _decode(data)
    except msgspec.DecodeError:
        return {"message": data[:200].decode(errors="replace")}
