"""The ``dra`` workload of ``bench/scale.py`` (issue 38): pods whose GPUs are DRA ResourceClaims,
on kwok nodes whose ResourceSlices are shaped like NVIDIA's DRA driver, run by Phalanx and by
kube-scheduler on the same API server.

* **Cluster.** N DRA-only kwok nodes (no ``nvidia.com/gpu`` in allocatable; Phalanx's agents run
  with ``--advertise none``), alternately shaped like a DGX-1V (8 × V100 in the hybrid cube mesh:
  NVLink quads {0,1,2,3} and {4,5,6,7}, no 8-GPU set fully connected) and an HGX H100 (8 × H100 on
  NVSwitch: every set fully connected), in the synthetic network tiers. Each node publishes the
  ``gpu.nvidia.com`` pool NVIDIA's kubelet plugin would (``phalanx_localstack.draslices``), and
  Phalanx's node fleet reads topology files naming the same GPU UUIDs and PCI bus ids.
* **Workload** (``workload``): pods with one ResourceClaim each (``exactly`` N GPUs of class
  ``gpu.nvidia.com``), of 1, 2, 4 or 8 GPUs, and gangs (two members of 4 GPUs; four of 8),
  in a seeded random order, up to ``--dra-pods`` pods and 60 % of the GPUs. Each pod's claim is
  created just before it (no template: no resourceclaim controller runs at this scale).
  kube-scheduler has no gangs: it places the members one by one.
* **Measured** besides ``scale.run_phase``'s pods/s and pending→bound: for every bound pod of 2
  or more GPUs, whether its claim's GPUs are fully NVLink-connected (every pair joined by NVLink
  or NVSwitch on the node's topology): Phalanx ranks GPU sets; kube-scheduler's structured
  allocator takes the first devices that fit.
* Between the phases the claims are freed as the resourceclaim controller would (allocation and
  ``reservedFor`` cleared, finalizer removed) and deleted.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeharness import KubeApi

from kwokbench import in_threads
from phalanx_localstack import draslices as ds
from phalanx_localstack.stack import ClusterFile, ClusterNode
from phalanx_localstack.synthetic import SHAPES, tier_labels
from phalanx_proto.topology import NodeTopology
from phalanx_topology import yamlfmt
from phalanx_topology.files import topology_from_file

RESOURCE = "/apis/resource.k8s.io/v1"
NODE_SHAPES = ("8v100", "8h100")
"""Node i is shaped NODE_SHAPES[i % 2] (``--dra-shapes`` chooses others)."""
SINGLE_SIZES = ((1, 0.40), (2, 0.25), (4, 0.20), (8, 0.15))
"""GPUs per single pod, with their weights."""
GANGS = ((2, 4), (4, 8))
"""(members, GPUs each) of the gangs."""
GANG_SHARE = 0.15
"""Share of the workload's items that are gangs."""
GPU_SHARE = 0.6
"""The workload asks at most this share of the cluster's GPUs."""


@dataclass(frozen=True)
class DraCluster:
    files: ClusterFile
    topologies: dict[str, NodeTopology]


def cluster(n: int, work: Path, shapes: tuple[str, ...] = NODE_SHAPES) -> DraCluster:
    """``n`` nodes (``shapes`` in turn, the synthetic tiers), each with its topology file
    carrying the identities its slices name, and ``advertise: none``."""
    out = work / "dra-topologies"
    out.mkdir(parents=True, exist_ok=True)
    width = len(str(n - 1))
    nodes, topologies = [], {}
    base = {s: topology_from_file(str(SHAPES[s].topology), "x", gpu_model=SHAPES[s].gpu_model,
                                  gpu_memory_mib=SHAPES[s].gpu_memory_mib) for s in shapes}
    for i in range(n):
        shape = shapes[i % len(shapes)]
        name = f"dra-{shape}-{i:0{width}d}"
        topo = ds.with_identity(base[shape], name)
        path = out / f"{name}.yaml"
        yamlfmt.dump(topo, path)
        topologies[name] = topo
        nodes.append(ClusterNode(name, tier_labels(i), str(path), advertise="none"))
    return DraCluster(ClusterFile(tuple(nodes)), topologies)


