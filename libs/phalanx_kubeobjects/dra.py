"""Dynamic Resource Allocation objects (``resource.k8s.io/v1``) read into the wire contract
(``phalanx_proto.dra``), and the JSON Phalanx writes back. Pure: gang-coordinator reads what its
watches of the API hold (``ClusterPort.watch_device_classes``/``_resource_slices``/
``_resource_claims``) through these functions; binder writes what they build.

Readers (a value, or the first ``Violation`` naming the field, e.g.
``spec.devices.requests[1].exactly.count``, and the API server's rule; never an exception):

* ``device_class(obj)`` -> ``DeviceClassRef``;
* ``resource_slice(obj)`` -> ``(driver, pool, Slice)``;
* ``claim_spec(obj, classes)`` -> ``ClaimSpec``: each request's and subrequest's DeviceClass
  resolved from ``classes`` (by name; a missing one is ``DeviceClassRef(name, missing=True)``),
  its allocation when it has one (``allocation``);
* ``claim_in_use(obj)`` -> the devices a claim's allocation holds, per pool (admin access
  excluded; a shared device's share and consumed capacity kept);
* ``pod_claims(pod)`` -> each ``spec.resourceClaims`` entry's claim name, by the upstream rules
  (``resourceClaimName``, or a template's claim as ``status.resourceClaimStatuses`` names it:
  ``None`` when the claim is not needed, ``Waiting`` while it is not created yet);
  ``claim_for_pod`` checks that a template's claim is the pod's own (controller owner);
* ``extended_resource_classes(classes)``, ``extended_requests(pod, by_resource)``: the requests
  of the claim Phalanx makes for extended resources backed by DRA (KEP-5004).

Writers (the API's camelCase JSON): ``allocation_status`` (``status.allocation``),
``reserved_for_entry`` (one ``status.reservedFor`` entry), ``extended_claim`` (the
extended-resource claim object) and ``extended_claim_status`` (``pod.status.extendedResourceClaimStatus``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

import msgspec

from phalanx_kubeobjects import names, quantity
from phalanx_kubeobjects.drafields import (
    Bad,
    attribute,
    bad,
    capacity,
    cel_selectors,
    check,
    condition_types,
    counter_values,
    driver,
    flag,
    fully_qualified,
    integer,
    items,
    label,
    listed,
    mapping,
    node_selection,
    node_selector,
    opaque,
    pool_name,
    qualified,
    quantities,
    request_names,
    subdomain,
    taint,
    text,
    toleration,
)
from phalanx_kubeobjects.violations import Violation, shown
from phalanx_proto import dra as D
from phalanx_proto.events import PodRef
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm

API_VERSION = "resource.k8s.io/v1"
RESERVED_FOR_RESOURCE = "pods"
NOT_CREATED_YET = "ResourceClaim not created yet"


class Waiting(msgspec.Struct, frozen=True):
    """A pod claim whose ResourceClaim does not exist yet (the pod waits; not an error)."""

    reason: str


ExtendedRequest = D.ExtendedRequest
"""One request of the extended-resource claim (the wire type; ``extended_requests`` makes them)."""


# --- DeviceClass -----------------------------------------------------------------------------------
def device_class(obj: Any) -> D.DeviceClassRef | Violation:
    """A DeviceClass as requests use it: selectors, config, extended resource name."""
    try:
        meta, spec = mapping(_m(obj).get("metadata"), "metadata"), mapping(_m(obj).get("spec"), "spec")
        ext = text(spec, "extendedResourceName", "spec", most=317)
        if ext and ("/" not in ext or not names.qualified_name(ext) or ext.split("/")[0].endswith("kubernetes.io")):
            bad("spec.extendedResourceName", ext, "an extended resource name: <domain>/<name>, outside kubernetes.io")
        config = listed(spec.get("config"), "spec.config", D.MAX_CONFIGS, "config entries",
                        lambda x, f: D.ClassConfig(opaque=opaque(mapping(x, f, required=True).get("opaque"), f"{f}.opaque")))
        return check(D.DeviceClassRef(name=subdomain(meta, "name", "metadata"),
                                      selectors=cel_selectors(spec.get("selectors"), "spec.selectors"),
                                      config=config, extended_resource_name=ext), "DeviceClass")
    except Bad as e:
        return e.violation


# --- ResourceSlice ---------------------------------------------------------------------------------
def resource_slice(obj: Any) -> tuple[str, str, D.Slice] | Violation:
    """A ResourceSlice: its driver, its pool's name, and the slice."""
    try:
        meta, spec = mapping(_m(obj).get("metadata"), "metadata"), mapping(_m(obj).get("spec"), "spec", required=True)
        pool = mapping(spec.get("pool"), "spec.pool", required=True)
        nodes, per_device = node_selection(spec, "spec", per_device_allowed=True)
        devices = listed(spec.get("devices"), "spec.devices", D.MAX_DEVICES_PER_SLICE, "devices",
                         lambda x, f: _device(x, f, per_device))
        seen: set[str] = set()
        for i, d in enumerate(devices):
            if d.name in seen:
                bad(f"spec.devices[{i}].name", d.name, "device names are unique within a slice")
            seen.add(d.name)
        shared = listed(spec.get("sharedCounters"), "spec.sharedCounters", D.MAX_COUNTER_SETS, "counter sets",
                        lambda x, f: D.CounterSet(name=label(mapping(x, f, required=True), "name", f),
                                                  counters=counter_values(x.get("counters"), f"{f}.counters")))
        if len({c.name for c in shared}) != len(shared):
            bad("spec.sharedCounters", [c.name for c in shared], "counter set names are unique within a slice")
        value = D.Slice(name=subdomain(meta, "name", "metadata"),
                        generation=integer(pool, "generation", "spec.pool", least=0, most=2**63 - 1, default=0),
                        slice_count=integer(pool, "resourceSliceCount", "spec.pool", least=1, most=2**63 - 1, default=1),
                        nodes=nodes, per_device_nodes=per_device, devices=devices, shared_counters=shared)
        return driver(spec, "driver", "spec"), pool_name(pool, "name", "spec.pool"), check(value, "ResourceSlice")
    except Bad as e:
        return e.violation


