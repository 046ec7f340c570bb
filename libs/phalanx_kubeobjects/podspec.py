"""A pod's scheduling constraints besides GPUs, read from the pod (or pod template) the way the
API server defaults them and kube-scheduler reads them.

Called by ``requests.parse_pod`` (so gang-coordinator and ``phalanx validate`` read pods with
the same code). Amounts go through ``quantity`` (the one quantity parser), names through
``names`` (the API server's naming rules). Every invalid value is a ``Violation`` naming the
field, the value and the rule; constraints Phalanx refuses or ignores are warnings naming the
field and the rule, so ``phalanx validate`` shows them before the pod is submitted. Never
raises on a malformed pod.

* **Requests** (kube-scheduler's sum): containers add up; an init container that is a sidecar
  (``restartPolicy: Always``) adds up too, any other init container counts with the sidecars
  started before it and the pod needs the largest of those; pod-level ``resources.requests``
  for cpu and memory replace the containers' sum; ``overhead`` is added. A container that
  gives only a limit requests that limit (API server defaulting). GPU resources are the GPU
  request's (``containers.RESOURCES``), not counted here.
* **Host ports**: ``hostPort`` of containers and sidecars; with ``hostNetwork: true`` every
  ``containerPort`` is a host port (API server defaulting).
* **Which nodes** (``nodeterms``): tolerations, ``nodeSelector``, required node affinity,
  ``nodeName``.
* **Pod (anti-)affinity** (``nodeterms.pod_terms``, ``nodeterms.preferred_terms``): the required
  and the preferred terms, with the pod's labels (``matchLabelKeys``/``mismatchLabelKeys`` are
  merged into the selector from them).
* **Topology spread** (``nodeterms.spread``): the ``DoNotSchedule`` constraints (a filter) and the
  ``ScheduleAnyway`` ones (a score), with the pod's ``matchLabelKeys`` merged in.
* **To be resolved**: a term's ``namespaceSelector`` by labels (``PodAffinityTerm.namespace_selector``;
  the required kinds named in ``MemberSpec.unsupported`` until gang-coordinator resolves them:
  ``nodeterms.resolve_namespaces``).
* **Preferences** (rank the nodes that fit): preferred node affinity, preferred pod
  (anti-)affinity, ``ScheduleAnyway`` spread.
* **Bounds** (``phalanx_proto.scheduling.MAX_*``): tighter than the API server's, each a
  violation that says so; they keep a gang's request within one message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from phalanx_kubeobjects import names, nodeterms
from phalanx_kubeobjects.quantity import NANO, Bound, count, cpu_millis, memory_bytes, scaled
from phalanx_kubeobjects.violations import Violation, as_list, as_map, as_str, name_of, shown
from phalanx_proto import scheduling as K
from phalanx_proto.scheduling import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    HostPort,
    NodeSelectorTerm,
    PodAffinityTerm,
    SpreadConstraint,
    Toleration,
    WeightedNodeSelectorTerm,
    WeightedPodAffinityTerm,
)

STORAGE_MOST = Bound(2**60, "no node has an EiB of local storage (2^60 bytes)")
COUNT_MOST = Bound(2**40, "no node offers 2^40 units of one extended resource")
PROTOCOLS = ("TCP", "UDP", "SCTP")


class PodConstraints(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the pod asks of a node besides GPUs (the ``MemberSpec`` fields of the same names)."""

    requests: dict[str, int] = {}
    tolerations: tuple[Toleration, ...] = ()
    node_selector: dict[str, str] = {}
    node_affinity: tuple[NodeSelectorTerm, ...] | None = None
    preferred_node_affinity: tuple[WeightedNodeSelectorTerm, ...] = ()
    node_name: str = ""
    host_ports: tuple[HostPort, ...] = ()
    host_network: bool = False
    unsupported: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    soft_spread: tuple[SpreadConstraint, ...] = ()
    preferred_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[WeightedPodAffinityTerm, ...] = ()


