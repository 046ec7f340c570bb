"""``KubeCluster.watch_node``: one node and the pods bound to it, each followed by a
``phalanx_kube.reflector.Reflector`` on the real API server (the node by ``metadata.name``, its
pods by ``spec.nodeName``, the field selector the kubelet uses), as the node agent needs them
for ``NodeKubeState``.

``follow`` yields a ``NodeObjects`` once both have listed and after every later change; a
burst of changes that arrives while the consumer is busy comes as one. The two reflectors run
in an ``asyncio.TaskGroup`` that lives as long as the generator: the caller closes it in its own
task (``aclosing``), which cancels both and waits for them. (An anyio task group cannot be held
open across a generator's ``yield``: its cancel scope would wrap the consumer's code. Python
3.11's ``TaskGroup`` reports the ``GeneratorExit`` of ``aclose`` as an error of the group, so
``follow`` turns it into a normal exit.)

RBAC: nodes get/list/watch (the list and watch are field-selected to the agent's own node),
pods list/watch across namespaces (``deploy/k8s/rbac.yaml``, topology-discovery).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from phalanx_kube.port import NodeObjects, node_from_dict, pod_from_dict
from phalanx_kube.reflector import Acquire, Call, Listed, Reflector, Watched


class _Objects:
    """The objects one reflector reports, by uid (the node's name when it has none)."""

    def __init__(self, reflector: Reflector, changed: asyncio.Event) -> None:
        self.reflector, self._changed = reflector, changed
        self.items: dict[str, dict[str, Any]] = {}
        self.listed = False

    async def run(self) -> None:
        async with aclosing(self.reflector.changes()) as changes:
            async for change in changes:
                match change:
                    case Listed(items=items):
                        self.items, self.listed = {_key(o): o for o in items}, True
                    case Watched(type="DELETED", obj=obj):
                        self.items.pop(_key(obj), None)
                    case Watched(obj=obj):
                        self.items[_key(obj)] = obj
                self._changed.set()


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return meta.get("uid") or meta.get("name") or ""


async def follow(core, name: str, *, call: Call, acquire: Acquire) -> AsyncIterator[NodeObjects]:
    """Node ``name`` and its pods, now and after every change (module docstring)."""
    changed = asyncio.Event()
    node = _Objects(Reflector(f"node {name}", core.list_node, call=call, acquire=acquire,
                              field_selector=f"metadata.name={name}"), changed)
    pods = _Objects(Reflector(f"pods on node {name}", core.list_pod_for_all_namespaces, call=call, acquire=acquire,
                              field_selector=f"spec.nodeName={name}"), changed)
    async with asyncio.TaskGroup() as tg:
        tasks = (tg.create_task(node.run()), tg.create_task(pods.run()))
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
        except GeneratorExit:  # closed by the caller: stop both, and leave the group as a normal exit
            for t in tasks:
                t.cancel()