def _device(raw: Any, field: str, per_device: bool) -> D.Device:
    m = mapping(raw, field, required=True)
    attrs = mapping(m.get("attributes"), f"{field}.attributes")
    caps = mapping(m.get("capacity"), f"{field}.capacity")
    if len(attrs) + len(caps) > D.MAX_ATTRIBUTES:
        bad(field, f"{len(attrs) + len(caps)} attributes and capacities",
            f"at most {D.MAX_ATTRIBUTES} attributes and capacities together")
    nodes = None
    if per_device:
        nodes = node_selection(m, field, per_device_allowed=False)[0]
    elif any(m.get(k) not in (None, "", False) for k in ("nodeName", "nodeSelector", "allNodes")):
        bad(field, "a node selection", "a device says its nodes only in a slice with perDeviceNodeSelection")
    uses = listed(m.get("consumesCounters"), f"{field}.consumesCounters", D.MAX_CONSUMES, "counter sets",
                  lambda x, f: D.CounterUse(counter_set=label(mapping(x, f, required=True), "counterSet", f),
                                            counters=counter_values(x.get("counters"), f"{f}.counters")))
    return D.Device(
        name=label(m, "name", field),
        attributes={qualified(k, f"{field}.attributes[{shown(k)}]"): attribute(v, f"{field}.attributes[{shown(k)}]")
                    for k, v in attrs.items()},
        capacity={qualified(k, f"{field}.capacity[{shown(k)}]"): capacity(v, f"{field}.capacity[{shown(k)}]")
                  for k, v in caps.items()},
        consumes_counters=uses,
        taints=listed(m.get("taints"), f"{field}.taints", D.MAX_DEVICE_TAINTS, "taints", taint),
        allow_multiple_allocations=flag(m, "allowMultipleAllocations", field),
        binds_to_node=flag(m, "bindsToNode", field),
        binding_conditions=condition_types(m, "bindingConditions", field),
        binding_failure_conditions=condition_types(m, "bindingFailureConditions", field),
        nodes=nodes)