def parse_constraints(spec: Mapping[str, Any], gpu_resources: tuple[str, ...], v: list[Violation],
                      labels: Any = None) -> PodConstraints:
    """The constraints of a pod ``spec`` (its ``metadata.labels`` as ``labels``); every broken
    rule is appended to ``v``. ``gpu_resources`` are left to the GPU request."""
    host_network = spec.get("hostNetwork") is True
    own = nodeterms.pod_labels(labels, v, each=False)  # keys and values: names.check_metadata
    affinity, aff_ns = nodeterms.pod_terms(spec, own, "podAffinity", v)
    anti, anti_ns = nodeterms.pod_terms(spec, own, "podAntiAffinity", v)
    selects = tuple(k for k, by in (("podAffinity", aff_ns), ("podAntiAffinity", anti_ns)) if by)
    hard, soft = nodeterms.spread(spec, own, v)
    return PodConstraints(labels=own, pod_affinity=affinity, pod_anti_affinity=anti,
        requests=_requests(spec, gpu_resources, v), tolerations=nodeterms.tolerations(spec.get("tolerations"), v),
        node_selector=nodeterms.node_selector(spec.get("nodeSelector"), v),
        node_affinity=nodeterms.node_affinity(spec, v), preferred_node_affinity=nodeterms.preferred_node_affinity(spec, v),
        node_name=nodeterms.node_name(spec.get("nodeName"), v),
        host_ports=_host_ports(spec, host_network, v), host_network=host_network,
        unsupported=nodeterms.unsupported(selects), spread=hard, soft_spread=soft,
        preferred_affinity=nodeterms.preferred_terms(spec, own, "podAffinity", v),
        preferred_anti_affinity=nodeterms.preferred_terms(spec, own, "podAntiAffinity", v))


# --- requests -------------------------------------------------------------------------------


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """What a running pod of any scheduler requests of its node, every resource included (GPUs
    too): kube-scheduler's sum, as above. Values the API server let through but Phalanx cannot
    read are left out (the node agent reports, it does not validate)."""
    return _requests(spec, (), [])


def pod_host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """The host ports a running pod of any scheduler binds (``hostNetwork`` included)."""
    return _host_ports(spec, spec.get("hostNetwork") is True, [])


def _amount(name: Any, raw: Any, field: str) -> int | Violation:
    if name == CPU:
        return cpu_millis(raw, field)
    if name == MEMORY:
        return memory_bytes(raw, field)
    if name == EPHEMERAL_STORAGE or (isinstance(name, str) and name.startswith("hugepages-")):
        return scaled(raw, field, unit_nanos=NANO, most=STORAGE_MOST)
    if isinstance(name, str) and "/" in name and names.qualified_name(name):
        return count(raw, field, most=COUNT_MOST)
    return Violation(field, shown(name), "not a resource the API server accepts: cpu, memory, ephemeral-storage, "
                                         "hugepages-<size>, or an extended resource named <domain>/<name>")


def _container_requests(c: Mapping[str, Any], where: str, gpu: tuple[str, ...], v: list[Violation]) -> dict[str, int]:
    res = as_map(c.get("resources"))
    requests, limits = as_map(res.get("requests")), as_map(res.get("limits"))
    out: dict[str, int] = {}
    for name in {**limits, **requests}:
        if name in gpu:
            continue
        section = "requests" if name in requests else "limits"
        got = _amount(name, (requests if name in requests else limits)[name],
                      f"{where}.resources.{section}[{shown(name)}]")
        if isinstance(got, Violation):
            v.append(got)
        elif got:
            out[name] = got
    return out


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for k, n in more.items():
        total[k] = total.get(k, 0) + n


