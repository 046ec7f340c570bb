"""DRA end to end (issue 38): Phalanx's services on a real kube-apiserver with kwok nodes whose
ResourceSlices are shaped like NVIDIA's DRA driver, the real resourceclaim controller
(kube-controller-manager) and the real JobSet controller.

One cluster and one Phalanx stack for the module (``dra``): four DRA-only nodes shaped like a
DGX-1V (8 × V100, NVLink quads {0,1,2,3} and {4,5,6,7}; no ``nvidia.com/gpu`` in allocatable) in
two NVLink cliques (``nvidia.com/gpu.clique``: ``a0 a1`` and ``b0 b1``), each also publishing two
ComputeDomain channels, and one node with the device plugin's ``nvidia.com/gpu: 8`` *and* the
same GPU slices (``dp``, a clique of its own). Each test makes its objects in its own namespace,
pins its pods where it needs them, and deletes its pods at the end (the resourceclaim controller
then deallocates their claims, so the next test starts with every device free).

* a JobSet whose 4 pods each get a 4-GPU claim from a ResourceClaimTemplate: all bound, each
  claim an NVLink quad of its pod's node, every claim allocated and reserved before any Binding
  (by the API server's own order of writes: resourceVersions from watches of one etcd);
* deleting a pod frees its devices: the resourceclaim controller deallocates its claim and a pod
  waiting for them is placed;
* a rollback clears what Phalanx wrote: a gang of two whose second claim the API server refuses
  to write (a ValidatingAdmissionPolicy on ``resourceclaims/status``) binds nobody, and after the
  rollback no claim holds an allocation and no pod is in ``reservedFor``;
* the KEP-5004 bridge: ``nvidia.com/gpu: 2`` on a DRA-only node gets the claim Phalanx makes
  (named in ``status.extendedResourceClaimStatus``); the same pod on the device-plugin node takes
  the device-plugin path;
* ComputeDomains (a minimal CRD of ours; the test plays NVIDIA's controller and makes each
  domain's channel template, labelled ``resource.nvidia.com/computeDomain: <uid>``): a gang lands
  in one clique, a second domain's gang in the other clique although the first has room, a third
  waits and says why.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from draagreement import (
    GANG_LABEL,
    GANG_SIZE,
    PHALANX_LABELS,
    QUADS,
    RESOURCE,
    TOPOLOGY,
    _node,
    claim_spec,
    create_claim,
    create_template,
    exactly,
    start_stack,
    wait_for,
)
from kubecontrollers import delete_workloads
from kubeharness import ControlPlane, KubeApi, apply_crds, fake_gpu_node, gpu_pod, unique

from phalanx_localstack import draslices as ds
from phalanx_localstack.stack import Stack
from phalanx_proto.dra import COMPUTE_DOMAIN_LABEL, EXTENDED_CLAIM_ANNOTATION
from phalanx_proto.topology import NodeTopology

pytestmark = pytest.mark.e2e

CLIQUE = "nvidia.com/gpu.clique"
CD_DRIVER = "compute-domain.nvidia.com"
CD_CLASS = "compute-domain-default-channel.nvidia.com"
CD_GROUP = "e2e.phalanx.io"
COORDINATOR = ["--backoff-base-s", "0.5", "--backoff-max-s", "2", "--resync-s", "0.5", "--unschedulable-retry-s", "5"]
JOBSET = "jobset.sigs.k8s.io/jobset-name"
BOUND_S = 40.0


# --- the cluster -----------------------------------------------------------------------------------
class Dra:
    """The module's nodes, their topologies and the stack."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane, self.api = plane, plane.api
        self.cliques = {"a": [unique("dra-a0"), unique("dra-a1")], "b": [unique("dra-b0"), unique("dra-b1")]}
        self.dp = unique("dra-dp")
        self.topologies: dict[str, NodeTopology] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.classes_made: list[str] = []
        self.stack: Stack | None = None

    @property
    def dra_only(self) -> list[str]:
        return [n for names in self.cliques.values() for n in names]

    def slices(self, node: str) -> list[dict]:
        topo = self.topologies[node]
        return ds.gpu_slices(node, topo) + ([] if node == self.dp else channel_slices(node))

    def setup(self) -> None:
        api = self.api
        common = {"lj_runtimekit_enable": "true", "phalanx.io/leaf-switch": "leaf-dra-e2e",
                  "phalanx.io/network-pod": "np-dra-e2e"}
        assert "phalanx.io/hypernode" in PHALANX_LABELS  # the agreement's nodes name theirs; these read the clique
        for clique, names in (*self.cliques.items(), ("p", [self.dp])):
            for n in names:
                self.labels[n] = {**common, CLIQUE: f"clique-{clique}-{n[-6:]}" if clique == "p" else f"clique-{clique}"}
                self.topologies[n] = ds.with_identity(TOPOLOGY, n)
                api.create_node(fake_gpu_node(n, gpus=8, labels=self.labels[n]) if n == self.dp
                                else _node(n, self.labels[n]))
        for c in [*ds.device_classes(), channel_class()]:
            if api.request("GET", f"{RESOURCE}/deviceclasses/{c['metadata']['name']}", ok=(404,))[0] == 404:
                self.classes_made.append(c["metadata"]["name"])
            api.apply(c)
        for n in self.topologies:
            for s in self.slices(n):
                api.post(f"{RESOURCE}/resourceslices", s)
        apply_crds(self.plane, [compute_domain_crd()])

    def teardown(self) -> None:
        api = self.api
        for n in self.topologies:
            for s in self.slices(n):
                api.delete(f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
            api.delete(f"/api/v1/nodes/{n}")
        for name in self.classes_made:
            api.delete(f"{RESOURCE}/deviceclasses/{name}")

    def dump(self) -> str:
        if self.stack is None:
            return ""
        return "\n".join(self.stack.tail(n, 25) for n in ("gang-coordinator", "placement", "binder"))


def channel_slices(node: str, channels: int = 2) -> list[dict]:
    """What NVIDIA's ComputeDomain kubelet plugin publishes per node, in our own words: a pool of
    driver ``compute-domain.nvidia.com`` with IMEX channels ``channel-<id>``."""
    devices = [{"name": f"channel-{i}", "attributes": {"type": {"string": "channel"}, "id": {"int": i}}}
               for i in range(channels)]
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{CD_DRIVER}-0"},
             "spec": {"driver": CD_DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                      "nodeName": node, "devices": devices}}]


