"""The DRA agreement table: the same ResourceClaims given to kube-scheduler and to Phalanx on one
real API server, and what each did with them.

Used by ``tests/e2e/test_dra_agreement.py`` (which asserts it) and ``bench/dra_agreement.py``
(which runs it on a fresh control plane and writes ``docs/dra-agreement.md``).

The cluster: twin pools of kwok nodes shaped like a DGX-1V (8 × V100 in the hybrid cube mesh, its
NVLink quads {0,1,2,3} and {4,5,6,7}, one mlx5 NIC on GPU2/GPU3's PCIe switch), two labelled
``pool=upstream`` and two ``pool=phalanx`` per lane (``LANES`` lanes, each with its own namespace,
running cases at once), with no device plugin (no ``nvidia.com/gpu`` in allocatable: DRA-only
nodes; Phalanx's agents run with ``--advertise none``). Every node gets the ResourceSlices NVIDIA's DRA driver and our RDMA
NIC driver would publish (``phalanx_localstack.draslices``), and the Phalanx nodes get the matching
topology files (same GPU UUIDs and PCI bus ids). A case creates the same claim twice, one for a
pod of ``schedulerName: default-scheduler`` pinned to the upstream pool and one for a pod of
``schedulerName: phalanx`` pinned to the Phalanx pool (``nodeSelector``), then waits until each
pod is bound or told it is unschedulable, records which devices each allocation holds
(``status.allocation``) and how well connected its GPUs are (``phalanx_engine.gpuset.score_set``
on the node's topology), and deletes everything before the next case.

Blockers (devices "already taken") are claims of pods pinned to a node by hostname and scheduled by
kube-scheduler, in both pools, a second before the case's pods come (``BLOCKERS_SEEN_S``); taints
are put on the published devices of the lane's nodes (a new pool generation) and taken off after
the case.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubeharness import REPO, ControlPlane, KubeApi, unique

from phalanx_engine.gpuset import GpuSetScore, score_set
from phalanx_localstack import draslices as ds
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_proto.topology import NodeTopology
from phalanx_topology import yamlfmt
from phalanx_topology.links import FABRIC_LINKS, link_rank

RESOURCE = "/apis/resource.k8s.io/v1"
TOPOLOGY = REPO / "examples" / "topology" / "dgx1v-8xV100-1xmlx5.yaml"
SERVICES = ("topology-discovery", "gang-coordinator", "placement", "mig-manager", "binder")
UPSTREAM, PHALANX = "upstream", "phalanx"
SCHEDULER = {UPSTREAM: "default-scheduler", PHALANX: "phalanx"}
POOL_LABEL = "pool"
PHALANX_LABELS = {"lj_runtimekit_enable": "true", "phalanx.io/hypernode": "hn-dra", "phalanx.io/leaf-switch": "leaf-dra",
                  "phalanx.io/network-pod": "np-dra"}
QUADS = (frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7}))
V100 = "Tesla V100-SXM2-16GB"
GPU = "gpu.nvidia.com"
TAINT = {"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}
LANE_LABEL = "phalanx.io/dra-lane"
LANES = 3
"""Cases run in this many lanes at once, each on its own twin pools (two nodes per side) and in
its own namespace: a case waits mostly (a pending pod must stay so for ``SETTLE_S``), so lanes
shorten the table about as many times on two cores."""
BOUND_TIMEOUT_S = 60.0
SETTLE_S = 8.0
"""How long a pod told it is unschedulable must stay unbound to count as left pending."""
BLOCKERS_SEEN_S = 1.0
"""How long after the blockers are bound the case's pods come: their allocations are in the API
before then, and a scheduler's watch has had a second to see them. (Created the moment the
blockers were bound, Phalanx once allocated GPUs a blocker held: its view of claims other
schedulers allocate lagged the API; reported with issue 38.)"""


# --- the cluster -----------------------------------------------------------------------------------
@dataclass
class Lane:
    """One lane's twin pools (``nodes[side]``, two each; labelled ``LANE_LABEL``) and namespace."""

    index: int
    namespace: str
    nodes: dict[str, list[str]]

    def selector(self, side: str) -> dict[str, str]:
        return {POOL_LABEL: side, LANE_LABEL: str(self.index)}