# --- ResourceClaim ---------------------------------------------------------------------------------
def claim_spec(obj: Any, classes: Mapping[str, D.DeviceClassRef]) -> D.ClaimSpec | Violation:
    """What a claim asks, each (sub)request's DeviceClass resolved from ``classes``, and its
    allocation when it has one."""
    try:
        meta = mapping(_m(obj).get("metadata"), "metadata", required=True)
        devices = mapping(mapping(_m(obj).get("spec"), "spec").get("devices"), "spec.devices")
        where = "spec.devices.requests"
        requests = listed(devices.get("requests"), where, D.MAX_REQUESTS, "requests",
                          lambda x, f: _request(x, f, classes))
        known = {r.name for r in requests} | {f"{r.name}/{s.name}" for r in requests for s in r.first_available}
        if len(known) != len(requests) + sum(len(r.first_available) for r in requests):
            bad(where, [r.name for r in requests], "request names (and each request's subrequest names) are unique")
        constraints = listed(devices.get("constraints"), "spec.devices.constraints", D.MAX_CONSTRAINTS, "constraints",
                             lambda x, f: _constraint(x, f, known))
        config = listed(devices.get("config"), "spec.devices.config", D.MAX_CONFIGS, "config entries",
                        lambda x, f: _claim_config(x, f, known))
        status = mapping(_m(obj).get("status"), "status")
        alloc = _allocation(status["allocation"], "status.allocation") if status.get("allocation") else None
        domain = _m(meta.get("labels")).get(D.COMPUTE_DOMAIN_LABEL)
        return check(D.ClaimSpec(namespace=label(meta, "namespace", "metadata"), name=subdomain(meta, "name", "metadata"),
                                 uid=text(meta, "uid", "metadata", most=64), requests=requests,
                                 constraints=constraints, config=config, allocation=alloc,
                                 compute_domain=domain if isinstance(domain, str) else ""), "ResourceClaim")
    except Bad as e:
        return e.violation


def _request(raw: Any, field: str, classes: Mapping[str, D.DeviceClassRef]) -> D.DeviceRequest:
    m = mapping(raw, field, required=True)
    name = label(m, "name", field)
    exactly, first = m.get("exactly"), m.get("firstAvailable")
    if (exactly is None) == (first is None):
        bad(field, "both" if exactly is not None else "neither", "exactly one of exactly and firstAvailable")
    if exactly is not None:
        return D.DeviceRequest(name=name, exactly=_exact(exactly, f"{field}.exactly", classes, sub=False))
    subs = items(first, f"{field}.firstAvailable", D.MAX_SUBREQUESTS, "subrequests", least=1)
    return D.DeviceRequest(name=name, first_available=tuple(
        _exact(x, f"{field}.firstAvailable[{i}]", classes, sub=True) for i, x in enumerate(subs)))