def channel_class() -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CD_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{CD_DRIVER}' && "
                                                          f"device.attributes['{CD_DRIVER}'].type == 'channel'"}}]}}


def compute_domain_crd() -> dict:
    """A minimal ComputeDomain of our own: how many nodes, and the name of the channel template
    its controller makes (here the test plays the controller)."""
    schema = {"type": "object", "properties": {"spec": {"type": "object", "required": ["numNodes", "channelTemplate"],
                                                        "properties": {"numNodes": {"type": "integer", "minimum": 1},
                                                                       "channelTemplate": {"type": "string"}}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"computedomains.{CD_GROUP}"},
            "spec": {"group": CD_GROUP, "scope": "Namespaced",
                     "names": {"plural": "computedomains", "singular": "computedomain", "kind": "ComputeDomain"},
                     "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


@pytest.fixture(scope="module")
def dra(jobset_controller: ControlPlane, tmp_path_factory) -> Iterator[Dra]:
    d = Dra(jobset_controller)
    d.setup()
    try:
        nodes = {n: (d.topologies[n], d.labels[n]) for n in d.topologies}
        d.stack = start_stack(d.plane, nodes, tmp_path_factory.mktemp("dra-e2e"), coordinator_args=COORDINATOR,
                              fleet=True, dra_only=d.dra_only)
        yield d
    finally:
        if d.stack is not None:
            d.stack.stop()
        d.teardown()


@pytest.fixture
def ns(dra: Dra, kube_api: KubeApi, kube_ns: str) -> Iterator[str]:
    """The test's namespace; its workloads and pods are deleted after it and their claims
    waited out (deallocated by the resourceclaim controller, then gone or free)."""
    yield kube_ns
    delete_workloads(kube_api, kube_ns)
    wait_for(lambda: not [c for c in claims(kube_api, kube_ns) if (c.get("status") or {}).get("allocation")], 60,
             f"the claims of {kube_ns} deallocated", interval_s=0.3)


# --- helpers ---------------------------------------------------------------------------------------
class Watch:
    """Every event of a watch on a list ``path``, recorded in order in its own thread:
    (type, resourceVersion, object). One etcd serves every resource here, so resourceVersions of
    different objects order their writes."""

    def __init__(self, api: KubeApi, path: str) -> None:
        self.events: list[tuple[str, int, dict]] = []
        rv = api.get(path)["metadata"]["resourceVersion"]
        self.conn = http.client.HTTPSConnection(api.host, api.port, context=api.ctx, timeout=300)
        self.conn.request("GET", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=300",
                          headers={"Authorization": f"Bearer {api.token}"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()[:300]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError, http.client.HTTPException):
            for line in iter(self.resp.readline, b""):
                ev = json.loads(line)
                obj = ev.get("object") or {}
                self.events.append((ev.get("type", ""), int((obj.get("metadata") or {}).get("resourceVersion") or 0), obj))

    def close(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()

    def first(self, name: str, pred) -> int | None:
        """The resourceVersion of the first event of ``name`` for which ``pred(obj)`` holds."""
        return next((rv for _, rv, o in list(self.events) if o["metadata"]["name"] == name and pred(o)), None)

    def seen(self, name: str, pred, timeout_s: float = 15.0) -> int:
        """``first``, for an event the API server has already written: the watch stream may not
        have delivered it yet when a GET shows it, so wait (bounded) until it has."""
        return wait_for(lambda: self.first(name, pred), timeout_s, f"the watch delivers {name}'s event", interval_s=0.05)


@contextlib.contextmanager
def watching(api: KubeApi, *paths: str) -> Iterator[list[Watch]]:
    watches = [Watch(api, p) for p in paths]
    try:
        yield watches
    finally:
        for w in watches:
            w.close()


def claims(api: KubeApi, ns: str) -> list[dict]:
    return api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]


def claim(api: KubeApi, ns: str, name: str) -> dict:
    return api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")


def results(c: dict) -> list[dict]:
    return (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []


def reserved_for(c: dict) -> list[str]:
    return [r["name"] for r in (c.get("status") or {}).get("reservedFor") or []]


def gpus(c: dict, node: str) -> set[int]:
    """The claim's GPUs, each checked to be a GPU of ``node``'s pool."""
    out = set()
    for r in results(c):
        if r["driver"] == ds.GPU_DRIVER:
            assert r["pool"] == node, (r, node)
            out.add(int(r["device"].removeprefix("gpu-")))
    return out


def pod_claim_names(pod: dict) -> dict[str, str]:
    """Pod claim entry → the ResourceClaim's name (the resourceclaim controller's status for templates)."""
    made = {s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses") or []}
    return {rc["name"]: rc.get("resourceClaimName") or made.get(rc["name"]) or "" for rc in pod["spec"].get("resourceClaims") or []}


def pods(api: KubeApi, ns: str, selector: str = "") -> list[dict]:
    query = {"labelSelector": selector} if selector else None
    return [p for p in api.get(f"/api/v1/namespaces/{ns}/pods", query=query)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def bound(dra: Dra, ns: str, names: list[str] | None = None, *, selector: str = "", count: int = 0,
          timeout_s: float = BOUND_S) -> dict[str, dict]:
    """Wait until the named pods (or ``count`` pods matching ``selector``) are all bound."""
    def check() -> dict[str, dict] | None:
        got = {p["metadata"]["name"]: p for p in pods(dra.api, ns, selector)}
        want = names if names is not None else list(got)
        if len(want) < (count or len(want)) or not all(n in got and got[n]["spec"].get("nodeName") for n in want):
            return None
        return {n: got[n] for n in want}
    try:
        return wait_for(check, timeout_s, f"pods {names or selector} bound", interval_s=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dra.dump()}") from None


def scheduled_condition(api: KubeApi, ns: str, name: str) -> dict:
    pod = api.get_pod(ns, name) or {}
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})


def unschedulable(dra: Dra, ns: str, name: str, timeout_s: float = 30.0) -> str:
    """Wait until the pod says it is unschedulable; its message."""
    def told() -> str:
        c = scheduled_condition(dra.api, ns, name)
        return c.get("message", "") if c.get("reason") == "Unschedulable" else ""
    try:
        return wait_for(told, timeout_s, f"pod {name} told it is unschedulable", interval_s=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dra.dump()}") from None


def pod(name: str, ns: str, claims_: dict[str, dict[str, str]], *, node: str = "", labels: dict[str, str] | None = None,
        **spec: Any) -> dict:
    """A Phalanx pod naming ``claims_`` (pod claim entry → ``{"resourceClaimName": …}`` or
    ``{"resourceClaimTemplateName": …}``), pinned to ``node`` when given."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
                     **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
                     "resourceClaims": [{"name": k, **v} for k, v in claims_.items()],
                     "containers": [{"name": "c", "image": "registry.example/app:1",
                                     "resources": {"claims": [{"name": k} for k in claims_]}}], **spec}}


def quad(g: set[int]) -> bool:
    return frozenset(g) in QUADS


# --- (a) a JobSet gang with per-pod claims from a template -----------------------------------------
def test_a_jobset_gangs_template_claims_are_nvlink_quads_allocated_and_reserved_before_any_binding(dra, ns):
    api = dra.api
    create_template(api, ns, "quad", claim_spec({"gpu": exactly(4)}))
    pod_spec = {"schedulerName": "phalanx", "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "quad"}],
                "containers": [{"name": "c", "image": "registry.example/app:1", "resources": {"claims": [{"name": "gpus"}]}}]}
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train", "namespace": ns},
          "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {
              "parallelism": 4, "completions": 4, "backoffLimit": 0, "template": {
                  "metadata": {"labels": {"aliyun.com/min-member": "4"}}, "spec": pod_spec}}}}]}}
    with watching(api, f"/api/v1/namespaces/{ns}/pods", f"{RESOURCE}/namespaces/{ns}/resourceclaims") as (pw, cw):
        api.post(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", js)
        got = bound(dra, ns, selector=f"{JOBSET}=train", count=4)
        first_binding = min(pw.seen(n, lambda o: o["spec"].get("nodeName")) for n in got)
        written = {n: cw.seen(cname, lambda o, n=n: results(o) and n in reserved_for(o))
                   for n, p in got.items() for cname in pod_claim_names(p).values()}
    assert len(got) == 4
    for name, p in got.items():
        node = p["spec"]["nodeName"]
        (cname,) = pod_claim_names(p).values()
        c = claim(api, ns, cname)
        assert quad(gpus(c, node)), (name, node, results(c))
        assert reserved_for(c) == [name]
        assert c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        assert written[name] < first_binding, (cname, written[name], first_binding)
    used = [(p["spec"]["nodeName"], g) for p in got.values() for g in gpus(claim(api, ns, next(iter(
        pod_claim_names(p).values()))), p["spec"]["nodeName"])]
    assert len(used) == len(set(used)) == 16
    nodes = {p["spec"]["nodeName"] for p in got.values()}
    assert len(nodes) == 2 and len({dra.labels[n][CLIQUE] for n in nodes}) == 1, nodes


# --- (b) deletion frees devices --------------------------------------------------------------------
def test_deleting_a_pod_frees_its_devices_and_a_pod_waiting_for_them_is_placed(dra, ns):
    api, node = dra.api, dra.cliques["a"][0]
    create_claim(api, ns, "whole", claim_spec({"gpu": exactly(8)}))
    create_claim(api, ns, "half", claim_spec({"gpu": exactly(4)}))
    api.create_pod(pod("whole", ns, {"gpus": {"resourceClaimName": "whole"}}, node=node))
    bound(dra, ns, ["whole"])
    api.create_pod(pod("waiter", ns, {"gpus": {"resourceClaimName": "half"}}, node=node))
    why = unschedulable(dra, ns, "waiter")
    assert "cannot allocate all claims" in why, why
    api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/whole", {"gracePeriodSeconds": 0})
    # kube-controller-manager's resourceclaim controller takes the pod out and deallocates
    wait_for(lambda: not (c := claim(api, ns, "whole")).get("status", {}).get("allocation") and not reserved_for(c),
             30, "the resourceclaim controller to deallocate the deleted pod's claim")
    got = bound(dra, ns, ["waiter"])
    c = claim(api, ns, "half")
    assert got["waiter"]["spec"]["nodeName"] == node and quad(gpus(c, node)), results(c)
    assert reserved_for(c) == ["waiter"]


# --- (c) a rollback clears what Phalanx wrote ------------------------------------------------------
UNWRITABLE = "e2e.phalanx.io/unwritable"


@contextlib.contextmanager
def claims_unwritable(api: KubeApi, ns: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy (the API server's own CEL admission) refusing every status
    write of a claim labelled ``UNWRITABLE`` in ``ns``: the claim cannot be allocated by anyone."""
    name = unique("dra-e2e-unwritable")
    base = "/apis/admissionregistration.k8s.io/v1"
    api.post(f"{base}/validatingadmissionpolicies", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                                                         "operations": ["UPDATE"], "resources": ["resourceclaims/status"]}]},
                 "validations": [{"expression": f"!has(object.metadata.labels) || "
                                                f"!('{UNWRITABLE}' in object.metadata.labels)",
                                  "message": "this claim's status is not writable (e2e)"}]}})
    api.post(f"{base}/validatingadmissionpolicybindings", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}})
    try:
        # the policy is in force once a labelled claim's status write is refused
        probe = unique("probe")
        api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": probe, "namespace": ns, "labels": {UNWRITABLE: "true"}},
            "spec": claim_spec({"gpu": exactly(1)})})

        def refused() -> bool:
            obj = claim(api, ns, probe)
            obj["status"] = {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": ds.GPU_DRIVER, "pool": "nowhere", "device": "gpu-0"}]}}}
            status, _ = api.request("PUT", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{probe}/status", obj,
                                    ok=(403, 422))
            if status < 300:  # written before the policy was in force: take it back
                obj = claim(api, ns, probe)
                obj["status"] = {}
                api.request("PUT", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{probe}/status", obj, ok=(403, 422))
            return status in (403, 422)

        wait_for(refused, 20, "the ValidatingAdmissionPolicy in force", interval_s=0.3)
        api.delete(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{probe}")
        yield
    finally:
        api.delete(f"{base}/validatingadmissionpolicybindings/{name}")
        api.delete(f"{base}/validatingadmissionpolicies/{name}")


def test_a_gang_whose_claim_cannot_be_written_binds_nobody_and_its_rollback_clears_every_allocation(dra, ns):
    """Member ``a``'s claim is written first (the gang's members in the order they came), then
    the API server refuses ``b``'s: no member is bound, both are told why, and the rollback's
    ``claims`` compensation takes ``a``'s allocation and reservation back."""
    api, node = dra.api, dra.cliques["a"][1]
    gang = {GANG_LABEL: "stuck", GANG_SIZE: "2"}
    with claims_unwritable(api, ns):
        create_claim(api, ns, "a-writable", claim_spec({"gpu": exactly(4)}))
        api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "b-unwritable", "namespace": ns, "labels": {UNWRITABLE: "true"}},
            "spec": claim_spec({"gpu": exactly(4)})})
        with watching(api, f"{RESOURCE}/namespaces/{ns}/resourceclaims") as (cw,):
            for member, c in (("a-member", "a-writable"), ("b-member", "b-unwritable")):
                api.create_pod(pod(member, ns, {"gpus": {"resourceClaimName": c}}, node=node, labels=gang))

            def told() -> dict[str, str]:
                """Each member → what it was told about the refused claim (an event or its condition)."""
                out = {}
                for m in ("a-member", "b-member"):
                    said = [e.get("message", "") for e in api.events(ns, m)]
                    said.append(scheduled_condition(api, ns, m).get("message", ""))
                    out[m] = next((t for t in said if "b-unwritable" in t), "")
                return out if all(out.values()) else {}

            try:
                why = wait_for(told, 30, "both members told the claim could not be written", interval_s=0.3)
                # ... and the rollback took a's back: no allocation, nobody in reservedFor
                wait_for(lambda: all(not results(c) and not reserved_for(c) for c in claims(api, ns)), 30,
                         "every claim of the gang free again", interval_s=0.2)
            except AssertionError as e:
                raise AssertionError(f"{e}\n{dra.dump()}") from None
            # Phalanx had written a's claim before b's was refused (so there was something to undo)
            assert cw.seen("a-writable", lambda o: results(o) and "a-member" in reserved_for(o)), why
            assert cw.first("b-unwritable", results) is None
        assert "not writable" in why["b-member"], why
        assert not [p["metadata"]["name"] for p in pods(api, ns) if p["spec"].get("nodeName")]