@dataclass
class Cluster:
    """The twin pools on one API server, in ``lanes`` (the first one's namespace and nodes are
    ``namespace`` and ``nodes``: the gangs run there), the nodes' topologies, and the Phalanx
    stack once started."""

    api: KubeApi
    plane: ControlPlane
    lanes: list[Lane]
    topologies: dict[str, NodeTopology]
    generation: dict[str, int] = field(default_factory=dict)
    stack: Stack | None = None
    classes_made: list[str] = field(default_factory=list)
    """The DeviceClasses this cluster created (deleted with it; ones that were there stay)."""

    def topology(self, node: str) -> NodeTopology:
        return self.topologies[node]

    @property
    def namespace(self) -> str:
        return self.lanes[0].namespace

    @property
    def nodes(self) -> dict[str, list[str]]:
        return self.lanes[0].nodes

    def side_nodes(self, side: str) -> list[str]:
        return [n for lane in self.lanes for n in lane.nodes[side]]


def _node(name: str, labels: dict[str, str]) -> dict:
    """A kwok node without a device plugin: its GPUs exist only as DRA devices."""
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                                    **labels}},
            "status": {"capacity": dict(res), "allocatable": dict(res)}}


def _ready(api: KubeApi, node: str) -> bool:
    conds = api.get(f"/api/v1/nodes/{node}").get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def wait_for(fn: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}")


def make_cluster(plane: ControlPlane, prefix: str = "dra", lanes: int = LANES) -> Cluster:
    """Per lane two nodes per pool and a namespace; the DeviceClasses and every node's slices."""
    api = plane.api
    topologies: dict[str, NodeTopology] = {}
    made_lanes = []
    for k in range(lanes):
        nodes = {side: [unique(f"{prefix}-{side[:3]}{k}") for _ in range(2)] for side in (UPSTREAM, PHALANX)}
        for side, names in nodes.items():
            for n in names:
                labels = {POOL_LABEL: side, LANE_LABEL: str(k), **(PHALANX_LABELS if side == PHALANX else {})}
                api.create_node(_node(n, labels))
                topologies[n] = ds.with_identity(TOPOLOGY, n)
        ns = unique(f"dra-agreement{k}")
        api.create_namespace(ns)
        made_lanes.append(Lane(k, ns, nodes))
    made = []
    for c in ds.device_classes():
        if api.request("GET", f"{RESOURCE}/deviceclasses/{c['metadata']['name']}", ok=(404,))[0] == 404:
            made.append(c["metadata"]["name"])
        api.apply(c)
    cluster = Cluster(api=api, plane=plane, lanes=made_lanes, topologies=topologies, classes_made=made)
    for n in topologies:
        publish(cluster, n)
    wait_for(lambda: all(_ready(api, n) for n in topologies), 60, "kwok to mark the nodes Ready")
    return cluster


def publish(cluster: Cluster, node: str, taints: dict[str, list[dict]] | None = None) -> None:
    """(Re)publish ``node``'s GPU and NIC pools, as a new generation when they exist."""
    gen = cluster.generation.get(node, 0) + 1
    cluster.generation[node] = gen
    topo = cluster.topology(node)
    for s in ds.gpu_slices(node, topo, taints=taints, generation=gen) + ds.nic_slices(node, topo, generation=gen):
        path = f"{RESOURCE}/resourceslices/{s['metadata']['name']}"
        status, old = cluster.api.request("GET", path, ok=(404,))
        if status == 404:
            cluster.api.post(f"{RESOURCE}/resourceslices", s)
        else:
            s["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            cluster.api.request("PUT", path, s)


def start_phalanx(cluster: Cluster, workdir: Path) -> Stack:
    """The whole Phalanx stack (own processes, ``--cluster kube``; the node agents as one fleet,
    advertising no GPU resource: the nodes are DRA-only) serving the Phalanx pool of every lane,
    each node's topology file the one the slices were made from."""
    nodes = {n: (cluster.topology(n), {POOL_LABEL: PHALANX, LANE_LABEL: str(lane.index), **PHALANX_LABELS})
             for lane in cluster.lanes for n in lane.nodes[PHALANX]}
    stack = start_stack(cluster.plane, nodes, workdir, fleet=True, dra_only=list(nodes))
    cluster.stack = stack
    return stack


def start_stack(plane: ControlPlane, nodes: dict[str, tuple[NodeTopology, dict[str, str]]], workdir: Path, *,
                coordinator_args: Sequence[str] = (), fleet: bool = False, dra_only: Sequence[str] = ()) -> Stack:
    """The Phalanx stack (own processes, ``--cluster kube``) serving ``nodes`` (name → topology
    and labels, as the Node objects carry them), ready once topology-discovery patched every
    node's capacity. ``fleet``: the node agents as one ``node-fleet`` process (two Python
    processes fewer per node to start). ``dra_only``: nodes whose agent advertises no GPU
    resource (``--advertise none``: their GPUs are only the DRA driver's devices)."""
    api = plane.api
    api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "lj-runtime"},
        "handler": "lj-runtime"}, ok=(409,))
    workdir.mkdir(parents=True, exist_ok=True)
    entries = []
    for n, (topo, labels) in nodes.items():
        yamlfmt.dump(topo, workdir / f"{n}.yaml")
        entries.append({"name": n, "labels": dict(labels), "topology": f"{n}.yaml",
                        **({"advertise": "none"} if n in dra_only else {})})
    (workdir / "cluster.yaml").write_text(yaml.safe_dump({"nodes": entries}))
    kube_args = ["--cluster", "kube", "--kubeconfig", str(plane.kubeconfig)]
    args = {s: list(kube_args) for s in (*SERVICES, "node-fleet")}
    args["gang-coordinator"] += list(coordinator_args)
    stack = Stack(ClusterFile.load(workdir / "cluster.yaml"), workdir=str(workdir / "stack"), service_args=args,
                  fleet=fleet)
    stack.start_nats()
    try:
        stack.start_services(timeout_s=90)
        gpus = {n: str(100 * len(topo.gpus)) for n, (topo, _) in nodes.items() if n not in dra_only}
        wait_for(lambda: all(api.get(f"/api/v1/nodes/{n}")["status"]["capacity"].get("aliyun.com/gpu-core") == want
                             for n, want in gpus.items()), 60, "topology-discovery to patch node capacity")
    except BaseException:
        stack.stop()
        raise
    return stack


