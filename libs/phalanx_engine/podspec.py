"""A pod's scheduling constraints besides GPUs, read from the pod (or pod template) the way the
API server defaults them and kube-scheduler reads them.

Called by ``requests.parse_pod`` (so gang-coordinator and ``phalanx validate`` read pods with
the same code). Amounts go through ``quantity`` (the one quantity parser). Every invalid value
is a ``Violation`` naming the field, the value and the rule; constraints Phalanx refuses or
ignores are warnings, so ``phalanx validate`` shows them before the pod is submitted.

* **Requests** (kube-scheduler's sum): containers add up; an init container that is a sidecar
  (``restartPolicy: Always``) adds up too, any other init container counts with the sidecars
  started before it and the pod needs the largest of those; ``overhead`` is added; pod-level
  ``resources.requests`` for cpu and memory replace the containers' sum. A container that
  gives only a limit requests that limit (API server defaulting). GPU resources are the GPU
  request's (``requests.RESOURCES``), not counted here.
* **Host ports**: ``hostPort`` of containers and sidecars; with ``hostNetwork: true`` every
  ``containerPort`` is a host port (API server defaulting).
* **Refused**: required pod affinity, anti-affinity and ``DoNotSchedule`` topology spread
  (``MemberSpec.unsupported``); **ignored with a warning**: their preferred forms, preferred
  node affinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from phalanx_engine.quantity import NANO, Bound, Violation, count, cpu_millis, memory_bytes, scaled, shown
from phalanx_proto.scheduling import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    HostPort,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
)

STORAGE_MOST = Bound(2**60, "no node has an EiB of local storage (2^60 bytes)")
COUNT_MOST = Bound(2**40, "no node offers 2^40 units of one extended resource")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
PROTOCOLS = ("TCP", "UDP", "SCTP")
_AFFINITY = "spec.affinity"


class PodConstraints(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the pod asks of a node besides GPUs (the ``MemberSpec`` fields of the same names)."""

    requests: dict[str, int] = {}
    tolerations: tuple[Toleration, ...] = ()
    node_selector: dict[str, str] = {}
    node_affinity: tuple[NodeSelectorTerm, ...] | None = None
    node_name: str = ""
    host_ports: tuple[HostPort, ...] = ()
    host_network: bool = False
    unsupported: tuple[str, ...] = ()


def parse_constraints(spec: Mapping[str, Any], gpu_resources: tuple[str, ...], v: list[Violation],
                      warnings: list[str]) -> PodConstraints:
    """The constraints of a pod ``spec``; every broken rule is appended to ``v``, every
    constraint Phalanx refuses or ignores to ``warnings``. ``gpu_resources`` are left to the
    GPU request."""
    host_network = spec.get("hostNetwork") is True
    return PodConstraints(
        requests=_requests(spec, gpu_resources, v), tolerations=_tolerations(spec.get("tolerations"), v),
        node_selector=_selector(spec.get("nodeSelector"), v), node_affinity=_node_affinity(spec, v, warnings),
        node_name=spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else "",
        host_ports=_host_ports(spec, host_network, v), host_network=host_network,
        unsupported=_unsupported(spec, warnings))


# --- requests -------------------------------------------------------------------------------


def _amount(name: str, raw: Any, field: str) -> int | Violation:
    if name == CPU:
        return cpu_millis(raw, field)
    if name == MEMORY:
        return memory_bytes(raw, field)
    if name == EPHEMERAL_STORAGE or name.startswith("hugepages-"):
        return scaled(raw, field, unit_nanos=NANO, most=STORAGE_MOST)
    if "/" in name:
        return count(raw, field, most=COUNT_MOST)
    return Violation(field, name, "not a resource the API server accepts: cpu, memory, ephemeral-storage, "
                                  "hugepages-<size>, or an extended resource named <domain>/<name>")


def _container_requests(c: Mapping[str, Any], where: str, gpu: tuple[str, ...], v: list[Violation]) -> dict[str, int]:
    res = _map(c.get("resources"))
    requests, limits = _map(res.get("requests")), _map(res.get("limits"))
    out: dict[str, int] = {}
    for name in {**limits, **requests}:
        if name in gpu:
            continue
        section = "requests" if name in requests else "limits"
        got = _amount(str(name), (requests if name in requests else limits)[name],
                      f"{where}.resources.{section}[{name}]")
        if isinstance(got, Violation):
            v.append(got)
        elif got:
            out[str(name)] = got
    return out


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for k, n in more.items():
        total[k] = total.get(k, 0) + n