def _exact(raw: Any, field: str, classes: Mapping[str, D.DeviceClassRef], *, sub: bool) -> D.ExactRequest:
    m = mapping(raw, field, required=True)
    cls = subdomain(m, "deviceClassName", field)
    mode = text(m, "allocationMode", field, most=16) or "ExactCount"
    if mode not in ("ExactCount", "All"):
        bad(f"{field}.allocationMode", mode, "ExactCount or All")
    if mode == "All" and m.get("count") not in (None, 0):
        bad(f"{field}.count", m.get("count"), "allocationMode All takes no count")
    count = integer(m, "count", field, least=1, most=D.MAX_RESULTS, default=1) if mode == "ExactCount" else 1
    if sub and m.get("adminAccess") is not None:
        bad(f"{field}.adminAccess", m.get("adminAccess"), "a subrequest has no adminAccess")
    return D.ExactRequest(
        name=label(m, "name", field) if sub else "",
        device_class=classes.get(cls) or D.DeviceClassRef(name=cls, missing=True),
        selectors=cel_selectors(m.get("selectors"), f"{field}.selectors"),
        allocation_mode=cast(D.AllocationMode, mode), count=count, admin_access=flag(m, "adminAccess", field),
        tolerations=listed(m.get("tolerations"), f"{field}.tolerations", 16, "tolerations", toleration),
        capacity=quantities(mapping(m.get("capacity"), f"{field}.capacity").get("requests"),
                            f"{field}.capacity.requests", D.MAX_ATTRIBUTES))


def _names_known(raw: Any, field: str, known: set[str]) -> tuple[str, ...]:
    got = request_names(raw, field)
    for i, r in enumerate(got):
        if r not in known:
            bad(f"{field}[{i}]", r, "must name a request (or <request>/<subrequest>) of this claim")
    return got


def _constraint(raw: Any, field: str, known: set[str]) -> D.DeviceConstraint:
    m = mapping(raw, field, required=True)
    match, distinct = fully_qualified(m, "matchAttribute", field), fully_qualified(m, "distinctAttribute", field)
    if bool(match) == bool(distinct):
        bad(field, "both" if match else "neither", "exactly one of matchAttribute and distinctAttribute")
    return D.DeviceConstraint(requests=_names_known(m.get("requests"), f"{field}.requests", known),
                              match_attribute=match, distinct_attribute=distinct)


def _claim_config(raw: Any, field: str, known: set[str]) -> D.ClaimConfig:
    m = mapping(raw, field, required=True)
    return D.ClaimConfig(requests=_names_known(m.get("requests"), f"{field}.requests", known),
                         opaque=opaque(m.get("opaque"), f"{field}.opaque"))


def _allocation(raw: Any, field: str = "status.allocation") -> D.ClaimAllocation:
    m = mapping(raw, field, required=True)
    devices = mapping(m.get("devices"), f"{field}.devices")
    results = listed(devices.get("results"), f"{field}.devices.results", D.MAX_RESULTS, "results", _result)
    config = listed(devices.get("config"), f"{field}.devices.config", 2 * D.MAX_CONFIGS, "config entries", _alloc_config)
    selector = node_selector(m["nodeSelector"], f"{field}.nodeSelector") if m.get("nodeSelector") else None
    return D.ClaimAllocation(devices=results, config=config, node_selector=selector)


def allocation_of(obj: Any) -> D.ClaimAllocation | None | Violation:
    """A claim's ``status.allocation`` (None: not allocated)."""
    try:
        raw = mapping(mapping(_m(obj).get("status"), "status").get("allocation"), "status.allocation")
        return check(_allocation(raw), "ResourceClaim") if raw else None
    except Bad as e:
        return e.violation


def _result(raw: Any, field: str) -> D.AllocatedDevice:
    m = mapping(raw, field, required=True)
    request = text(m, "request", field, required=True, most=127)
    if not all(names.dns_label(p) for p in request.split("/", 1)):
        bad(f"{field}.request", request, "a request name, or <request>/<subrequest>")
    return D.AllocatedDevice(
        request=request, driver=driver(m, "driver", field), pool=pool_name(m, "pool", field),
        device=label(m, "device", field), admin_access=flag(m, "adminAccess", field),
        tolerations=listed(m.get("tolerations"), f"{field}.tolerations", 16, "tolerations", toleration),
        share_id=text(m, "shareID", field, most=64),
        consumed_capacity=quantities(m.get("consumedCapacity"), f"{field}.consumedCapacity", D.MAX_ATTRIBUTES),
        binding_conditions=condition_types(m, "bindingConditions", field),
        binding_failure_conditions=condition_types(m, "bindingFailureConditions", field))


