"""Builders and fakes for the device-plugin tests (unit tier and the kubelet-harness tier).

* ``node_topology()``: a 4-GPU node (GPU3 in MIG mode) with two RDMA NICs;
* ``rdma_sysfs(root)``: the ``/sys`` entries the plugin reads for those NICs' device nodes;
* ``MemCluster``: the ``ClusterPort`` slice the plugin and a binder use, in memory (unit tier;
  the harness tier uses the simulated cluster on a real nats-server instead);
* ``Binder``: what binder does for a batch of pods on one node - annotation, one fence write
  (``phalanx_kube.fence.fence_pods``), Binding - through the port, so tests run the real fence
  code path;
* ``pod()``: a pod dict with the seed's resource names.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import msgspec

from phalanx_kube import fence as F
from phalanx_kube.port import Lease, LeaseConflict, Pod, pod_from_dict
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, FenceEntry, assignment_digest
from phalanx_proto.topology import Gpu, Nic, NodeTopology

NODE = "gpu-node-1"
NAMESPACE = "phalanx-system"
UUIDS = tuple(f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(4))
MIG_UUID = "MIG-0000000a-aaaa-bbbb-cccc-dddddddddddd"


def node_topology(node: str = NODE) -> NodeTopology:
    gpus = tuple(Gpu(index=i, name=f"GPU{i}", uuid=UUIDS[i], model="A100-SXM4-40GB", memory_mib=40960,
                     mig_capable=True, mig_enabled=i == 3, numa=i // 2) for i in range(4))
    nics = (Nic(name="mlx5_0", device="mlx5_0", numa=0), Nic(name="mlx5_1", device="mlx5_1", numa=1))
    names = [g.name for g in gpus] + [n.name for n in nics]
    numa = {**{g.name: g.numa for g in gpus}, **{n.name: n.numa for n in nics}}

    def rel(a: str, b: str) -> str:
        if a.startswith("GPU") and b.startswith("GPU"):
            return "NV12"
        return "NODE" if numa[a] == numa[b] else "SYS"

    relations = {a: {b: rel(a, b) for b in names if b != a} for a in names}
    return NodeTopology(node=node, gpus=gpus, nics=nics, relations=relations, nvswitch=True, source="test")


def rdma_sysfs(root: Path) -> Path:
    """``sys/class/infiniband/mlx5_<i>/device/infiniband_{verbs,mad}`` and ``class/misc/rdma_cm``."""
    for i in (0, 1):
        dev = root / "sys" / "class" / "infiniband" / f"mlx5_{i}" / "device"
        (dev / "infiniband_verbs" / f"uverbs{i}").mkdir(parents=True)
        (dev / "infiniband_mad" / f"umad{i}").mkdir(parents=True)
    (root / "sys" / "class" / "misc" / "rdma_cm").mkdir(parents=True)
    return root


def pod(name: str, limits: dict[str, str], *, namespace: str = "default", uid: str = "",
        containers: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
            "spec": {"schedulerName": "phalanx",
                     "containers": [{"name": f"c{i}", "image": "cuda",
                                     "resources": {"limits": dict(limits), "requests": dict(limits)}}
                                    for i in range(containers)]},
            "status": {"phase": "Pending"}}


def assignment(p: dict[str, Any], node: str = NODE, **fields: Any) -> Assignment:
    m = p["metadata"]
    return Assignment(pod=PodRef(namespace=m["namespace"], name=m["name"], uid=m["uid"]), node=node, **fields)


class MemCluster:
    """In-memory ``ClusterPort`` slice: pods by (namespace, name), leases, events."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], Lease] = {}
        self.events: list[tuple[str, str, str]] = []
        self._rv = 0

    def add(self, obj: dict[str, Any]) -> Pod:
        self.pods[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return pod_from_dict(obj)

    def remove(self, namespace: str, name: str) -> None:
        self.pods.pop((namespace, name), None)

    async def get_pod(self, ref: PodRef) -> Pod | None:
        obj = self.pods.get((ref.namespace, ref.name))
        return None if obj is None else pod_from_dict(copy.deepcopy(obj))

    async def annotate_pod(self, ref: PodRef, annotations: dict[str, str]) -> None:
        self.pods[(ref.namespace, ref.name)]["metadata"].setdefault("annotations", {}).update(annotations)

    async def bind(self, ref: PodRef, node: str, annotations: dict[str, str] | None = None) -> None:
        if annotations:
            await self.annotate_pod(ref, annotations)
        self.pods[(ref.namespace, ref.name)]["spec"]["nodeName"] = node

    async def record_event(self, ref: PodRef, *, reason: str, message: str, type: str = "Normal") -> None:
        self.events.append((str(ref), reason, message))

    async def get_lease(self, namespace: str, name: str) -> Lease | None:
        return self.leases.get((namespace, name))

    def _put(self, lease: Lease) -> Lease:
        self._rv += 1
        stored = msgspec.structs.replace(lease, resource_version=str(self._rv))
        self.leases[(lease.namespace, lease.name)] = stored
        return stored

    async def create_lease(self, lease: Lease) -> Lease:
        if (lease.namespace, lease.name) in self.leases:
            raise LeaseConflict("exists")
        return self._put(lease)

    async def update_lease(self, lease: Lease) -> Lease:
        cur = self.leases.get((lease.namespace, lease.name))
        if cur is None or cur.resource_version != lease.resource_version:
            raise LeaseConflict("changed")
        return self._put(lease)

    async def delete_lease(self, namespace: str, name: str, *, resource_version: str = "") -> None:
        cur = self.leases.get((namespace, name))
        if cur is not None and resource_version and cur.resource_version != resource_version:
            raise LeaseConflict("changed")
        self.leases.pop((namespace, name), None)


class Binder:
    """Binder's part of the handshake, for tests: annotate, fence the batch, bind."""

    def __init__(self, cluster: Any, *, node: str = NODE, namespace: str = NAMESPACE,
                 clock=None) -> None:
        import time

        self.cluster, self.node, self.namespace = cluster, node, namespace
        self.clock = clock or time.time

    async def bind(self, batch: list[Assignment]) -> None:
        now = self.clock()
        entries = []
        for a in batch:
            text = msgspec.json.encode(a).decode()
            await self.cluster.annotate_pod(a.pod, {ASSIGNMENT_ANNOTATION: text})
            entries.append(FenceEntry(uid=a.pod.uid, namespace=a.pod.namespace, name=a.pod.name,
                                      digest=assignment_digest(text), expires=now + F.ENTRY_TTL_S))
        await F.fence_pods(self.cluster, namespace=self.namespace, node=self.node, entries=entries,
                           holder="binder-test", now=now)
        for a in batch:
            await self.cluster.bind(a.pod, self.node)

    async def release(self, uids: set[str]) -> None:
        await F.release_pods(self.cluster, namespace=self.namespace, node=self.node, uids=uids,
                             holder="binder-test", now=self.clock())


# -- a fake kubelet over unix sockets (unit tier) -------------------------------------------------
class FakeKubelet:
    """The kubelet's two servers the plugin talks to - Registration (``kubelet.sock``) and
    PodResources (``pod-resources.sock``) - plus a client of the plugin's own sockets.
    ``listed`` is what PodResources ``List`` answers: (namespace, name, {container: {resource: ids}})."""

    def __init__(self, socket_dir: Path) -> None:
        self.dir = Path(socket_dir)
        self.registered: list[Any] = []
        self.listed: list[tuple[str, str, dict[str, dict[str, list[str]]]]] = []
        self._servers: list[Any] = []

    @property
    def pod_resources_socket(self) -> Path:
        return self.dir / "pod-resources.sock"

    async def start(self) -> None:
        import grpc

        from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
        from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
        from phalanx_deviceplugin.kubelet.podresources.v1 import api_pb2 as pr
        from phalanx_deviceplugin.kubelet.podresources.v1 import api_pb2_grpc as pr_grpc

        kubelet = self

        class Registration(dp_grpc.RegistrationServicer):
            async def Register(self, request, context):  # noqa: N802
                kubelet.registered.append(request)
                return dp.Empty()

        class Lister(pr_grpc.PodResourcesListerServicer):
            async def List(self, request, context):  # noqa: N802
                return pr.ListPodResourcesResponse(pod_resources=[
                    pr.PodResources(namespace=ns, name=name, containers=[
                        pr.ContainerResources(name=c, devices=[pr.ContainerDevices(resource_name=r, device_ids=ids)
                                                               for r, ids in per.items()])
                        for c, per in containers.items()])
                    for ns, name, containers in kubelet.listed])

        reg = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(Registration(), reg)
        reg.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        lister = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), lister)
        lister.add_insecure_port(f"unix://{self.pod_resources_socket}")
        for s in (reg, lister):
            await s.start()
        self._servers = [reg, lister]

    async def stop(self) -> None:
        for s in self._servers:
            await s.stop(grace=None)
        self._servers = []

    async def restart(self) -> None:
        """As the kubelet starts: stop, wipe the socket directory, serve a new kubelet.sock."""
        await self.stop()
        for p in self.dir.iterdir():
            if p.is_socket() and p.name != "pod-resources.sock":
                p.unlink()
        await self.start()

    def plugin(self, resource: str):
        """A stub of the plugin socket registered for ``resource`` (the last registration)."""
        import grpc

        from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

        endpoint = [r.endpoint for r in self.registered if r.resource_name == resource][-1]
        channel = grpc.aio.insecure_channel(f"unix://{self.dir / endpoint}")
        return channel, dp_grpc.DevicePluginStub(channel)
