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
  request's (``requests.RESOURCES``), not counted here.
* **Host ports**: ``hostPort`` of containers and sidecars; with ``hostNetwork: true`` every
  ``containerPort`` is a host port (API server defaulting).
* **Refused**: required pod affinity, anti-affinity and ``DoNotSchedule`` topology spread
  (``MemberSpec.unsupported``: the pod waits with that reason); **ignored with a warning**:
  their preferred forms, preferred node affinity.
* **Bounds** (``phalanx_proto.scheduling.MAX_*``): tighter than the API server's, each a
  violation that says so; they keep a gang's request within one message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from phalanx_kubeobjects import names
from phalanx_kubeobjects.quantity import (
    NANO,
    Bound,
    Violation,
    count,
    cpu_millis,
    memory_bytes,
    scaled,
    shown,
)
from phalanx_proto import scheduling as K
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
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
_AFFINITY = "spec.affinity"
_TERMS = f"{_AFFINITY}.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
WHY_POD_AFFINITY = ("it needs the labels of the pods on every node, which Phalanx's cluster state does not carry; "
                    "the pod would wait with that reason")


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
        node_name=_node_name(spec.get("nodeName"), v), host_ports=_host_ports(spec, host_network, v),
        host_network=host_network, unsupported=_unsupported(spec, warnings))


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
    res = _map(c.get("resources"))
    requests, limits = _map(res.get("requests")), _map(res.get("limits"))
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
    for i, c in enumerate(_list(spec.get("containers"))):
        _add(total, _container_requests(_map(c), f"spec.containers[{_name(c, i)}]", gpu, v))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("initContainers"))):
        asks = _container_requests(_map(c), f"spec.initContainers[{_name(c, i)}]", gpu, v)
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
    pod_level = _map(_map(spec.get("resources")).get("requests"))
    for name in (CPU, MEMORY):
        if name in pod_level:
            got = _amount(name, pod_level[name], f"spec.resources.requests[{name}]")
            if isinstance(got, Violation):
                v.append(got)
            else:
                total[name] = got
    for name, raw in _map(spec.get("overhead")).items():
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


# --- tolerations, selectors, affinity -------------------------------------------------------


def _tolerations(raw: Any, v: list[Violation]) -> tuple[Toleration, ...]:
    items = _list(raw, "spec.tolerations", v)
    if len(items) > K.MAX_TOLERATIONS:
        v.append(Violation("spec.tolerations", f"{len(items)} tolerations",
                           f"Phalanx reads at most {K.MAX_TOLERATIONS} tolerations per pod"))
        return ()
    out = []
    for i, t in enumerate(items):
        field = f"spec.tolerations[{i}]"
        t = _map(t)
        key, op, value, effect = (_str(t, "key", field, v), _str(t, "operator", field, v),
                                  _str(t, "value", field, v), _str(t, "effect", field, v))
        if key is None or op is None or value is None or effect is None:
            continue
        op = op or "Equal"
        if op not in ("Equal", "Exists"):
            v.append(Violation(f"{field}.operator", shown(op), "a toleration's operator is Equal or Exists (Phalanx "
                                                               "does not take the Lt/Gt comparison operators)"))
        elif effect not in EFFECTS:
            v.append(Violation(f"{field}.effect", shown(effect), "the effect is NoSchedule, PreferNoSchedule, "
                                                                 "NoExecute or empty for all"))
        elif key and not names.qualified_name(key):
            v.append(Violation(f"{field}.key", shown(key), f"a taint key {names.QUALIFIED_RULE}"))
        elif not key and op != "Exists":
            v.append(Violation(f"{field}.operator", op, "a toleration without a key must use operator Exists "
                                                        "(it then tolerates every taint)"))
        elif op == "Exists" and value:
            v.append(Violation(f"{field}.value", shown(value), "a toleration with operator Exists takes no value"))
        elif not names.label_value(value):
            v.append(Violation(f"{field}.value", shown(value), f"a taint value: {names.VALUE_RULE}"))
        else:
            out.append(Toleration(key=key, operator=op, value=value, effect=effect))
    return tuple(out)