def node_object(name: str, labels: dict[str, str]) -> dict:
    """A kwok node without a device plugin: its GPUs exist only as DRA devices."""
    res = {"cpu": "96", "memory": "768Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                                    **labels}},
            "status": {"capacity": dict(res), "allocatable": dict(res)}}


def publish(api: KubeApi, dra: DraCluster) -> list[str]:
    """The DeviceClasses (those missing) and every node's GPU slice; the classes created."""
    made = []
    for c in ds.device_classes():
        if api.request("GET", f"{RESOURCE}/deviceclasses/{c['metadata']['name']}", ok=(404,))[0] == 404:
            made.append(c["metadata"]["name"])
            api.post(f"{RESOURCE}/deviceclasses", c)
    in_threads(lambda item: api.post(f"{RESOURCE}/resourceslices", ds.gpu_slices(item[0], item[1])[0]),
               list(dra.topologies.items()))
    return made


# -- the workload ---------------------------------------------------------------------------------
def workload(gpus: int, pods: int, seed: int) -> tuple[list[tuple[str, str, int]], dict[str, int]]:
    """((pod name, gang or "", gang size) in creation order, pod → GPUs of its claim)."""
    rng = random.Random(seed)
    items: list[tuple[str, str, int]] = []
    want: dict[str, int] = {}
    budget = int(GPU_SHARE * gpus)
    k = 0
    while len(items) < pods:
        if rng.random() < GANG_SHARE:
            members, each = rng.choice(GANGS)
            if members * each > budget or len(items) + members > pods:
                break
            gang = f"g{k:04d}x{members}"
            for m in range(members):
                name = f"{gang}-m{m}"
                items.append((name, gang, members))
                want[name] = each
            budget -= members * each
        else:
            size = rng.choices([s for s, _ in SINGLE_SIZES], [w for _, w in SINGLE_SIZES])[0]
            if size > budget:
                break
            name = f"p{k:05d}x{size}"
            items.append((name, "", 1))
            want[name] = size
            budget -= size
        k += 1
    return items, want


def claim_object(name: str, namespace: str, gpus: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": ds.GPU_CLASS,
                                                                           "count": gpus}}]}}}


def pod_object(name: str, gang: str, size: int, namespace: str, scheduler: str) -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": gang, "aliyun.com/min-member": str(size)} if gang else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                     "containers": [{"name": "c", "image": "registry.example/app:1",
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}


def creator(api: KubeApi, namespace: str, scheduler: str, want: dict[str, int]):
    """``run_phase``'s ``create``: the pod's claim, then the pod."""
    def create(item: tuple[str, str, int]) -> None:
        name, gang, size = item
        api.post(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim_object(name, namespace, want[name]))
        api.create_pod(pod_object(name, gang, size, namespace, scheduler))
    return create


# -- what the claims got ----------------------------------------------------------------------------
def nvlinked(topo: NodeTopology, gpus: Iterable[int]) -> bool:
    """Is every pair of ``gpus`` joined by NVLink (``NV<k>``) or NVSwitch on ``topo``?"""
    names = {g.index: g.name for g in topo.gpus}
    idx = sorted(gpus)
    return all(topo.relation(names[a], names[b]).startswith("NV") for i, a in enumerate(idx) for b in idx[i + 1:])