# --- (d) the KEP-5004 bridge -----------------------------------------------------------------------
def test_nvidia_gpu_on_a_dra_only_node_gets_a_claim_phalanx_makes_and_on_a_device_plugin_node_the_plugin(dra, ns):
    api = dra.api
    dra_node = dra.cliques["b"][0]
    allocatable = api.get(f"/api/v1/nodes/{dra_node}")["status"]["allocatable"]
    assert "nvidia.com/gpu" not in allocatable, f"the DRA-only node advertises {allocatable}"
    for name, node in (("on-dra", dra_node), ("on-plugin", dra.dp)):
        p = gpu_pod(name, ns, 2)
        p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        api.create_pod(p)
    got = bound(dra, ns, ["on-dra", "on-plugin"])
    assert got["on-dra"]["spec"]["nodeName"] == dra_node and got["on-plugin"]["spec"]["nodeName"] == dra.dp
    status = got["on-dra"]["status"].get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName", "")
    assert name.startswith("on-dra-extended-resources-"), status
    assert status["requestMappings"] == [{"containerName": "c", "resourceName": "nvidia.com/gpu",
                                          "requestName": "container-0-request-0"}], status
    c = claim(api, ns, name)
    meta = c["metadata"]
    assert meta["annotations"][EXTENDED_CLAIM_ANNOTATION] == "true"
    assert [(o["kind"], o["name"], o["uid"]) for o in meta["ownerReferences"]] == [
        ("Pod", "on-dra", got["on-dra"]["metadata"]["uid"])]
    g = gpus(c, dra_node)
    assert len(g) == 2 and any(g <= q for q in QUADS), results(c)
    assert reserved_for(c) == ["on-dra"]
    assert json.loads(got["on-dra"]["metadata"]["annotations"]["phalanx.io/assignment"])["gpus"] == sorted(g)
    # the device-plugin node: no claim, the plugin's GPUs
    assert "extendedResourceClaimStatus" not in got["on-plugin"]["status"]
    assert [c["metadata"]["name"] for c in claims(api, ns)] == [name]
    assert len(json.loads(got["on-plugin"]["metadata"]["annotations"]["phalanx.io/assignment"])["gpus"]) == 2


