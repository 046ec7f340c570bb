"""A node's ``NodeKubeState`` from its Kubernetes objects: the Node and the pods bound to it
that Phalanx did not place (the caller leaves Phalanx's own out; they are in the ledger).

What the node agent (topology-discovery, or the simulator's node fleet) reports to
placement for the non-GPU filters, read the way kube-scheduler reads it:

* **allocatable**: ``status.allocatable`` (a resource only in ``capacity`` is 0, as kube-scheduler
  reads it), cpu in millicores, every other resource in whole units rounded up (``Quantity.Value``);
* **taints, labels, unschedulable**: ``spec.taints``, ``metadata.labels``,
  ``spec.unschedulable``; a taint with an effect the API server would refuse is left out;
* **Ready**: the ``Ready`` condition's status (``Unknown`` without one);
* **requested, pods, host ports**: summed over the pods that are not terminal (``Succeeded`` /
  ``Failed`` pods hold nothing, as in kube-scheduler's cache), through ``podspec``;
* **running**: those pods' namespaces, labels and required anti-affinity terms, for pod
  (anti-)affinity (``nodeterms``; a term whose ``namespaceSelector`` selects by labels is read
  as every namespace: it keeps more pods apart, never fewer). A pod whose labels or terms
  cannot be reported (too many, malformed) is listed ``unread`` with the reason, as is every
  pod past the node's label budget: the engine counts it as matching every anti-affinity term
  and no affinity term.

The result respects the wire bounds (``phalanx_proto.scheduling.MAX_NODE_*``) or is a
``Violation`` naming the bound; nothing raises on a malformed object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phalanx_kubeobjects import names, nodeterms, podspec
from phalanx_kubeobjects.quantity import NANO, Bound, cpu_millis, scaled
from phalanx_kubeobjects.violations import Violation, as_list, as_map, shown
from phalanx_proto import scheduling as K
from phalanx_proto.scheduling import CPU, NodeKubeState, Taint

AMOUNT_MOST = Bound(2**62, "no node offers 2^62 units of one resource")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_STATUSES = ("True", "False", "Unknown")
TERMINAL = ("Succeeded", "Failed")


def node_kube_state(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                    placed: tuple[str, ...] = ()) -> NodeKubeState | Violation:
    """The state of ``node`` (a Node object) with ``pods`` (the pods bound to it that Phalanx
    did not place, as objects) counted as requested there, and ``placed`` (the pod keys of
    those Phalanx placed) listed as running there."""
    meta, spec, status = as_map(node.get("metadata")), as_map(node.get("spec")), as_map(node.get("status"))
    allocatable = _allocatable(status)
    if isinstance(allocatable, Violation):
        return allocatable
    labels = {k: v for k, v in as_map(meta.get("labels")).items() if isinstance(k, str) and isinstance(v, str)}
    taints = tuple(Taint(key=t["key"], value=t.get("value") or "", effect=t["effect"])
                   for t in map(as_map, as_list(spec.get("taints")))
                   if isinstance(t.get("key"), str) and t.get("effect") in _EFFECTS
                   and isinstance(t.get("value") or "", str))
    requested: dict[str, int] = {}
    ports: list[K.HostPort] = []
    running: list[K.RunningPod] = []
    count = pod_labels = 0
    for pod in pods:
        pspec = as_map(pod.get("spec"))
        if as_map(pod.get("status")).get("phase") in TERMINAL:
            continue
        count += 1
        got = _running(pod)
        if pod_labels + len(got.labels) > K.MAX_NODE_POD_LABELS:
            got = K.RunningPod(namespace=got.namespace, unread=(
                f"the node's pods carry more than {K.MAX_NODE_POD_LABELS} labels together: this pod's are not reported"))
        running.append(got)
        pod_labels += len(got.labels)
        for r, q in podspec.pod_requests(pspec).items():
            requested[r] = requested.get(r, 0) + q
        ports.extend(podspec.pod_host_ports(pspec))
    for what, n, most in (("metadata.labels", len(labels), K.MAX_NODE_LABELS),
                          ("spec.taints", len(taints), K.MAX_NODE_TAINTS),
                          ("status.allocatable", len(allocatable), K.MAX_NODE_RESOURCES),
                          ("requests of the node's pods", len(requested), K.MAX_NODE_RESOURCES),
                          ("host ports of the node's pods", len(ports), K.MAX_NODE_HOST_PORTS),
                          ("Phalanx's pods on the node", len(placed), K.MAX_NODE_PODS),
                          ("pods on the node", len(running), K.MAX_NODE_PODS)):
        if n > most:
            return Violation(what, f"{n} entries", f"Phalanx reports at most {most} per node")
    return NodeKubeState(allocatable=allocatable, labels=labels, taints=taints,
                         unschedulable=spec.get("unschedulable") is True, ready=_ready(status),
                         requested=dict(sorted(requested.items())), pods=count,
                         host_ports=tuple(sorted(set(ports), key=lambda p: (p.port, p.protocol, p.host_ip))),
                         phalanx_pods=placed,
                         running=tuple(sorted(running, key=lambda r: (r.namespace, sorted(r.labels.items())))))


def _running(pod: Mapping[str, Any]) -> K.RunningPod:
    """One pod on the node as pod (anti-)affinity sees it. A pod whose labels or terms break a
    rule (more labels than Phalanx reports, a malformed term) is reported ``unread`` with the
    first rule it breaks, named with the pod: counted conservatively by the engine, and never a
    reason to drop the node's whole state (a pod anyone may run there would otherwise take the
    node from Phalanx)."""
    meta = as_map(pod.get("metadata"))
    v: list[Violation] = []
    namespace = meta.get("namespace") or "default"
    if not names.dns_label(namespace):
        v.append(Violation("metadata.namespace", shown(namespace), f"a namespace {names.LABEL_RULE}"))
        namespace = "default"
    labels = nodeterms.pod_labels(meta.get("labels"), v)
    anti, _ = nodeterms.pod_terms(as_map(pod.get("spec")), labels, "podAntiAffinity", v, namespace_selectors=True)
    if v:
        why = str(Violation(f"pod {shown(meta.get('namespace'))}/{shown(meta.get('name'))}: {v[0].field}", v[0].value,
                            v[0].rule))
        return K.RunningPod(namespace=namespace, unread=why[:512])
    return K.RunningPod(namespace=namespace, labels=labels, anti_affinity=anti,
                        terminating=meta.get("deletionTimestamp") is not None)


def _allocatable(status: Mapping[str, Any]) -> dict[str, int] | Violation:
    raw = as_map(status.get("allocatable"))
    out: dict[str, int] = {}
    for name, value in raw.items():
        field = f"status.allocatable[{shown(name)}]"
        got = cpu_millis(value, field, most=AMOUNT_MOST) if name == CPU else \
            scaled(value, field, unit_nanos=NANO, most=AMOUNT_MOST)
        if isinstance(got, Violation):
            return got
        out[str(name)] = got
    return dict(sorted(out.items()))


def _ready(status: Mapping[str, Any]) -> K.ConditionStatus:
    for c in map(as_map, as_list(status.get("conditions"))):
        if c.get("type") == "Ready":
            s = c.get("status")
            return s if s in _STATUSES else "Unknown"
    return "Unknown"