def connectivity(api: KubeApi, namespace: str, dra: DraCluster, bound: Iterable[str]) -> dict[str, Any]:
    """Of the bound pods' multi-GPU claims, how many got a fully NVLink-connected set, per
    claim size and per node shape: ``{"2": [connected, claims], …, "all": […], "by_shape": …}``."""
    bound = set(bound)
    per: dict[str, list[int]] = {}
    for c in api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]:
        if c["metadata"]["name"] not in bound:
            continue
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        by_node: dict[str, list[int]] = {}
        for r in results:
            if r["driver"] == ds.GPU_DRIVER:
                by_node.setdefault(r["pool"], []).append(int(r["device"].removeprefix("gpu-")))
        if len(by_node) != 1:
            continue
        ((node, gpus),) = by_node.items()
        if len(gpus) < 2:
            continue
        ok = int(nvlinked(dra.topologies[node], gpus))
        shape = node.split("-")[1]
        for key in (str(len(gpus)), "all", f"{shape} {len(gpus)}"):
            got = per.setdefault(key, [0, 0])
            got[0] += ok
            got[1] += 1
    return per


def free_claims(api: KubeApi, namespace: str) -> None:
    """What the resourceclaim controller does once a claim's pods are gone: clear its allocation
    and ``reservedFor``, drop the finalizer; then delete it."""
    def free(c: dict) -> None:
        path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{c['metadata']['name']}"
        if c.get("status"):
            c = api.request("PUT", f"{path}/status", {**c, "status": {}}, ok=(404, 409))[1]
        if (c.get("metadata") or {}).get("finalizers"):
            c = api.request("PUT", path, {**c, "metadata": {**c["metadata"], "finalizers": []}}, ok=(404, 409))[1]
        api.request("DELETE", path, ok=(404,))

    for _ in range(3):  # a conflict (someone wrote meanwhile) is tried again
        items = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]
        if not items:
            return
        in_threads(free, items)


def share_text(per: dict[str, list[int]], key: str) -> str:
    if key not in per or not per[key][1]:
        return "-"
    ok, n = per[key]
    return f"{100 * ok / n:.0f}% ({ok}/{n})"


def table(rows: list[dict]) -> str:
    """Phalanx and kube-scheduler side by side, per node count: pods/s, pending→bound p50/p99,
    and the share of multi-GPU claims given a fully NVLink-connected set."""
    pairs: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r.get("workload") == "dra" and "dra" in r:
            pairs.setdefault(r["nodes"], {})[r["scheduler"]] = r
    out = []
    for n, p in sorted(pairs.items()):
        sides = [s for s in ("phalanx", "default-scheduler") if s in p]
        names = {"phalanx": "Phalanx", "default-scheduler": "kube-scheduler"}
        shapes = " and ".join(dict.fromkeys(SHAPE_NAMES.get(s, s) for s in p[sides[0]]["dra"].get("shapes", [])))
        out.append(f"DRA claims at {n} nodes ({shapes or '?'}{' in turn' if ' and ' in shapes else ''}, 8 GPUs each): "
                   f"{p[sides[0]]['pods']} pods, {p[sides[0]]['dra']['gpus']} GPUs asked")
        out.append(f"{'':<36}" + "".join(f"{names[s]:>22}" for s in sides))

        def line(label: str, fn, p=p, sides=sides) -> str:
            return f"{label:<36}" + "".join(f"{fn(p[s]):>22}" for s in sides)

        out.append(line("bound", lambda r: f"{r['bound']}/{r['pods']}"))
        out.append(line("pods/s", lambda r: f"{r['pods_per_s']:.1f}"))
        out.append(line("pending→bound p50", lambda r: _secs(r["p50_s"])))
        out.append(line("pending→bound p99", lambda r: _secs(r["p99_s"])))
        for key, label in (("all", "fully NVLink-connected, all"), ("2", "  2-GPU claims"), ("4", "  4-GPU claims"),
                           ("8", "  8-GPU claims"), ("8v100 2", "  DGX-1V, 2 GPUs"), ("8v100 4", "  DGX-1V, 4 GPUs"),
                           ("8v100 8", "  DGX-1V, 8 GPUs (none can be)")):
            out.append(line(label, lambda r, k=key: share_text(r["dra"]["connected"], k)))
        out.append("")
    return "\n".join(out)


SHAPE_NAMES = {"8v100": "DGX-1V", "8h100": "H100", "8a100": "HGX A100"}


def _secs(s: float) -> str:
    if s == float("inf"):
        return ">cap"
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"