# --- (e) ComputeDomains ----------------------------------------------------------------------------
def compute_domain(api: KubeApi, ns: str, name: str, nodes: int) -> str:
    """A ComputeDomain and the channel template its controller would make (labelled with the
    domain's uid, owned by it); the template's name."""
    cd = api.post(f"/apis/{CD_GROUP}/v1alpha1/namespaces/{ns}/computedomains", {
        "apiVersion": f"{CD_GROUP}/v1alpha1", "kind": "ComputeDomain", "metadata": {"name": name, "namespace": ns},
        "spec": {"numNodes": nodes, "channelTemplate": f"{name}-channel"}})
    uid = cd["metadata"]["uid"]
    label = {COMPUTE_DOMAIN_LABEL: uid}
    api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{name}-channel", "namespace": ns, "labels": label,
                     "ownerReferences": [{"apiVersion": f"{CD_GROUP}/v1alpha1", "kind": "ComputeDomain", "name": name,
                                          "uid": uid, "controller": True}]},
        "spec": {"metadata": {"labels": label}, "spec": claim_spec({"channel": exactly(1, CD_CLASS)})}})
    return f"{name}-channel"


def cd_gang(api: KubeApi, ns: str, domain: str, members: int) -> list[str]:
    """``members`` pods of one gang, each with a channel of ``domain`` and an NVLink quad."""
    template = compute_domain(api, ns, domain, members)
    names = [f"{domain}-{i}" for i in range(members)]
    for n in names:
        api.create_pod(pod(n, ns, {"channel": {"resourceClaimTemplateName": template},
                                   "gpus": {"resourceClaimTemplateName": "quad"}},
                           labels={GANG_LABEL: domain, GANG_SIZE: str(members)},
                           affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                               "nodeSelectorTerms": [{"matchExpressions": [
                                   {"key": CLIQUE, "operator": "In", "values": ["clique-a", "clique-b"]}]}]}}}))
    return names