def _requests(spec: Mapping[str, Any], gpu: tuple[str, ...], v: list[Violation]) -> dict[str, int]:
    total: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("containers"))):
        _add(total, _container_requests(_map(c), f"spec.containers[{_name(c, i)}]", gpu, v))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("initContainers"))):
        asks = _container_requests(_map(c), f"spec.initContainers[{_name(c, i)}]", gpu, v)
        if _map(c).get("restartPolicy") == "Always":
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
    pod_level = _map(_map(spec.get("resources")).get("requests"))
    for name in (CPU, MEMORY):
        if name in pod_level:
            got = _amount(name, pod_level[name], f"spec.resources.requests[{name}]")
            if isinstance(got, Violation):
                v.append(got)
            else:
                total[name] = got
    for name, raw in _map(spec.get("overhead")).items():
        got = _amount(str(name), raw, f"spec.overhead[{name}]")
        if isinstance(got, Violation):
            v.append(got)
        else:
            _add(total, {str(name): got})
    return {k: n for k, n in sorted(total.items()) if n}


# --- tolerations, selectors, affinity -------------------------------------------------------


def _tolerations(raw: Any, v: list[Violation]) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(_list(raw)):
        t, field = _map(t), f"spec.tolerations[{i}]"
        key, op, value, effect = (str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                                  str(t.get("value") or ""), str(t.get("effect") or ""))
        if op not in ("Equal", "Exists"):
            v.append(Violation(f"{field}.operator", op, "a toleration's operator is Equal or Exists (Phalanx "
                                                         "does not take the Lt/Gt comparison operators)"))
            continue
        if effect not in EFFECTS:
            v.append(Violation(f"{field}.effect", effect, "the effect is NoSchedule, PreferNoSchedule, NoExecute "
                                                          "or empty for all"))
            continue
        if not key and op != "Exists":
            v.append(Violation(f"{field}.operator", op, "a toleration without a key must use operator Exists "
                                                        "(it then tolerates every taint)"))
            continue
        if op == "Exists" and value:
            v.append(Violation(f"{field}.value", value, "a toleration with operator Exists takes no value"))
            continue
        out.append(Toleration(key=key, operator=op, value=value, effect=effect))
    return tuple(out)