def _selector(raw: Any, v: list[Violation]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        v.append(Violation("spec.nodeSelector", shown(raw), "nodeSelector maps label keys to string values"))
        return {}
    if len(raw) > K.MAX_SELECTOR_LABELS:
        v.append(Violation("spec.nodeSelector", f"{len(raw)} labels",
                           f"Phalanx reads at most {K.MAX_SELECTOR_LABELS} nodeSelector labels per pod"))
        return {}
    before = len(v)
    for k, x in raw.items():
        field = f"spec.nodeSelector[{shown(k)}]"
        if not names.qualified_name(k):
            v.append(Violation(field, shown(k), f"a label key {names.QUALIFIED_RULE}"))
        elif not isinstance(x, str):
            v.append(Violation(field, shown(x), "a label value is a string: write it in quotes"))
        elif not names.label_value(x):
            v.append(Violation(field, shown(x), names.VALUE_RULE))
    return {} if len(v) > before else dict(raw)


def _requirement(r: Any, field: str, fields: bool, v: list[Violation]) -> NodeSelectorRequirement | None:
    r = _map(r)
    key, op = _str(r, "key", field, v), _str(r, "operator", field, v)
    values = r.get("values") or []
    if key is None or op is None:
        return None
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        v.append(Violation(f"{field}.values", shown(values) if not isinstance(values, list) else "a list",
                           "values is a list of strings"))
        return None
    if len(values) > K.MAX_VALUES:
        v.append(Violation(f"{field}.values", f"{len(values)} values",
                           f"Phalanx reads at most {K.MAX_VALUES} values per requirement"))
        return None
    if fields and (key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1):
        v.append(Violation(field, shown(f"{key} {op} {', '.join(values[:4])}"),
                           "matchFields supports only metadata.name with In or NotIn and exactly one value"))
        return None
    rule = _requirement_rule(op, values)
    if rule:
        v.append(Violation(f"{field}.{'operator' if op not in OPERATORS else 'values'}",
                           shown(op if op not in OPERATORS else ", ".join(values[:8]) or "[]"), rule))
        return None
    if not fields and not names.qualified_name(key):
        v.append(Violation(f"{field}.key", shown(key), f"a label key {names.QUALIFIED_RULE}"))
        return None
    return NodeSelectorRequirement(key=key, operator=op, values=tuple(values))


def _requirement_rule(op: str, values: list[str]) -> str:
    """The API server's rule ``op`` and ``values`` break together, or ''."""
    if op not in OPERATORS:
        return f"the operator is one of {', '.join(OPERATORS)}"
    if op in ("In", "NotIn") and not values:
        return f"{op} needs at least one value"
    if op in ("Exists", "DoesNotExist") and values:
        return f"{op} takes no values"
    if op in ("Gt", "Lt") and len(values) != 1:
        return f"{op} takes exactly one value (an integer)"
    return ""


def _node_affinity(spec: Mapping[str, Any], v: list[Violation], warnings: list[str]
                   ) -> tuple[NodeSelectorTerm, ...] | None:
    na = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    if na.get(PREFERRED):
        warnings.append(f"{_AFFINITY}.nodeAffinity.{PREFERRED} is ignored: Phalanx ranks nodes by GPU topology and "
                        "packing, not by preferred node affinity")
    required = na.get(REQUIRED)
    if required is None:
        return None
    items = _list(_map(required).get("nodeSelectorTerms"), _TERMS, v)
    if not items:
        v.append(Violation(_TERMS, "[]", "required node affinity needs at least one node selector term"))
        return ()
    if len(items) > K.MAX_TERMS:
        v.append(Violation(_TERMS, f"{len(items)} terms", f"Phalanx reads at most {K.MAX_TERMS} node selector terms"))
        return ()
    terms = []
    for i, t in enumerate(items):
        t, where = _map(t), f"{_TERMS}[{i}]"
        parts = []
        for section, fields in (("matchExpressions", False), ("matchFields", True)):
            got = _list(t.get(section), f"{where}.{section}", v)
            if len(got) > K.MAX_REQUIREMENTS:
                v.append(Violation(f"{where}.{section}", f"{len(got)} requirements",
                                   f"Phalanx reads at most {K.MAX_REQUIREMENTS} requirements per term"))
                got = []
            parts.append(tuple(x for j, r in enumerate(got)
                               if (x := _requirement(r, f"{where}.{section}[{j}]", fields, v)) is not None))
        terms.append(NodeSelectorTerm(match_expressions=parts[0], match_fields=parts[1]))
    return tuple(terms)


def _node_name(raw: Any, v: list[Violation]) -> str:
    if raw is None or raw == "":
        return ""
    if not names.dns_subdomain(raw):
        v.append(Violation("spec.nodeName", shown(raw), f"a node name {names.SUBDOMAIN_RULE}"))
        return ""
    return raw


def _unsupported(spec: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    refused = []
    affinity = _map(spec.get("affinity"))
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = _map(affinity.get(kind))
        if terms.get(REQUIRED):
            refused.append(kind)
            warnings.append(f"{_AFFINITY}.{kind}.{REQUIRED}: Phalanx refuses required pod "
                            f"{'anti-' if kind == 'podAntiAffinity' else ''}affinity ({WHY_POD_AFFINITY})")
        if terms.get(PREFERRED):
            warnings.append(f"{_AFFINITY}.{kind}.{PREFERRED} is ignored: Phalanx does not evaluate pod "
                            "(anti-)affinity")
    spread = [_map(c) for c in _list(spec.get("topologySpreadConstraints"))]
    if any(c.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule" for c in spread):
        refused.append("topologySpreadConstraints")
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable DoNotSchedule: Phalanx refuses hard "
                        f"topology spread ({WHY_POD_AFFINITY})")
    elif spread:
        warnings.append("spec.topologySpreadConstraints with whenUnsatisfiable ScheduleAnyway is ignored: Phalanx "
                        "does not evaluate topology spread")
    return tuple(refused)


# --- host ports -----------------------------------------------------------------------------


def _host_ports(spec: Mapping[str, Any], host_network: bool, v: list[Violation]) -> tuple[HostPort, ...]:
    running = [(f"spec.containers[{_name(c, i)}]", _map(c)) for i, c in enumerate(_list(spec.get("containers")))]
    running += [(f"spec.initContainers[{_name(c, i)}]", _map(c))
                for i, c in enumerate(_list(spec.get("initContainers"))) if _sidecar(c)]
    out: list[HostPort] = []
    for where, c in running:
        for j, p in enumerate(_list(c.get("ports"), f"{where}.ports", v)):
            got = _port(_map(p), f"{where}.ports[{j}]", host_network, v)
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
    protocol, ip = _str(p, "protocol", field, v), _str(p, "hostIP", field, v)
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
    return _map(c).get("restartPolicy") == "Always"


def _map(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _list(x: Any, field: str = "", v: list[Violation] | None = None) -> list:
    """``x`` when it is a list; otherwise empty, and (with ``field``) a violation unless absent."""
    if isinstance(x, list):
        return x
    if v is not None and x is not None:
        v.append(Violation(field, shown(x), "must be a list"))
    return []


def _str(m: Mapping[str, Any], key: str, field: str, v: list[Violation]) -> str | None:
    """``m[key]`` as text ('' when absent); None, with a violation, when it is not a string."""
    x = m.get(key)
    if x is None or isinstance(x, str):
        return x or ""
    v.append(Violation(f"{field}.{key}", shown(x), "must be a string"))
    return None


def _name(c: Any, i: int) -> str:
    name = _map(c).get("name")
    return shown(name) if isinstance(name, str) and name else str(i)
