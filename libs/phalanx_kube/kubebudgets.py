"""PodDisruptionBudgets on a real API server (the part of ``ClusterPort`` that tells which pods
an eviction must ask about first): ``KubeCluster`` mixes it in.

``budgeted(refs)`` answers which of the pods a PodDisruptionBudget selects, so that binder
dry-runs only their evictions (docs/preemption.md, "Wiring"): one listing of the budgets per
namespace, and, only in a namespace that has some, one listing of the pods each budget's
selector matches (the API server evaluates the selector, as the disruption controller does).
A budget with an empty selector selects every pod of its namespace; one without a selector
selects none (``policy/v1``). A selector this module cannot write as a label selector counts as
selecting every pod of the namespace: a dry run too many costs a request, one too few could
evict past a budget.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kubernetes_asyncio import client

from phalanx_proto.events import PodRef

ALL = object()
"""``label_selector``'s answer for a selector that selects every pod of its namespace."""


def label_selector(selector: dict[str, Any] | None) -> str | object | None:
    """The label-selector string of a budget's ``spec.selector``: None for no selector (selects
    nothing), ``ALL`` for an empty one or one that cannot be written as a string."""
    if selector is None:
        return None
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key", ""), e.get("operator", ""), sorted(e.get("values") or [])
        if op == "In" and values:
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn" and values:
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            return ALL
    return ",".join(parts) if parts else ALL


class KubeBudgets:
    """Needs ``self._call``, ``self._core`` and ``self._client`` (``KubeCluster``)."""

    async def budgeted(self, refs: Iterable[PodRef]) -> set[PodRef]:
        by_ns: dict[str, list[PodRef]] = defaultdict(list)
        for ref in refs:
            by_ns[ref.namespace].append(ref)
        policy = client.PolicyV1Api(self._client)
        out: set[PodRef] = set()
        for ns, pods in by_ns.items():
            _, body = await self._call(f"list disruption budgets in {ns}",
                                       policy.list_namespaced_pod_disruption_budget, ns)
            selectors = [label_selector((b.get("spec") or {}).get("selector")) for b in body.get("items") or []]
            if any(s is ALL for s in selectors):
                out.update(pods)
                continue
            names = {p.name for p in pods}
            for sel in {s for s in selectors if isinstance(s, str)}:
                _, listed = await self._call(f"list pods of a disruption budget in {ns}",
                                             self._core.list_namespaced_pod, ns, label_selector=sel)
                chosen = {(o.get("metadata") or {}).get("name") for o in listed.get("items") or []}
                out.update(p for p in pods if p.name in chosen & names)
        return out