def _alloc_config(raw: Any, field: str) -> D.AllocatedConfig:
    m = mapping(raw, field, required=True)
    source = text(m, "source", field, required=True, most=16)
    if source not in ("FromClass", "FromClaim"):
        bad(f"{field}.source", source, "FromClass or FromClaim")
    return D.AllocatedConfig(source=cast(Literal["FromClass", "FromClaim"], source), requests=request_names(m.get("requests"), f"{field}.requests"),
                             opaque=opaque(m.get("opaque"), f"{field}.opaque"))


def claim_key(obj: Any) -> str:
    """``<namespace>/<name>/<uid>`` of a claim object (``ClaimSpec.key``)."""
    meta = _m(_m(obj).get("metadata"))
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}/{meta.get('uid') or ''}"


def claim_in_use(obj: Any) -> tuple[tuple[str, str, D.InUse], ...]:
    """The devices the claim's allocation holds, as ``(driver, pool, InUse)``: every result but
    admin access (which takes no device from anyone), with its share and consumed capacity when
    the device allows multiple allocations. Results that break the API's rules are left out."""
    raw = _m(_m(_m(_m(obj).get("status")).get("allocation")).get("devices")).get("results")
    key, out = claim_key(obj), []
    for i, r in enumerate(raw if isinstance(raw, list) and len(raw) <= D.MAX_RESULTS else []):
        try:
            res = _result(r, f"status.allocation.devices.results[{i}]")
            if not res.admin_access:
                out.append((res.driver, res.pool, check(D.InUse(device=res.device, claim=key, share_id=res.share_id,
                                                                consumed=res.consumed_capacity), "ResourceClaim")))
        except Bad:
            continue
    return tuple(out)


# --- pods ------------------------------------------------------------------------------------------
def pod_claims(pod: Any) -> list[tuple[str, str | None | Waiting]] | Violation:
    """Each ``spec.resourceClaims`` entry: (its name, the ResourceClaim's name). A template's
    claim is the one ``status.resourceClaimStatuses`` names: ``None`` when the entry says no
    claim is needed, ``Waiting`` while the entry is missing (the resourceclaim controller has
    not created it yet)."""
    try:
        p = _m(pod)
        meta = _m(p.get("metadata"))
        where = "spec.resourceClaims"
        entries = items(_m(p.get("spec")).get("resourceClaims"), where, D.MAX_CLAIMS_PER_POD, "claims")
        statuses = {s.get("name"): s for s in map(_m, items(_m(p.get("status")).get("resourceClaimStatuses"),
                                                             "status.resourceClaimStatuses", D.MAX_CLAIMS_PER_POD,
                                                             "claims"))}
        out: list[tuple[str, str | None | Waiting]] = []
        for i, raw in enumerate(entries):
            field = f"{where}[{i}]"
            m = mapping(raw, field, required=True)
            name = label(m, "name", field)
            claim, template = subdomain(m, "resourceClaimName", field, required=False), subdomain(
                m, "resourceClaimTemplateName", field, required=False)
            if bool(claim) == bool(template):
                bad(field, "both" if claim else "neither", "exactly one of resourceClaimName and resourceClaimTemplateName")
            if claim:
                out.append((name, claim))
            elif name not in statuses:
                out.append((name, Waiting(f'pod "{meta.get("namespace")}/{meta.get("name")}": {NOT_CREATED_YET}')))
            else:
                out.append((name, subdomain(statuses[name], "resourceClaimName", "status.resourceClaimStatuses",
                                            required=False) or None))
        return out
    except Bad as e:
        return e.violation