def test_compute_domain_gangs_each_get_a_clique_of_their_own_and_a_third_waits_saying_why(dra, ns):
    api = dra.api
    create_template(api, ns, "quad", claim_spec({"gpu": exactly(4)}))
    # three members of 4 GPUs and a channel: one node and a half of a clique (two channels, two quads a node)
    first = bound(dra, ns, cd_gang(api, ns, "cd-one", 3))
    (clique,) = {dra.labels[p["spec"]["nodeName"]][CLIQUE] for p in first.values()}
    for p in first.values():
        node = p["spec"]["nodeName"]
        made = pod_claim_names(p)
        ch = claim(api, ns, made["channel"])
        assert [r["driver"] for r in results(ch)] == [CD_DRIVER] and results(ch)[0]["pool"] == node, results(ch)
        assert quad(gpus(claim(api, ns, made["gpus"]), node))
    # the first clique has a free quad and channel left, yet it hosts cd-one: cd-two goes to the other
    second = bound(dra, ns, cd_gang(api, ns, "cd-two", 1))
    assert {dra.labels[p["spec"]["nodeName"]][CLIQUE] for p in second.values()} == {"clique-a", "clique-b"} - {clique}
    # both cliques have room for a third, and each hosts a domain: it waits, and says why
    (third,) = cd_gang(api, ns, "cd-three", 1)
    why = unschedulable(dra, ns, third)
    assert "hosting no other ComputeDomain" in why, why
    assert not (api.get_pod(ns, third) or {}).get("spec", {}).get("nodeName")
