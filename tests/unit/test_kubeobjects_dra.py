"""phalanx_kubeobjects.dra: the resource.k8s.io/v1 objects read into the wire contract (whole
values compared), every broken rule a Violation naming field and rule, the JSON Phalanx writes
back, and (Hypothesis) no input of any shape makes a reader raise."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx_kubeobjects import dra
from phalanx_kubeobjects.violations import Violation
from phalanx_proto import dra as D
from phalanx_proto.events import PodRef
from phalanx_proto.scheduling import NodeSelectorRequirement, NodeSelectorTerm

GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                  "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
             "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}],
             "extendedResourceName": "nvidia.com/gpu"}}
GPU_REF = D.DeviceClassRef(
    name="gpu.nvidia.com",
    selectors=("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",),
    config=(D.ClassConfig(opaque=D.OpaqueConfig(driver="gpu.nvidia.com", parameters={"kind": "GpuConfig"})),),
    extended_resource_name="nvidia.com/gpu")


def gpu_device(i: int, **extra: Any) -> dict:
    return {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100"},
                                                "driverVersion": {"version": "580.126.20"},
                                                "resource.kubernetes.io/numaNode": {"int": i // 4}},
            "capacity": {"memory": {"value": "80Gi"}}, **extra}


def node_slice(node: str = "node-a", devices: int = 2, **spec: Any) -> dict:
    s = {"driver": "gpu.nvidia.com", "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
         "nodeName": node, "devices": [gpu_device(i) for i in range(devices)], **spec}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {k: v for k, v in s.items() if v is not None}}


def claim(requests: list[dict], **devices: Any) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "train-gpus", "namespace": "ml", "uid": "c-uid"},
            "spec": {"devices": {"requests": requests, **devices}}}


def gpu_request(name: str = "gpu", **exactly: Any) -> dict:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}


def with_(obj: dict, path: str, value: Any) -> dict:
    """A deep copy of ``obj`` with the value at ``path`` (dots, ``[i]`` list indices) set."""
    out = copy.deepcopy(obj)
    parts = path.replace("]", "").replace("[", ".").split(".")
    cur = out
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur.setdefault(p, {})
    last = parts[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return out


# --- DeviceClass -----------------------------------------------------------------------------------
def test_a_device_class_reads_into_its_selectors_config_and_extended_resource_name():
    assert dra.device_class(GPU_CLASS) == GPU_REF


@pytest.mark.parametrize(("path", "value", "field", "rule"), [
    ("metadata.name", "GPU", "metadata.name", "DNS-1123 subdomain"),
    ("spec.selectors", [{"cel": {"expression": "true"}}] * 33, "spec.selectors", "at most 32 selectors"),
    ("spec.selectors[0]", {"other": {}}, "spec.selectors[0].cel", "required"),
    ("spec.selectors[0].cel.expression", "x" * (10 * 1024 + 1), "spec.selectors[0].cel.expression", "at most 10240"),
    ("spec.config[0].opaque.parameters", [1], "spec.config[0].opaque.parameters", "a JSON object"),
    ("spec.config[0].opaque.parameters", {"blob": "x" * 11000}, "spec.config[0].opaque.parameters", "at most 10240 bytes"),
    ("spec.config[0].opaque.driver", "Not A Driver", "spec.config[0].opaque.driver", "DNS-1123 subdomain"),
    ("spec.extendedResourceName", "gpu", "spec.extendedResourceName", "<domain>/<name>"),
    ("spec.extendedResourceName", "kubernetes.io/gpu", "spec.extendedResourceName", "outside kubernetes.io"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_a_broken_device_class_is_a_violation_naming_the_field_and_rule(path, value, field, rule):
    got = dra.device_class(with_(GPU_CLASS, path, value))
    assert isinstance(got, Violation) and got.field == field and rule in got.rule, got


# --- ResourceSlice ---------------------------------------------------------------------------------
def test_a_node_local_slice_reads_with_its_devices_attributes_and_capacity():
    driver, pool, got = dra.resource_slice(node_slice(devices=1))
    assert (driver, pool) == ("gpu.nvidia.com", "node-a")
    assert got == D.Slice(name="node-a-gpu", generation=3, slice_count=1, nodes=D.NodeSelection(node_name="node-a"),
                          devices=(D.Device(name="gpu-0", attributes={
                              "type": D.AttrValue(string="gpu"), "productName": D.AttrValue(string="NVIDIA H100"),
                              "driverVersion": D.AttrValue(version="580.126.20"),
                              "resource.kubernetes.io/numaNode": D.AttrValue(int_=0)},
                              capacity={"memory": D.Capacity(value="80Gi")}),))


def test_a_partitionable_slice_keeps_counters_taints_and_per_device_nodes():
    dev = gpu_device(0, consumesCounters=[{"counterSet": "gpu-0-counter-set",
                                           "counters": {"memory": {"value": "80Gi"}, "memory-slice-0": {"value": "1"}}}],
                     taints=[{"key": "example.com/broken", "value": "ecc", "effect": "NoSchedule"}],
                     allowMultipleAllocations=True, bindsToNode=True, bindingConditions=["example.com/ready"],
                     allNodes=True)
    dev["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    obj = node_slice(nodeName=None, perDeviceNodeSelection=True)
    obj["spec"]["devices"] = [dev]
    obj["spec"]["sharedCounters"] = [{"name": "gpu-0-counter-set", "counters": {"memory": {"value": "80Gi"},
                                                                                 "memory-slice-0": {"value": "1"}}}]
    _, _, got = dra.resource_slice(obj)
    assert got.per_device_nodes and got.nodes == D.NodeSelection()
    assert got.shared_counters == (D.CounterSet(name="gpu-0-counter-set",
                                                counters={"memory": "80Gi", "memory-slice-0": "1"}),)
    d = got.devices[0]
    assert (d.nodes, d.taints, d.allow_multiple_allocations, d.binds_to_node, d.binding_conditions) == (
        D.NodeSelection(all_nodes=True), (D.DeviceTaint(key="example.com/broken", value="ecc", effect="NoSchedule"),),
        True, True, ("example.com/ready",))
    assert d.consumes_counters == (D.CounterUse(counter_set="gpu-0-counter-set",
                                                counters={"memory": "80Gi", "memory-slice-0": "1"}),)
    assert d.capacity["memory"].request_policy == D.CapacityPolicy(
        default="1Gi", valid_range=D.CapacityRange(min="1Gi", step="1Gi"))


def test_a_slice_for_nodes_by_label_reads_its_one_node_selector_term():
    sel = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]}]}
    _, _, got = dra.resource_slice(node_slice(nodeName=None, nodeSelector=sel))
    assert got.nodes == D.NodeSelection(node_selector=NodeSelectorTerm(match_expressions=(
        NodeSelectorRequirement(key="pool", operator="In", values=("a", "b")),)))


TWO_TERMS = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}] * 2}


@pytest.mark.parametrize(("path", "value", "field", "rule"), [
    ("spec.allNodes", True, "spec", "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection"),
    ("spec.nodeName", None, "spec", "exactly one of"),
    ("spec.driver", "-bad-", "spec.driver", "DNS-1123 subdomain"),
    ("spec.driver", "d" * 64, "spec.driver", "at most 63 characters"),
    ("spec.pool.name", "", "spec.pool.name", "required"),
    ("spec.pool.resourceSliceCount", 0, "spec.pool.resourceSliceCount", "from 1 to"),
    ("spec.pool.generation", "3", "spec.pool.generation", "must be an integer"),
    ("spec.devices", [gpu_device(0)] * 129, "spec.devices", "at most 128 devices"),
    ("spec.devices[1].name", "gpu-0", "spec.devices[1].name", "unique within a slice"),
    ("spec.devices[0].name", "GPU_0", "spec.devices[0].name", "DNS-1123 label"),
    ("spec.devices[0].attributes.type", {"string": "gpu", "int": 1}, "spec.devices[0].attributes[type]",
     "exactly one of int, bool, string, version"),
    ("spec.devices[0].attributes.driverVersion", {"version": "v1.0.0"},
     "spec.devices[0].attributes[driverVersion].version", "semantic version"),
    ("spec.devices[0].attributes.type", {"string": "x" * 65}, "spec.devices[0].attributes[type].string",
     "at most 64 characters"),
    ("spec.devices[0].attributes", {"a-b": {"int": 1}}, "spec.devices[0].attributes[a-b]", "C identifier"),
    ("spec.devices[0].attributes", {f"a{i}": {"int": i} for i in range(32)}, "spec.devices[0]",
     "at most 32 attributes and capacities together"),
    ("spec.devices[0].capacity.memory", {"value": "-1Gi"}, "spec.devices[0].capacity[memory]", "not be negative"),
    ("spec.devices[0].capacity.memory", {"value": "lots"}, "spec.devices[0].capacity[memory].value", "quantity"),
    ("spec.devices[0].taints", [{"key": "k", "effect": "PreferNoSchedule"}], "spec.devices[0].taints[0].effect",
     "NoSchedule, NoExecute or None"),
    ("spec.devices[0].nodeName", "node-b", "spec.devices[0]", "only in a slice with perDeviceNodeSelection"),
    ("spec.devices[0].consumesCounters", [{"counterSet": f"s{i}", "counters": {}} for i in range(3)],
     "spec.devices[0].consumesCounters", "at most 2 counter sets"),
    ("spec.sharedCounters", [{"name": "s", "counters": {}}] * 2, "spec.sharedCounters", "unique within a slice"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_a_broken_slice_is_a_violation_naming_the_field_and_rule(path, value, field, rule):
    got = dra.resource_slice(with_(node_slice(), path, value))
    assert isinstance(got, Violation) and got.field.startswith(field) and rule in got.rule, got


def test_a_slice_node_selector_has_exactly_one_term():
    got = dra.resource_slice(node_slice(nodeName=None, nodeSelector=TWO_TERMS))
    assert got == Violation("spec.nodeSelector.nodeSelectorTerms", "2 terms", "exactly one node selector term")


# --- ResourceClaim ---------------------------------------------------------------------------------
def test_a_claim_reads_with_each_request_and_subrequest_class_resolved_and_a_missing_class_marked():
    obj = claim([gpu_request(count=2, selectors=[{"cel": {"expression": "true"}}],
                             tolerations=[{"key": "example.com/broken", "operator": "Exists"}]),
                 {"name": "small", "firstAvailable": [
                     {"name": "mig", "deviceClassName": "mig.nvidia.com", "count": 1},
                     {"name": "whole", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}]}],
                constraints=[{"requests": ["gpu", "small/whole"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
                config=[{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": 1}}}])
    got = dra.claim_spec(obj, {"gpu.nvidia.com": GPU_REF})
    assert got == D.ClaimSpec(
        namespace="ml", name="train-gpus", uid="c-uid",
        requests=(D.DeviceRequest(name="gpu", exactly=D.ExactRequest(
                      device_class=GPU_REF, selectors=("true",), count=2,
                      tolerations=(D.DeviceToleration(key="example.com/broken", operator="Exists"),))),
                  D.DeviceRequest(name="small", first_available=(
                      D.ExactRequest(name="mig", device_class=D.DeviceClassRef(name="mig.nvidia.com", missing=True)),
                      D.ExactRequest(name="whole", device_class=GPU_REF, allocation_mode="All")))),
        constraints=(D.DeviceConstraint(requests=("gpu", "small/whole"),
                                        match_attribute="resource.kubernetes.io/pcieRoot"),),
        config=(D.ClaimConfig(requests=("gpu",), opaque=D.OpaqueConfig(driver="gpu.nvidia.com", parameters={"a": 1})),))
    assert got.key == "ml/train-gpus/c-uid"


@pytest.mark.parametrize(("requests", "devices", "field", "rule"), [
    ([gpu_request("a"), gpu_request("b", count=33)], {}, "spec.devices.requests[1].exactly.count", "from 1 to 32"),
    ([gpu_request(count=0)], {}, "spec.devices.requests[0].exactly.count", "from 1 to 32"),
    ([gpu_request(allocationMode="All", count=2)], {}, "spec.devices.requests[0].exactly.count", "takes no count"),
    ([gpu_request(allocationMode="Some")], {}, "spec.devices.requests[0].exactly.allocationMode", "ExactCount or All"),
    ([{"name": "gpu", "exactly": {"deviceClassName": "c"}, "firstAvailable": []}], {}, "spec.devices.requests[0]",
     "exactly one of exactly and firstAvailable"),
    ([{"name": "gpu", "firstAvailable": [{"name": f"s{i}", "deviceClassName": "c"} for i in range(9)]}], {},
     "spec.devices.requests[0].firstAvailable", "at most 8 subrequests"),
    ([{"name": "gpu", "firstAvailable": [{"name": "s", "deviceClassName": "c", "adminAccess": True}]}], {},
     "spec.devices.requests[0].firstAvailable[0].adminAccess", "no adminAccess"),
    ([gpu_request(), gpu_request()], {}, "spec.devices.requests", "unique"),
    ([gpu_request("GPU")], {}, "spec.devices.requests[0].name", "DNS-1123 label"),
    ([gpu_request()] * 33, {}, "spec.devices.requests", "at most 32 requests"),
    ([gpu_request(selectors=[{"cel": {"expression": ""}}])], {}, "spec.devices.requests[0].exactly.selectors[0].cel.expression",
     "required"),
    ([gpu_request()], {"constraints": [{"requests": ["cpu"], "matchAttribute": "a.b/c"}]},
     "spec.devices.constraints[0].requests[0]", "must name a request"),
    ([gpu_request()], {"constraints": [{"matchAttribute": "productName"}]},
     "spec.devices.constraints[0].matchAttribute", "fully qualified"),
    ([gpu_request()], {"constraints": [{"matchAttribute": "a.b/c", "distinctAttribute": "a.b/d"}]},
     "spec.devices.constraints[0]", "exactly one of matchAttribute and distinctAttribute"),
    ([gpu_request(tolerations=[{"value": "x"}])], {}, "spec.devices.requests[0].exactly.tolerations[0].operator",
     "without a key must use operator Exists"),
    ([gpu_request(capacity={"requests": {"memory": "1Zi"}})], {},
     "spec.devices.requests[0].exactly.capacity.requests[memory]", "quantity"),
], ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_a_broken_claim_is_a_violation_naming_the_field_and_rule(requests, devices, field, rule):
    got = dra.claim_spec(claim(requests, **devices), {})
    assert isinstance(got, Violation) and got.field == field and rule in got.rule, got


ALLOCATION = D.ClaimAllocation(
    devices=(D.AllocatedDevice(request="gpu", driver="gpu.nvidia.com", pool="node-a", device="gpu-0"),
             D.AllocatedDevice(request="gpu", driver="gpu.nvidia.com", pool="node-a", device="gpu-1",
                               tolerations=(D.DeviceToleration(key="k", operator="Exists", toleration_seconds=0),))),
    config=(D.AllocatedConfig(source="FromClass", requests=("gpu",),
                              opaque=D.OpaqueConfig(driver="gpu.nvidia.com", parameters={"kind": "GpuConfig"})),),
    node_selector=(NodeSelectorTerm(match_fields=(NodeSelectorRequirement(key="metadata.name", operator="In",
                                                                          values=("node-a",)),)),))


def test_the_allocation_is_written_as_the_api_holds_it_and_reads_back_the_same():
    status = dra.allocation_status(ALLOCATION)
    assert status == {
        "devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1",
             "tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 0}]}],
            "config": [{"source": "FromClass", "requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}]},
        "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}
    obj = claim([gpu_request(count=2)])
    obj["status"] = {"allocation": status}
    assert dra.allocation_of(obj) == ALLOCATION
    assert dra.claim_spec(obj, {}).allocation == ALLOCATION
    assert dra.allocation_of(claim([gpu_request()])) is None
    everywhere = msgspec.structs.replace(ALLOCATION, node_selector=None, config=())
    assert "nodeSelector" not in dra.allocation_status(everywhere)


def test_the_devices_a_claim_holds_leave_out_admin_access_and_keep_a_shares_consumed_capacity():
    obj = claim([gpu_request()])
    obj["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1", "adminAccess": True},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-b", "device": "gpu-2", "shareID": "s-1",
         "consumedCapacity": {"memory": "10Gi"}},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-b", "device": "NOT A NAME"}]}}}
    key = "ml/train-gpus/c-uid"
    assert dra.claim_in_use(obj) == (
        ("gpu.nvidia.com", "node-a", D.InUse(device="gpu-0", claim=key)),
        ("gpu.nvidia.com", "node-b", D.InUse(device="gpu-2", claim=key, share_id="s-1", consumed={"memory": "10Gi"})))
    assert dra.claim_in_use(claim([gpu_request()])) == ()


# --- pods ------------------------------------------------------------------------------------------
def pod(claims: list[dict], statuses: list[dict] | None = None, **spec: Any) -> dict:
    obj = {"metadata": {"name": "trainer", "namespace": "ml", "uid": "p-uid"},
           "spec": {"resourceClaims": claims, "containers": [{"name": "c"}], **spec}}
    if statuses is not None:
        obj["status"] = {"resourceClaimStatuses": statuses}
    return obj


def test_a_pods_claims_resolve_by_name_by_template_status_as_not_needed_or_waiting():
    p = pod([{"name": "shared", "resourceClaimName": "team-gpus"},
             {"name": "own", "resourceClaimTemplateName": "gpu-template"},
             {"name": "skipped", "resourceClaimTemplateName": "gpu-template"},
             {"name": "later", "resourceClaimTemplateName": "gpu-template"}],
            [{"name": "own", "resourceClaimName": "trainer-own-x7k2p"}, {"name": "skipped"}])
    assert dra.pod_claims(p) == [("shared", "team-gpus"), ("own", "trainer-own-x7k2p"), ("skipped", None),
                                 ("later", dra.Waiting('pod "ml/trainer": ResourceClaim not created yet'))]
    assert dra.pod_claims({"metadata": {}, "spec": {}}) == []


@pytest.mark.parametrize(("entry", "field", "rule"), [
    ({"name": "x", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}, "spec.resourceClaims[0]",
     "exactly one of"),
    ({"name": "x"}, "spec.resourceClaims[0]", "exactly one of"),
    ({"resourceClaimName": "a"}, "spec.resourceClaims[0].name", "required"),
])
def test_a_broken_pod_claim_entry_is_a_violation(entry, field, rule):
    got = dra.pod_claims(pod([entry]))
    assert isinstance(got, Violation) and (got.field, rule in got.rule) == (field, True), got


def test_a_template_claim_must_be_controller_owned_by_the_pod_and_a_named_claim_need_not_be():
    p = pod([{"name": "own", "resourceClaimTemplateName": "t"}, {"name": "shared", "resourceClaimName": "team"}])
    mine = {"metadata": {"name": "trainer-own-x", "namespace": "ml", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "p-uid", "controller": True}]}}
    theirs = with_(mine, "metadata.ownerReferences", [{"kind": "Pod", "name": "trainer", "uid": "old", "controller": True}])
    assert dra.claim_for_pod(mine, p, "own") == ""
    assert dra.claim_for_pod(theirs, p, "own") == (
        "ResourceClaim ml/trainer-own-x was not created for Pod ml/trainer (Pod is not owner)")
    assert dra.claim_for_pod(theirs, p, "shared") == ""


def test_the_extended_resource_claim_has_one_request_per_container_and_resource_and_its_mappings():
    newer = with_(with_(GPU_CLASS, "metadata.name", "h100.nvidia.com"), "metadata.creationTimestamp",
                  "2026-02-01T00:00:00Z")
    by_resource = dra.extended_resource_classes([GPU_CLASS, newer, {"metadata": {"name": "BAD"}}])
    assert by_resource == {"nvidia.com/gpu": "h100.nvidia.com",
                           "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "gpu.nvidia.com",
                           "deviceclass.resource.kubernetes.io/h100.nvidia.com": "h100.nvidia.com"}
    p = pod([], initContainers=[{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            containers=[{"name": "main", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "2",
                                                                   "example.com/other": "1"}}},
                        {"name": "idle", "resources": {"limits": {"nvidia.com/gpu": "0"}}}])
    requests = dra.extended_requests(p, by_resource)
    assert requests == (
        dra.ExtendedRequest(request="container-0-request-0", container="warm", index=0, resource="nvidia.com/gpu",
                            device_class="h100.nvidia.com", count=1),
        dra.ExtendedRequest(request="container-1-request-2", container="main", index=1, resource="nvidia.com/gpu",
                            device_class="h100.nvidia.com", count=2))
    ref = PodRef(namespace="ml", name="trainer", uid="p-uid")
    assert dra.extended_claim(ref, requests) == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "trainer-extended-resources-", "namespace": "ml",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "p-uid",
                                          "controller": True, "blockOwnerDeletion": True}],
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": [
            {"name": "container-0-request-0", "exactly": {"deviceClassName": "h100.nvidia.com",
                                                          "allocationMode": "ExactCount", "count": 1}},
            {"name": "container-1-request-2", "exactly": {"deviceClassName": "h100.nvidia.com",
                                                          "allocationMode": "ExactCount", "count": 2}}]}}}
    assert dra.extended_claim_status("trainer-extended-resources-abcde", requests) == {
        "resourceClaimName": "trainer-extended-resources-abcde",
        "requestMappings": [
            {"containerName": "warm", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"},
            {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-1-request-2"}]}
    assert dra.reserved_for_entry(ref) == {"resource": "pods", "name": "trainer", "uid": "p-uid"}
    assert dra.extended_claim_name({"status": {"extendedResourceClaimStatus": {"resourceClaimName": "x"}}}) == "x"
    half = copy.deepcopy(p)
    half["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "0.5"
    got = dra.extended_requests(half, by_resource)
    assert isinstance(got, Violation) and "must be an integer" in got.rule


# --- never raises ----------------------------------------------------------------------------------
KEYS = ["metadata", "name", "namespace", "uid", "spec", "status", "driver", "pool", "generation",
        "resourceSliceCount", "nodeName", "nodeSelector", "nodeSelectorTerms", "matchFields", "allNodes",
        "perDeviceNodeSelection", "devices", "attributes", "capacity", "value", "int", "bool", "string", "version",
        "consumesCounters", "counterSet", "counters", "sharedCounters", "taints", "key", "effect", "selectors", "cel",
        "expression", "config", "opaque", "parameters", "requests", "exactly", "firstAvailable", "deviceClassName",
        "allocationMode", "count", "adminAccess", "tolerations", "operator", "constraints", "matchAttribute",
        "allocation", "results", "request", "device", "shareID", "consumedCapacity", "resourceClaims",
        "resourceClaimName", "resourceClaimTemplateName", "resourceClaimStatuses", "containers", "resources",
        "limits", "nvidia.com/gpu", "requestPolicy", "validRange", "min", "source", "extendedResourceName"]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                   st.sampled_from(["", "gpu", "gpu-0", "node-a", "1", "80Gi", "-1", "1.2.3", "v1", "All",
                                    "ExactCount", "In", "metadata.name", "NoSchedule", "FromClass", "a/b", "x" * 300,
                                    "gpu.nvidia.com", "\u202e", "٤"]), st.text(max_size=8))
TREES = st.recursive(LEAVES, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(KEYS), kids, max_size=5)), max_leaves=40)


def _reads(value: object, t: type) -> None:
    assert isinstance(value, Violation) or msgspec.json.decode(msgspec.json.encode(value), type=t) == value


@settings(max_examples=600, deadline=None)
@given(TREES, st.sampled_from(["device_class", "resource_slice", "claim_spec", "pod_claims"]))
def test_no_json_makes_a_reader_raise_and_every_value_decodes_on_the_wire(tree, which):
    seeded = {"device_class": GPU_CLASS, "resource_slice": node_slice(), "claim_spec": claim([gpu_request()]),
              "pod_claims": pod([{"name": "a", "resourceClaimName": "b"}])}[which]
    for obj in (tree, {**seeded, "spec": tree}, {**seeded, "status": tree}, {**seeded, "metadata": tree}):
        if which == "device_class":
            _reads(dra.device_class(obj), D.DeviceClassRef)
        elif which == "resource_slice":
            got = dra.resource_slice(obj)
            _reads(got if isinstance(got, Violation) else got[2], D.Slice)
        elif which == "claim_spec":
            _reads(dra.claim_spec(obj, {"gpu.nvidia.com": GPU_REF}), D.ClaimSpec)
            assert isinstance(dra.claim_in_use(obj), tuple)
            assert isinstance(dra.allocation_of(obj), D.ClaimAllocation | Violation | None)
        else:
            assert isinstance(dra.pod_claims(obj), list | Violation)
            assert isinstance(dra.extended_requests(obj, {"nvidia.com/gpu": "gpu.nvidia.com"}), tuple | Violation)
            assert isinstance(dra.claim_for_pod(obj, obj, "a"), str)


def test_a_claim_made_from_a_compute_domains_template_names_the_domain():
    obj = claim([gpu_request()])
    obj["metadata"]["labels"] = {D.COMPUTE_DOMAIN_LABEL: "cd-uid-1", "other": "x"}
    assert dra.claim_spec(obj, {"gpu.nvidia.com": GPU_REF}).compute_domain == "cd-uid-1"
    obj["metadata"]["labels"] = {}
    assert dra.claim_spec(obj, {"gpu.nvidia.com": GPU_REF}).compute_domain == ""