def claim_for_pod(claim: Any, pod: Any, pod_claim: str) -> str:
    """'' when ``claim`` may serve the pod's claim ``pod_claim``; otherwise why not (upstream's
    words): a claim made from a template must be controller-owned by that very pod."""
    spec = [c for c in map(_m, _list(_m(_m(pod).get("spec")).get("resourceClaims"))) if c.get("name") == pod_claim]
    if not spec or not spec[0].get("resourceClaimTemplateName"):
        return ""
    meta, pmeta = _m(_m(claim).get("metadata")), _m(_m(pod).get("metadata"))
    owners = [o for o in map(_m, _list(meta.get("ownerReferences"))) if o.get("controller") is True]
    if owners and owners[0].get("uid") == pmeta.get("uid") and owners[0].get("kind") == "Pod":
        return ""
    return (f"ResourceClaim {meta.get('namespace')}/{meta.get('name')} was not created for Pod "
            f"{pmeta.get('namespace')}/{pmeta.get('name')} (Pod is not owner)")


def extended_claim_name(pod: Any) -> str:
    """The claim Phalanx (or kube-scheduler) made for the pod's extended resources, '' if none."""
    name = _m(_m(_m(pod).get("status")).get("extendedResourceClaimStatus")).get("resourceClaimName")
    return name if isinstance(name, str) else ""


