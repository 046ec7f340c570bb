"""``KubeCluster.watch_node``: one node and the pods bound to it, followed by two list+watch
loops on the real API server (the node by ``metadata.name``, its pods by ``spec.nodeName``,
the field selector the kubelet uses), as the node agent needs them for ``NodeKubeState``.

Each loop lists, then watches from the list's resourceVersion with bookmarks; a watch the
server ends is resumed from the last resourceVersion seen, ``410 Gone`` re-lists, any other
failure backs off (0.5 s doubling to 10 s, jittered) and re-lists. ``follow`` yields a
``NodeObjects`` once both have listed and after every later change; a burst of changes that
arrives while the consumer is busy comes as one.

RBAC: nodes get/list/watch (the list and watch are field-selected to the agent's own node),
pods list/watch across namespaces (``deploy/k8s/rbac.yaml``, topology-discovery).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec

from phalanx_kube.port import NodeObjects, node_from_dict, pod_from_dict
from phalanx_telemetry import warn

WATCH_TIMEOUT_S = (240, 300)
LIST_TIMEOUT_S = 30.0

Call = Callable[..., Awaitable[tuple[int, Any]]]


class _Gone(Exception):
    pass


class _Objects:
    """The objects one field selector selects, by uid, kept by list + watch."""

    def __init__(self, what: str, method, selector: str, call: Call, acquire: Callable[[], Awaitable[None]],
                 changed: asyncio.Event) -> None:
        self.what, self.method, self.selector = what, method, selector
        self._call, self._acquire, self._changed = call, acquire, changed
        self.items: dict[str, dict[str, Any]] = {}
        self.listed = False

    async def run(self) -> None:
        rv: str | None = None
        delay = 0.5
        while True:
            try:
                if rv is None:
                    rv = await self._list()
                started, seen = time.monotonic(), 0
                async for etype, obj in self._watch(rv):
                    delay, seen = 0.5, seen + 1
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone()
                        raise RuntimeError(f"watch {self.what}: {obj.get('message', obj)}")
                    uid = meta.get("uid") or meta.get("name") or ""
                    if etype == "DELETED":
                        self.items.pop(uid, None)
                    elif etype in ("ADDED", "MODIFIED"):
                        self.items[uid] = obj
                    else:
                        continue
                    self._changed.set()
                if not seen and time.monotonic() - started < 1.0:
                    raise ConnectionError("the watch ended at once")
            except asyncio.CancelledError:
                raise
            except _Gone:
                rv = None
            except Exception as e:  # noqa: BLE001 - API server away or stream broken: back off, re-list
                pause = delay * (0.75 + 0.5 * random.random())
                warn("node state watch failed", what=self.what, error=repr(e)[:300], retry_s=round(pause, 2))
                await asyncio.sleep(pause)
                delay = min(delay * 2, 10.0)
                rv = None

    async def _list(self) -> str:
        items: dict[str, dict[str, Any]] = {}
        token, rv = None, ""
        while True:
            kw: dict[str, Any] = {"limit": 500, "field_selector": self.selector}
            if token:
                kw["_continue"] = token
            _, body = await self._call(f"list {self.what}", self.method, **kw)
            meta = body.get("metadata") or {}
            rv = rv or meta.get("resourceVersion", "")
            for o in body.get("items") or []:
                m = o.get("metadata") or {}
                items[m.get("uid") or m.get("name") or ""] = o
            token = meta.get("continue")
            if not token:
                break
        self.items, self.listed = items, True
        self._changed.set()
        return rv

    async def _watch(self, rv: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        server_timeout = random.randint(*WATCH_TIMEOUT_S)
        await self._acquire()
        resp = await self.method(
            _preload_content=False, watch=True, resource_version=rv, allow_watch_bookmarks=True,
            timeout_seconds=server_timeout, field_selector=self.selector,
            _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=server_timeout + 30))
        try:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                raise RuntimeError(f"watch {self.what}: HTTP {resp.status}: {(await resp.read())[:200]!r}")
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = msgspec.json.decode(line)
                        yield ev.get("type", ""), ev.get("object") or {}
        finally:
            resp.release()


async def follow(core, name: str, call: Call, acquire: Callable[[], Awaitable[None]]) -> AsyncIterator[NodeObjects]:
    """Node ``name`` and its pods, now and after every change (module docstring)."""
    changed = asyncio.Event()
    node = _Objects(f"node {name}", core.list_node, f"metadata.name={name}", call, acquire, changed)
    pods = _Objects(f"pods on node {name}", core.list_pod_for_all_namespaces, f"spec.nodeName={name}", call,
                    acquire, changed)
    tasks = [asyncio.ensure_future(node.run()), asyncio.ensure_future(pods.run())]
    try:
        while True:
            await changed.wait()
            changed.clear()
            if not (node.listed and pods.listed):
                continue
            objs = [node_from_dict(o) for o in node.items.values()]
            yield NodeObjects(node=objs[0] if objs else None,
                              pods=tuple(sorted((pod_from_dict(o) for o in pods.items.values()),
                                                key=lambda p: (p.namespace, p.name))))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