def _requests(spec: Mapping[str, Any], gpu: tuple[str, ...], v: list[Violation]) -> dict[str, int]:
    total: dict[str, int] = {}
    for i, c in enumerate(as_list(spec.get("containers"))):
        _add(total, _container_requests(as_map(c), f"spec.containers[{name_of(c, i)}]", gpu, v))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(as_list(spec.get("initContainers"))):
        asks = _container_requests(as_map(c), f"spec.initContainers[{name_of(c, i)}]", gpu, v)
        if _sidecar(c):
            _add(total, asks)
            _add(sidecars, asks)
            use = dict(sidecars)
        else:
            use = dict(asks)
            _add(use, sidecars)
        for k, n in use.items():
            init_peak[k] = max(init_peak.get(k, 0), n)
    for k, n in init_peak.items():
        total[k] = max(total.get(k, 0), n)
    pod_level = as_map(as_map(spec.get("resources")).get("requests"))
    for name in (CPU, MEMORY):
        if name in pod_level:
            got = _amount(name, pod_level[name], f"spec.resources.requests[{name}]")
            if isinstance(got, Violation):
                v.append(got)
            else:
                total[name] = got
    for name, raw in as_map(spec.get("overhead")).items():
        got = _amount(name, raw, f"spec.overhead[{shown(name)}]")
        if isinstance(got, Violation):
            v.append(got)
        else:
            _add(total, {name: got})
    out = {k: n for k, n in sorted(total.items()) if n}
    if len(out) > K.MAX_RESOURCES:
        v.append(Violation("spec.containers[*].resources", f"{len(out)} resources",
                           f"Phalanx reads at most {K.MAX_RESOURCES} different resources per pod"))
    return out


# --- host ports -----------------------------------------------------------------------------


def _host_ports(spec: Mapping[str, Any], host_network: bool, v: list[Violation]) -> tuple[HostPort, ...]:
    running = [(f"spec.containers[{name_of(c, i)}]", as_map(c)) for i, c in enumerate(as_list(spec.get("containers")))]
    running += [(f"spec.initContainers[{name_of(c, i)}]", as_map(c))
                for i, c in enumerate(as_list(spec.get("initContainers"))) if _sidecar(c)]
    out: list[HostPort] = []
    for where, c in running:
        for j, p in enumerate(as_list(c.get("ports"), f"{where}.ports", v)):
            got = _port(as_map(p), f"{where}.ports[{j}]", host_network, v)
            if got is None:
                continue
            if got in out:
                v.append(Violation(f"{where}.ports[{j}].hostPort", str(got.port),
                                   "the pod binds this host port (protocol and IP) twice"))
                continue
            out.append(got)
    if len(out) > K.MAX_HOST_PORTS:
        v.append(Violation("spec.containers[*].ports", f"{len(out)} host ports",
                           f"Phalanx reads at most {K.MAX_HOST_PORTS} host ports per pod"))
        return ()
    return tuple(out)


def _port(p: Mapping[str, Any], field: str, host_network: bool, v: list[Violation]) -> HostPort | None:
    container, host = p.get("containerPort"), p.get("hostPort", 0) or 0
    protocol, ip = as_str(p, "protocol", field, v), as_str(p, "hostIP", field, v)
    if protocol is None or ip is None:
        return None
    protocol = protocol or "TCP"
    if not _is_port(container):
        v.append(Violation(f"{field}.containerPort", shown(container), "a port number from 1 to 65535"))
    elif not (_is_port(host) or host == 0):
        v.append(Violation(f"{field}.hostPort", shown(host), "a port number from 1 to 65535, or 0 for none"))
    elif protocol not in PROTOCOLS:
        v.append(Violation(f"{field}.protocol", shown(protocol), "the protocol is TCP, UDP or SCTP"))
    elif host_network and host and host != container:
        v.append(Violation(f"{field}.hostPort", str(host), "with hostNetwork the host port must equal the "
                                                           f"container port ({container})"))
    else:
        host = container if host_network else host
        return HostPort(port=host, protocol=protocol, host_ip=ip) if host else None
    return None


# --- helpers --------------------------------------------------------------------------------


def _is_port(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65535


def _sidecar(c: Any) -> bool:
    return as_map(c).get("restartPolicy") == "Always"