def extended_resource_classes(classes: Iterable[Any]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name, by the upstream rules: every class backs
    ``deviceclass.resource.kubernetes.io/<class>``; a class's ``spec.extendedResourceName`` too,
    and when two name the same resource the newest (``creationTimestamp``) wins, then the lowest
    name. Classes that do not read are left out."""
    out: dict[str, str] = {}
    explicit: dict[str, tuple[str, str]] = {}
    for obj in classes:
        ref = device_class(obj)
        if isinstance(ref, Violation):
            continue
        out[D.IMPLICIT_EXTENDED_PREFIX + ref.name] = ref.name
        if ref.extended_resource_name:
            created = _m(_m(obj).get("metadata")).get("creationTimestamp")
            rank = (created if isinstance(created, str) else "", ref.name)
            best = explicit.get(ref.extended_resource_name)
            if best is None or (rank[0] > best[0]) or (rank[0] == best[0] and rank[1] < best[1]):
                explicit[ref.extended_resource_name] = rank
    return out | {res: rank[1] for res, rank in explicit.items()}


def extended_requests(pod: Any, by_resource: Mapping[str, str]) -> tuple[ExtendedRequest, ...] | Violation:
    """The requests of the claim for the pod's extended resources that ``by_resource`` maps to a
    DeviceClass (``extended_resource_classes``): one per container (``initContainers`` first,
    then ``containers``) and resource, named ``container-<index>-request-<i>`` where ``i`` is
    the resource's place among the container's sorted requests; a zero request asks nothing.
    Sorted by name. Whether a node serves the resource by a device plugin instead is the
    engine's call, per node."""
    try:
        spec = _m(_m(pod).get("spec"))
        out = []
        for index, (section, c) in enumerate(
                [("initContainers", c) for c in _list(spec.get("initContainers"))]
                + [("containers", c) for c in _list(spec.get("containers"))]):
            c = _m(c)
            res = _m(c.get("resources"))
            asks = {**_m(res.get("limits")), **_m(res.get("requests"))}  # the API server's defaulting
            keys = sorted(k for k in asks if isinstance(k, str))
            for i, key in enumerate(keys):
                if key not in by_resource:
                    continue
                field = f"spec.{section}[{shown(c.get('name'))}].resources.requests[{key}]"
                n = quantity.count(asks[key], field, most=quantity.Bound(D.MAX_RESULTS, "a claim gets at most "
                                                                          f"{D.MAX_RESULTS} devices"))
                if isinstance(n, Violation):
                    return n
                if n:
                    out.append(ExtendedRequest(request=f"container-{index}-request-{i}", container=str(c.get("name")),
                                               index=index, resource=key, device_class=by_resource[key], count=n))
        return tuple(sorted(out, key=lambda r: r.request))
    except Bad as e:
        return e.violation


# --- writers ---------------------------------------------------------------------------------------
def allocation_status(a: D.ClaimAllocation) -> dict[str, Any]:
    """``status.allocation`` as the API writes it (camelCase; ``nodeSelector`` a v1 NodeSelector,
    left out when the devices are usable on every node)."""
    devices: dict[str, Any] = {"results": [_result_json(r) for r in a.devices]}
    if a.config:
        devices["config"] = [_drop({"source": c.source, "requests": list(c.requests),
                                    "opaque": _opaque_json(c.opaque)}) for c in a.config]
    out: dict[str, Any] = {"devices": devices}
    if a.node_selector is not None:
        out["nodeSelector"] = {"nodeSelectorTerms": [term_json(t) for t in a.node_selector]}
    return out


def _result_json(r: D.AllocatedDevice) -> dict[str, Any]:
    return _drop({"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device,
                  "adminAccess": r.admin_access or None, "tolerations": [toleration_json(t) for t in r.tolerations],
                  "shareID": r.share_id, "consumedCapacity": dict(r.consumed_capacity),
                  "bindingConditions": list(r.binding_conditions),
                  "bindingFailureConditions": list(r.binding_failure_conditions)})


def toleration_json(t: D.DeviceToleration) -> dict[str, Any]:
    return _drop({"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect,
                  "tolerationSeconds": t.toleration_seconds})


def _opaque_json(o: D.OpaqueConfig) -> dict[str, Any]:
    return {"driver": o.driver, "parameters": o.parameters}


def term_json(t: NodeSelectorTerm) -> dict[str, Any]:
    def req(r: NodeSelectorRequirement) -> dict[str, Any]:
        return _drop({"key": r.key, "operator": r.operator, "values": list(r.values)})
    return _drop({"matchExpressions": [req(r) for r in t.match_expressions],
                  "matchFields": [req(r) for r in t.match_fields]})


def reserved_for_entry(pod: PodRef) -> dict[str, str]:
    """The ``status.reservedFor`` entry of a pod (``apiGroup`` "" is left out, as upstream)."""
    return {"resource": RESERVED_FOR_RESOURCE, "name": pod.name, "uid": pod.uid}


def extended_claim(pod: PodRef, requests: Sequence[ExtendedRequest]) -> dict[str, Any]:
    """The ResourceClaim for the pod's extended resources backed by DRA, as kube-scheduler makes
    it (``generateName`` ``<pod>-extended-resources-``, controller-owned by the pod, annotated
    ``resource.kubernetes.io/extended-resource-claim: "true"``, one ``exactly`` request each)."""
    return {
        "apiVersion": API_VERSION, "kind": "ResourceClaim",
        "metadata": {"generateName": f"{pod.name}-extended-resources-", "namespace": pod.namespace,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid,
                                          "controller": True, "blockOwnerDeletion": True}],
                     "annotations": {D.EXTENDED_CLAIM_ANNOTATION: "true"}},
        "spec": {"devices": {"requests": [
            {"name": r.request, "exactly": {"deviceClassName": r.device_class, "allocationMode": "ExactCount",
                                            "count": r.count}}
            for r in sorted(requests, key=lambda r: r.request)]}},
    }


def extended_claim_status(claim_name: str, requests: Sequence[ExtendedRequest]) -> dict[str, Any]:
    """``pod.status.extendedResourceClaimStatus``: the claim's name and which request serves
    which container's resource."""
    return {"resourceClaimName": claim_name,
            "requestMappings": [{"containerName": r.container, "resourceName": r.resource, "requestName": r.request}
                                for r in sorted(requests, key=lambda r: (r.index, r.resource))]}


# --- plumbing --------------------------------------------------------------------------------------
def _m(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _drop(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without empty values (the API leaves unset fields out)."""
    return {k: v for k, v in d.items() if not (v is None or v is False or (isinstance(v, str | list | dict) and not v))}