def _selector(raw: Any, v: list[Violation]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        v.append(Violation("spec.nodeSelector", shown(raw), "nodeSelector maps label keys to string values"))
        return {}
    bad = [k for k, x in raw.items() if not isinstance(x, str)]
    for k in bad:
        v.append(Violation(f"spec.nodeSelector[{k}]", shown(raw[k]), "a label value is a string: write it in quotes"))
    return {} if bad else {str(k): x for k, x in raw.items()}


def _requirement(r: Any, field: str, fields: bool, v: list[Violation]) -> NodeSelectorRequirement | None:
    r = _map(r)
    key, op, values = str(r.get("key") or ""), str(r.get("operator") or ""), r.get("values") or []
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        v.append(Violation(f"{field}.values", shown(values), "values is a list of strings"))
        return None
    if fields and (key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1):
        v.append(Violation(field, f"{key} {op} {values}", "matchFields supports only metadata.name with In or "
                                                          "NotIn and exactly one value"))
        return None
    if op not in OPERATORS:
        v.append(Violation(f"{field}.operator", op, f"the operator is one of {', '.join(OPERATORS)}"))
        return None
    if op in ("In", "NotIn") and not values:
        v.append(Violation(f"{field}.values", "[]", f"{op} needs at least one value"))
        return None
    if op in ("Exists", "DoesNotExist") and values:
        v.append(Violation(f"{field}.values", ", ".join(values), f"{op} takes no values"))
        return None
    if op in ("Gt", "Lt") and len(values) != 1:
        v.append(Violation(f"{field}.values", ", ".join(values), f"{op} takes exactly one value (an integer)"))
        return None
    return NodeSelectorRequirement(key=key, operator=op, values=tuple(values))


def _node_affinity(spec: Mapping[str, Any], v: list[Violation], warnings: list[str]
                   ) -> tuple[NodeSelectorTerm, ...] | None:
    na = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    if na.get("preferredDuringSchedulingIgnoredDuringExecution"):
        warnings.append(f"{_AFFINITY}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution is ignored: "
                        "Phalanx ranks nodes by GPU topology, not by preferred node affinity")
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    field = f"{_AFFINITY}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    terms = []
    for i, t in enumerate(_list(_map(required).get("nodeSelectorTerms"))):
        t = _map(t)
        exprs = [_requirement(r, f"{field}[{i}].matchExpressions[{j}]", False, v)
                 for j, r in enumerate(_list(t.get("matchExpressions")))]
        fields = [_requirement(r, f"{field}[{i}].matchFields[{j}]", True, v)
                  for j, r in enumerate(_list(t.get("matchFields")))]
        terms.append(NodeSelectorTerm(match_expressions=tuple(x for x in exprs if x),
                                      match_fields=tuple(x for x in fields if x)))
    if not terms:
        v.append(Violation(field, "[]", "required node affinity needs at least one node selector term"))
    return tuple(terms)


def _unsupported(spec: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    refused = []
    affinity = _map(spec.get("affinity"))
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = _map(affinity.get(kind))
        if terms.get("requiredDuringSchedulingIgnoredDuringExecution"):
            refused.append(kind)
            warnings.append(f"{_AFFINITY}.{kind}.requiredDuringSchedulingIgnoredDuringExecution: Phalanx refuses "
                            "pods with required pod (anti-)affinity (it needs the labels of the pods on every "
                            "node, which Phalanx's cluster state does not carry); the pod will wait with that reason")
        if terms.get("preferredDuringSchedulingIgnoredDuringExecution"):
            warnings.append(f"{_AFFINITY}.{kind}.preferredDuringSchedulingIgnoredDuringExecution is ignored: "
                            "Phalanx does not evaluate pod (anti-)affinity")
    spread = [_map(c) for c in _list(spec.get("topologySpreadConstraints"))]
    if any(c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule" for c in spread):
        refused.append("topologySpreadConstraints")
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable DoNotSchedule: Phalanx refuses "
                        "pods with hard topology spread (it needs the labels of the pods on every node); the "
                        "pod will wait with that reason")
    elif spread:
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable ScheduleAnyway are ignored: Phalanx "
                        "does not evaluate topology spread")
    return tuple(refused)


# --- host ports -----------------------------------------------------------------------------


def _host_ports(spec: Mapping[str, Any], host_network: bool, v: list[Violation]) -> tuple[HostPort, ...]:
    running = [(f"spec.containers[{_name(c, i)}]", _map(c)) for i, c in enumerate(_list(spec.get("containers")))]
    running += [(f"spec.initContainers[{_name(c, i)}]", _map(c)) for i, c in enumerate(_list(spec.get("initContainers")))
                if _map(c).get("restartPolicy") == "Always"]
    out: list[HostPort] = []
    for where, c in running:
        for j, p in enumerate(_list(c.get("ports"))):
            got = _port(_map(p), f"{where}.ports[{j}]", host_network, v)
            if got is None:
                continue
            if any(q.port == got.port and q.protocol == got.protocol and q.host_ip == got.host_ip for q in out):
                v.append(Violation(f"{where}.ports[{j}].hostPort", str(got.port),
                                   "the pod binds this host port (protocol and IP) twice"))
                continue
            out.append(got)
    return tuple(out)


def _port(p: Mapping[str, Any], field: str, host_network: bool, v: list[Violation]) -> HostPort | None:
    container, host = p.get("containerPort"), p.get("hostPort", 0) or 0
    protocol, ip = str(p.get("protocol") or "TCP"), str(p.get("hostIP") or "")
    if not _is_port(container):
        v.append(Violation(f"{field}.containerPort", shown(container), "a port number from 1 to 65535"))
        return None
    if not (_is_port(host) or host == 0):
        v.append(Violation(f"{field}.hostPort", shown(host), "a port number from 1 to 65535, or 0 for none"))
        return None
    if protocol not in PROTOCOLS:
        v.append(Violation(f"{field}.protocol", protocol, "the protocol is TCP, UDP or SCTP"))
        return None
    if host_network:
        if host and host != container:
            v.append(Violation(f"{field}.hostPort", str(host), "with hostNetwork the host port must equal the "
                                                               f"container port ({container})"))
            return None
        host = container
    return HostPort(port=host, protocol=protocol, host_ip=ip) if host else None


# --- helpers --------------------------------------------------------------------------------


def _is_port(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65535


def _map(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _list(x: Any) -> list:
    return x if isinstance(x, list) else []


def _name(c: Any, i: int) -> str:
    return str(_map(c).get("name") or i)