def remove_cluster(cluster: Cluster) -> None:
    """Delete the slices, the nodes and the DeviceClasses the cluster created (the class
    ``gpu.nvidia.com`` serves ``nvidia.com/gpu`` through DRA on nodes without the device plugin:
    it must not outlive the module). The namespace stays: nothing deletes namespaces here."""
    api = cluster.api
    for n in cluster.topologies:
        for s in ds.gpu_slices(n, cluster.topology(n)) + ds.nic_slices(n, cluster.topology(n)):
            api.delete(f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
        api.delete(f"/api/v1/nodes/{n}")
    for name in cluster.classes_made:
        api.delete(f"{RESOURCE}/deviceclasses/{name}")


# --- claims and pods -------------------------------------------------------------------------------
def exactly(count: int = 1, cls: str = GPU, *selectors: str, mode: str = "ExactCount",
            tolerations: Sequence[dict] = ()) -> dict:
    req: dict[str, Any] = {"deviceClassName": cls}
    if mode == "All":
        req["allocationMode"] = "All"
    else:
        req["count"] = count
    if selectors:
        req["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        req["tolerations"] = [dict(t) for t in tolerations]
    return req


def claim_spec(requests: dict[str, dict | list[tuple[str, dict]]], constraints: Sequence[dict] = ()) -> dict:
    """``spec.devices`` of a claim: ``requests`` maps a request name to an ``exactly`` body or to
    ``firstAvailable`` subrequests ``[(name, body), ...]``."""
    reqs = []
    for name, body in requests.items():
        if isinstance(body, list):
            reqs.append({"name": name, "firstAvailable": [{"name": sub, **b} for sub, b in body]})
        else:
            reqs.append({"name": name, "exactly": body})
    devices: dict[str, Any] = {"requests": reqs}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    return {"devices": devices}


def create_claim(api: KubeApi, ns: str, name: str, spec: dict) -> None:
    api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaims",
             {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
              "spec": spec})


def create_template(api: KubeApi, ns: str, name: str, spec: dict) -> None:
    api.post(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
             {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": name, "namespace": ns}, "spec": {"spec": spec}})


def claim_pod(name: str, ns: str, side: str, *, claim: str = "", template: str = "",
              node_selector: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict:
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"schedulerName": SCHEDULER[side], "terminationGracePeriodSeconds": 0,
                     "nodeSelector": node_selector or {POOL_LABEL: side},
                     "resourceClaims": [{"name": "devices", **source}],
                     "containers": [{"name": "c", "image": "registry.example/app:1",
                                     "resources": {"claims": [{"name": "devices"}]}}]}}


def _condition(pod: dict) -> dict:
    return next((c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})


@dataclass
class Outcome:
    """What one scheduler did with one pod."""

    side: str
    pod: str
    fits: bool
    node: str = ""
    results: tuple[dict, ...] = ()
    """``status.allocation.devices.results`` of the pod's claim(s)."""
    message: str = ""
    """The unschedulable reason, when left pending."""
    timed_out: bool = False
    """Neither bound nor told it is unschedulable in time."""

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(r["device"] for r in self.results)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(int(m.group(1)) for r in self.results if r["driver"] == ds.GPU_DRIVER
                            and (m := re.fullmatch(r"gpu-(\d+)", r["device"]))))


def _claim_names(pod: dict) -> list[str]:
    names = []
    statuses = {s["name"]: s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses") or []}
    for rc in pod["spec"].get("resourceClaims") or []:
        name = rc.get("resourceClaimName") or statuses.get(rc["name"])
        if name:
            names.append(name)
    return names


def outcome_of(api: KubeApi, ns: str, side: str, pod_name: str, pod: dict | None = None,
               *, message: str = "", timed_out: bool = False) -> Outcome:
    pod = pod or api.get_pod(ns, pod_name) or {"spec": {}}
    node = pod["spec"].get("nodeName") or ""
    if not node:
        return Outcome(side, pod_name, False, message=message or _condition(pod).get("message", ""), timed_out=timed_out)
    results: list[dict] = []
    for c in _claim_names(pod):
        claim = api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{c}")
        results += ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return Outcome(side, pod_name, True, node=node, results=tuple(results))


def decide(api: KubeApi, ns: str, pods: dict[str, str], timeout_s: float = BOUND_TIMEOUT_S,
           settle_s: float = SETTLE_S) -> dict[str, Outcome]:
    """Wait until each pod (side -> pod name) is bound, or has been unschedulable for
    ``settle_s`` (its ``PodScheduled`` condition says ``Unschedulable``), or ``timeout_s`` passed."""
    start = time.monotonic()
    unschedulable_since: dict[str, float] = {}
    done: dict[str, Outcome] = {}
    while len(done) < len(pods):
        now = time.monotonic()
        for side, name in pods.items():
            if side in done:
                continue
            pod = api.get_pod(ns, name) or {"spec": {}}
            if pod["spec"].get("nodeName"):
                done[side] = outcome_of(api, ns, side, name, pod)
                continue
            cond = _condition(pod)
            if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                since = unschedulable_since.setdefault(side, now)
                if now - since >= settle_s:
                    done[side] = outcome_of(api, ns, side, name, pod, message=cond.get("message", ""))
            else:
                unschedulable_since.pop(side, None)
            if side not in done and now - start > timeout_s:
                done[side] = outcome_of(api, ns, side, name, pod, message=cond.get("message", "") or
                                        f"neither bound nor unschedulable after {timeout_s:g}s", timed_out=True)
        if len(done) < len(pods):
            time.sleep(0.3)
    return done


def clear_namespace(api: KubeApi, ns: str, timeout_s: float = 90) -> None:
    """Delete every pod, claim and template of ``ns`` and wait until the claims are gone (the
    resourceclaim controller deallocates a claim once no pod is left in its reservedFor; only
    then does its finalizer go), so the next case starts with every device free."""
    for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
        api.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")
    for kind in ("resourceclaims", "resourceclaimtemplates"):
        for o in api.get(f"{RESOURCE}/namespaces/{ns}/{kind}")["items"]:
            api.delete(f"{RESOURCE}/namespaces/{ns}/{kind}/{o['metadata']['name']}")
    wait_for(lambda: not api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
             and not api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"], timeout_s,
             f"the pods and claims of {ns} to be gone", interval_s=0.5)


# --- scores ----------------------------------------------------------------------------------------
def _ring_rank(name: str) -> tuple[int, int]:
    if not name:
        return (99, 0)  # one GPU: no link to be slow
    if name == "NVSWITCH":
        return (5, FABRIC_LINKS)
    return link_rank(name)


def score_key(score: GpuSetScore) -> tuple:
    """The set's own connectivity, as ``choose_gpus`` ranks it before looking at what is left:
    ring bottleneck, then NVLinks over all pairs, link classes, pairs on one NUMA node."""
    return (_ring_rank(score.ring_link), score.pair_nvlinks, score.pair_class_sum, score.pair_same_numa)


def score_of(cluster: Cluster, o: Outcome) -> GpuSetScore | None:
    return score_set(cluster.topology(o.node), o.gpus) if o.fits and o.gpus else None


def score_text(score: GpuSetScore | None) -> str:
    if score is None:
        return ""
    if not score.ring_link:
        return "1 GPU"
    return f"ring {score.ring_link}, {score.pair_nvlinks} NVLink{'' if score.pair_nvlinks == 1 else 's'}"


# --- the cases -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Blocker:
    """A claim kube-scheduler allocates before the case, on node ``node`` (0 or 1) of each pool."""

    node: int
    count: int


@dataclass(frozen=True)
class Case:
    name: str
    """A sentence: what the pod asks, and the state it asks it in."""
    requests: dict[str, Any]
    upstream_fits: bool
    """What kube-scheduler 1.36 does (the kube-scheduler half asserts it)."""
    constraints: tuple[dict, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    taints: tuple[int, ...] = ()
    """GPU indices tainted (``TAINT``) on every node for the case."""
    template: bool = False
    """The pod names a ResourceClaimTemplate (kube-controller-manager makes the claim)."""

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")[:50].strip("-")


def _sel(expr: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].{expr}'


MEM = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{}")) >= 0'
ROOT = {"matchAttribute": ds.PCIE_ROOT}
TOLERATE = ({"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"},)

CASES: tuple[Case, ...] = (
    Case("one GPU", {"gpu": exactly(1)}, True),
    Case("two GPUs", {"gpu": exactly(2)}, True),
    Case("four GPUs", {"gpu": exactly(4)}, True),
    Case("eight GPUs, a whole node", {"gpu": exactly(8)}, True),
    Case("nine GPUs, more than a node has", {"gpu": exactly(9)}, False),
    Case("a GPU whose productName is the V100's", {"gpu": exactly(1, GPU, _sel(f'productName == "{V100}"'))}, True),
    Case("a GPU whose productName is an H100's", {"gpu": exactly(1, GPU, _sel('productName == "NVIDIA H100 80GB HBM3"'))},
         False),
    Case("two GPUs of at least 15Gi memory (quantity)", {"gpu": exactly(2, GPU, MEM.format("15Gi"))}, True),
    Case("a GPU of at least 32Gi memory (quantity)", {"gpu": exactly(1, GPU, MEM.format("32Gi"))}, False),
    Case("two GPUs whose driver is newer than 550.0.0 (semver)",
         {"gpu": exactly(2, GPU, _sel('driverVersion.isGreaterThan(semver("550.0.0"))'))}, True),
    Case("a GPU whose driver is at least 600.0.0 (semver)",
         {"gpu": exactly(1, GPU, _sel('driverVersion.compareTo(semver("600.0.0")) >= 0'))}, False),
    Case("all of a node's GPUs (allocationMode All)", {"gpu": exactly(mode="All")}, True),
    Case("all of a node's GPUs when another claim holds one", {"gpu": exactly(mode="All")}, False,
         blockers=(Blocker(0, 1), Blocker(1, 1))),
    Case("firstAvailable: eight H100s, else two V100s",
         {"gpus": [("h100", exactly(8, GPU, _sel('productName == "NVIDIA H100 80GB HBM3"'))),
                   ("v100", exactly(2, GPU, _sel(f'productName == "{V100}"')))]}, True),
    Case("firstAvailable: nine GPUs, else an H100",
         {"gpus": [("nine", exactly(9)), ("h100", exactly(1, GPU, _sel('productName == "NVIDIA H100 80GB HBM3"')))]},
         False),
    Case("a GPU and the NIC on one PCIe root (matchAttribute pcieRoot)",
         {"gpu": exactly(1), "nic": exactly(1, ds.NIC_CLASS)}, True, constraints=(ROOT,)),
    Case("two GPUs and the NIC on one PCIe root", {"gpu": exactly(2), "nic": exactly(1, ds.NIC_CLASS)}, True,
         constraints=(ROOT,)),
    Case("four GPUs and the NIC on one PCIe root", {"gpu": exactly(4), "nic": exactly(1, ds.NIC_CLASS)}, False,
         constraints=(ROOT,)),
    Case("two GPUs on distinct NUMA nodes (distinctAttribute numaNode)",
         {"a": exactly(1), "b": exactly(1)}, True, constraints=({"distinctAttribute": ds.NUMA_NODE},)),
    Case("three GPUs on distinct NUMA nodes, of which there are two", {"gpu": exactly(3)}, False,
         constraints=({"distinctAttribute": ds.NUMA_NODE},)),
    Case("four GPUs on distinct PCIe roots (distinctAttribute pcieRoot)", {"gpu": exactly(4)}, True,
         constraints=({"distinctAttribute": ds.PCIE_ROOT},)),
    Case("four GPUs of one NUMA node (matchAttribute numaNode)", {"gpu": exactly(4)}, True,
         constraints=({"matchAttribute": ds.NUMA_NODE},)),
    Case("four GPUs when GPUs 0-3 are tainted NoSchedule", {"gpu": exactly(4)}, True, taints=(0, 1, 2, 3)),
    Case("five GPUs when GPUs 0-3 are tainted NoSchedule", {"gpu": exactly(5)}, False, taints=(0, 1, 2, 3)),
    Case("five GPUs when GPUs 0-3 are tainted, tolerating the taint", {"gpu": exactly(5, tolerations=TOLERATE)}, True,
         taints=(0, 1, 2, 3)),
    Case("four GPUs when another claim holds GPU 0", {"gpu": exactly(4)}, True,
         blockers=(Blocker(0, 1), Blocker(1, 1))),
    Case("three GPUs when another claim holds five", {"gpu": exactly(3)}, True,
         blockers=(Blocker(0, 5), Blocker(1, 5))),
    Case("four GPUs when another claim holds five", {"gpu": exactly(4)}, False,
         blockers=(Blocker(0, 5), Blocker(1, 5))),
    Case("a device of a DeviceClass that does not exist", {"gpu": exactly(1, "gpu.missing.example.com")}, False),
    Case("two GPUs from a ResourceClaimTemplate", {"gpu": exactly(2)}, True, template=True),
)


@dataclass
class Row:
    case: Case
    outcomes: dict[str, Outcome]
    scores: dict[str, GpuSetScore | None]
    problems: dict[str, list[str]]
    """Rules an allocation breaks (checked from the published devices), per side."""
    seconds: float


@contextlib.contextmanager
def _case_state(cluster: Cluster, case: Case, lane: Lane) -> Iterator[dict[str, set[tuple[str, str]]]]:
    """Taints (on the lane's nodes) and blockers for the case; yields the devices blockers hold per side."""
    api, ns = cluster.api, lane.namespace
    held: dict[str, set[tuple[str, str]]] = {UPSTREAM: set(), PHALANX: set()}
    mine = [n for names in lane.nodes.values() for n in names]
    try:
        if case.taints:
            for n in mine:
                publish(cluster, n, {f"gpu-{i}": [TAINT] for i in case.taints})
            time.sleep(2)  # the schedulers' caches see the new pool generation
        blockers = {}
        for side in (UPSTREAM, PHALANX):
            for k, b in enumerate(case.blockers):
                node = lane.nodes[side][b.node]
                name = f"blocker-{side[:3]}-{k}"
                create_claim(api, ns, name, claim_spec({"gpu": exactly(b.count)}))
                api.create_pod(claim_pod(name, ns, UPSTREAM, claim=name,
                                         node_selector={"kubernetes.io/hostname": node}))
                blockers[name] = side
        for name, o in decide(api, ns, {name: name for name in blockers}).items():
            if not o.fits:
                raise AssertionError(f"blocker {name} was not scheduled by kube-scheduler: {o.message}")
            held[blockers[name]] |= {(o.node, d) for d in o.devices}
        if blockers:
            time.sleep(BLOCKERS_SEEN_S)
        yield held
    finally:
        clear_namespace(api, ns)
        if case.taints:
            for n in mine:
                publish(cluster, n)
            time.sleep(2)


def run_case(cluster: Cluster, case: Case, lane: Lane | None = None) -> Row:
    """Both schedulers on the case at once, in ``lane`` (the first by default); everything the
    case made is gone afterwards."""
    lane = lane or cluster.lanes[0]
    api, ns = cluster.api, lane.namespace
    t0 = time.monotonic()
    with _case_state(cluster, case, lane) as held:
        spec = claim_spec(case.requests, case.constraints)
        pods = {}
        for side in (UPSTREAM, PHALANX):
            name = f"{side[:3]}-{case.slug}"[:63].rstrip("-")
            if case.template:
                create_template(api, ns, name, spec)
                api.create_pod(claim_pod(name, ns, side, template=name, node_selector=lane.selector(side)))
            else:
                create_claim(api, ns, name, spec)
                api.create_pod(claim_pod(name, ns, side, claim=name, node_selector=lane.selector(side)))
            pods[side] = name
        outcomes = decide(api, ns, pods)
        scores = {side: score_of(cluster, o) for side, o in outcomes.items()}
        problems = {side: check_allocation(cluster, case, o, held[side]) for side, o in outcomes.items()}
    return Row(case, outcomes, scores, problems, time.monotonic() - t0)


def run_cases(cluster: Cluster, cases: Sequence[Case], done: Callable[[Row], None] | None = None) -> list[Row]:
    """Every case, the lanes at once (each takes the next case when it is free; ``done`` is
    told of each row as it comes); the rows in the cases' order. The first error stops the
    lanes after their case and is raised."""
    todo = list(enumerate(cases))
    lock = threading.Lock()
    rows: dict[int, Row] = {}
    errors: list[BaseException] = []

    def work(lane: Lane) -> None:
        while True:
            with lock:
                if not todo or errors:
                    return
                i, case = todo.pop(0)
            try:
                row = run_case(cluster, case, lane)
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                errors.append(e)
                return
            with lock:
                rows[i] = row
                if done is not None:
                    done(row)

    threads = [threading.Thread(target=work, args=(lane,), name=f"dra-lane-{lane.index}") for lane in cluster.lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [rows[i] for i in range(len(cases))]


# --- checking an allocation against the published devices ------------------------------------------
def _attr(device: dict, name: str) -> Any:
    for key in (name, name.removeprefix(ds.GPU_DRIVER + "/")):
        if key in device.get("attributes", {}):
            return next(iter(device["attributes"][key].values()))
    return None


def check_allocation(cluster: Cluster, case: Case, o: Outcome, held: set[tuple[str, str]]) -> list[str]:
    """What is wrong with a bound pod's allocation: counts, devices held by a blocker, devices
    tainted without a toleration, constraints broken, devices that are not on the pod's node.
    Selectors are not re-evaluated (each case's selectors hold for every GPU or for none)."""
    if not o.fits:
        return []
    problems = []
    topo = cluster.topology(o.node)
    devices = ds.devices_of(ds.gpu_slices(o.node, topo) + ds.nic_slices(o.node, topo))
    by_request: dict[str, list[str]] = {}
    for r in o.results:
        if r["pool"] != o.node:
            problems.append(f"{r['device']} is in pool {r['pool']}, not on node {o.node}")
        if (o.node, r["device"]) in held:
            problems.append(f"{r['device']} is held by another claim")
        by_request.setdefault(r["request"], []).append(r["device"])
    for name, body in case.requests.items():
        if isinstance(body, list):
            chosen = [k for k in by_request if k.startswith(name + "/")]
            if len(chosen) != 1:
                problems.append(f"request {name}: {len(chosen)} subrequests allocated")
                continue
            sub = dict(body)[chosen[0].split("/", 1)[1]]
            got, want = len(by_request[chosen[0]]), sub.get("count", 1)
        else:
            got = len(by_request.get(name, []))
            want = 8 - len([h for h in held if h[0] == o.node]) if body.get("allocationMode") == "All" else body["count"]
        if got != want:
            problems.append(f"request {name}: {got} devices, not {want}")
    tolerated = any(b.get("tolerations") for b in case.requests.values() if isinstance(b, dict))
    tainted = {f"gpu-{i}" for i in case.taints}
    if not tolerated:
        problems += [f"{d} is tainted and the request does not tolerate it" for d in o.devices if d in tainted]
    for c in case.constraints:
        attr = c.get("matchAttribute") or c.get("distinctAttribute")
        values = [_attr(devices[d], attr) for d in o.devices]
        if c.get("matchAttribute") and (None in values or len(set(values)) != 1):
            problems.append(f"matchAttribute {attr}: {values}")
        if c.get("distinctAttribute") and (None in values or len(set(values)) != len(values)):
            problems.append(f"distinctAttribute {attr}: {values}")
    return problems


# --- gangs -----------------------------------------------------------------------------------------
@dataclass
class GangRun:
    name: str
    side: str
    members: dict[str, Outcome]


GANG_LABEL = "scheduling.x-k8s.io/pod-group"
GANG_SIZE = "phalanx.io/gang-min-member"


def run_gang_halves(cluster: Cluster, side: str, *, prefer_whole: bool = False) -> GangRun:
    """Two pods of 4 GPUs each, both pinned to one 8-GPU node, as one gang of two: the node's
    two halves. With ``prefer_whole`` each claim prefers the whole node (``firstAvailable``: 8,
    else 4), kubernetes#138765 on GPUs: the only way both run is still two halves, and a
    scheduler that allocates pod by pod gives the first pod all 8."""
    api, ns = cluster.api, cluster.namespace
    node = cluster.nodes[side][0]
    spec = claim_spec({"gpus": [("whole", exactly(8)), ("half", exactly(4))]} if prefer_whole else {"gpus": exactly(4)})
    name = "halves-prefer-whole" if prefer_whole else "halves"
    pods = {}
    for k in range(2):
        pod = f"{side[:3]}-{name}-{k}"
        create_claim(api, ns, pod, spec)
        api.create_pod(claim_pod(pod, ns, side, claim=pod, node_selector={"kubernetes.io/hostname": node},
                                 labels={GANG_LABEL: f"{name}-{side[:3]}", GANG_SIZE: "2"}))
        pods[pod] = pod
    try:
        return GangRun(name, side, decide(api, ns, pods))
    finally:
        clear_namespace(api, ns)


def run_gang_backtrack(cluster: Cluster, side: str) -> GangRun:
    """A gang whose second member fits only if the first is placed well: a trainer of 4 GPUs
    and a feeder of 2 GPUs with the NIC on their PCIe root (only GPU2 and GPU3 share the NIC's
    root on a DGX-1V), both on one node. First fit gives the trainer GPUs 0-3 and leaves the
    feeder nothing; the feeder fits only if the trainer takes the other quad. kube-scheduler
    has no gang: it is given the trainer first and the feeder once the trainer is bound (pod by
    pod, as it would schedule them); Phalanx is given both at once as one gang."""
    api, ns = cluster.api, cluster.namespace
    node = cluster.nodes[side][0]
    members = {
        f"{side[:3]}-trainer": claim_spec({"gpu": exactly(4)}),
        f"{side[:3]}-feeder": claim_spec({"gpu": exactly(2), "nic": exactly(1, ds.NIC_CLASS)}, (ROOT,)),
    }
    outcomes: dict[str, Outcome] = {}
    try:
        for name, spec in members.items():
            create_claim(api, ns, name, spec)
            api.create_pod(claim_pod(name, ns, side, claim=name, node_selector={"kubernetes.io/hostname": node},
                                     labels={GANG_LABEL: f"backtrack-{side[:3]}", GANG_SIZE: "2"}))
            if side == UPSTREAM:
                outcomes.update(decide(api, ns, {name: name}))
        if side == PHALANX:
            outcomes = decide(api, ns, {n: n for n in members})
        return GangRun("backtrack", side, outcomes)
    finally:
        clear_namespace(api, ns)


# --- the table -------------------------------------------------------------------------------------
def fits_text(o: Outcome) -> str:
    return "yes" if o.fits else ("no (timed out)" if o.timed_out else "no")


def _devices(o: Outcome) -> str:
    return " ".join(o.devices) if o.fits else ""


def table(rows: Sequence[Row]) -> str:
    """The agreement table in Markdown."""
    lines = ["| case | upstream fits? | phalanx fits? | upstream devices | phalanx devices | upstream GPUs' links | "
             "phalanx GPUs' links |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        up, phx = r.outcomes[UPSTREAM], r.outcomes[PHALANX]
        lines.append(f"| {r.case.name} | {fits_text(up)} | {fits_text(phx)} | {_devices(up)} | {_devices(phx)} | "
                     f"{score_text(r.scores[UPSTREAM])} | {score_text(r.scores[PHALANX])} |")
    return "\n".join(lines)


def reasons(rows: Sequence[Row]) -> str:
    """Why each scheduler left pods pending (their PodScheduled messages), one line per side
    and message, naming the cases."""
    by: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for side in (UPSTREAM, PHALANX):
            o = r.outcomes[side]
            if not o.fits:
                by.setdefault((side, o.message or "(no reason given)"), []).append(r.case.name)
    return "\n".join(f"* {side}, {len(cases)} case{'' if len(cases) == 1 else 's'} ({'; '.join(cases)}): `{msg}`"
                     for (side, msg), cases in by.items())


def gang_lines(runs: Sequence[GangRun]) -> str:
    out = []
    for g in runs:
        parts = []
        for name, o in g.members.items():
            parts.append(f"{name}: " + (f"bound, {' '.join(o.devices)}" if o.fits else f"pending ({o.message})"))
        out.append(f"* {g.name}, {g.side}: " + "; ".join(parts))
    return "\n".join(out)


def run_gang_halves_preferring_whole(cluster: Cluster, side: str) -> GangRun:
    return run_gang_halves(cluster, side, prefer_whole=True)
