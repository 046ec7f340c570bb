"""Phalanx end to end into the container: the real services (gang-coordinator, placement,
binder, topology-discovery serving the device plugin, mig-manager on the fake NVML of the same
node) on the real kube-apiserver bind a pod; the kubelet's own device manager (``dm-harness``)
admits the pod as the API server returns it; the options the runtime would be given for the
container must equal what binder wrote in the ``phalanx.io/assignment`` annotation.

One node, not managed by kwok (nothing but the harness admits its pods), with 8 A100s (GPU7 in
MIG mode) and two RDMA NICs. Each test uses its own pods; they share the stack and a control
plane of their own: the session's holds other tiers' Phalanx pods (Jobs the real controllers
keep recreating), which this stack would otherwise place on its one node."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from dmharness import DeviceManager, bin_path, cluster_of
from dpkit import rdma_sysfs
from kubeharness import HarnessError, start_control_plane, unique

from phalanx_bus import Bus
from phalanx_deviceplugin import delivery as dv
from phalanx_kube import fence as F
from phalanx_kube.port import ClusterPort
from phalanx_localstack.stack import ClusterFile, Stack
from phalanx_nvmlfake.nvml import gpu_uuid
from phalanx_proto import subjects as S
from phalanx_proto.events import PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, ISOLATION_ANNOTATION
from phalanx_proto.state import mig_slot, node_mig_decoder
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology import yamlfmt

pytestmark = [pytest.mark.anyio, pytest.mark.deviceplugin, pytest.mark.e2e]
SERVICES = ("topology-discovery", "gang-coordinator", "placement", "mig-manager", "binder")
GPU, RDMA = "nvidia.com/gpu", "aliyun.com/rdma"
NIC_NODES = {"mlx5_0": ["/dev/infiniband/umad0", "/dev/infiniband/uverbs0"],
             "mlx5_1": ["/dev/infiniband/umad1", "/dev/infiniband/uverbs1"]}
"""The device nodes ``rdma_sysfs`` gives each NIC in the node's sysfs."""


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def topology(node: str) -> NodeTopology:
    """8 A100-40GB on NVSwitch, GPU7 in MIG mode, UUIDs as the node's fake NVML reports them."""
    gpus = tuple(Gpu(index=i, name=f"GPU{i}", uuid=gpu_uuid(node, f"GPU{i}"), model="NVIDIA A100-SXM4-40GB",
                     memory_mib=40960, mig_capable=True, mig_enabled=i == 7, numa=i // 4) for i in range(8))
    nics = (Nic(name="mlx5_0", device="mlx5_0", numa=0), Nic(name="mlx5_1", device="mlx5_1", numa=1))
    numa = {**{g.name: g.numa for g in gpus}, **{n.name: n.numa for n in nics}}

    def rel(a: str, b: str) -> str:
        if a.startswith("GPU") and b.startswith("GPU"):
            return "NV12"
        return "NODE" if numa[a] == numa[b] else "SYS"

    names = list(numa)
    return NodeTopology(node=node, gpus=gpus, nics=nics, nvswitch=True,
                        relations={a: {b: rel(a, b) for b in names if b != a} for a in names})


@dataclass
class E2E:
    name: str
    cluster: ClusterPort
    dm: DeviceManager
    stack: Stack
    fence_namespace: str
    create: Any
    """``await create(pod dict)``: as a user would (kubectl create)."""
    api: Any
    """The admin REST client (``KubeApi``)."""

    async def bound(self, ns: str, name: str, timeout_s: float = 120) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pod once binder bound it, and its assignment annotation."""
        with anyio.move_on_after(timeout_s):
            while True:
                pod = await self.cluster.get_pod(PodRef(namespace=ns, name=name))
                if pod is not None and pod.node_name:
                    return pod.raw, json.loads(pod.annotations[ASSIGNMENT_ANNOTATION])
                await anyio.sleep(0.2)
        logs = "\n".join(self.stack.tail(s, 25) for s in ("gang-coordinator", "placement", "binder"))
        raise AssertionError(f"{ns}/{name} not bound within {timeout_s}s\n{logs}")

    async def options(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Admit the pod as the API server returns it, start its container, and return what
        the runtime would be told (``PreStartContainer`` runs first)."""
        admitted = await self.dm.admit(pod)
        assert admitted == {"ok": True}, admitted
        reply = await self.dm.start_container(pod["metadata"]["uid"], pod["spec"]["containers"][0]["name"])
        assert reply["ok"], reply
        o = reply["options"]
        return {"cdi": sorted(d["Name"] for d in o.get("CDIDevices") or []),
                "devices": sorted(d["PathOnHost"] for d in o.get("Devices") or []),
                "env": {e["Name"]: e["Value"] for e in o.get("Envs") or []}}

    async def fenced(self) -> set[str]:
        lease = await self.cluster.get_lease(self.fence_namespace, F.lease_name(self.name))
        return set() if lease is None else {e.name for e in F.read(lease, self.name, 0).pods}


@pytest.fixture(scope="module")
def plane():
    try:
        own = start_control_plane(with_kwok=False)
    except HarnessError as e:
        pytest.fail(f"Kubernetes test control plane unavailable: {e}", pytrace=False)
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def ns(plane) -> str:
    name = unique("dpe2e")
    plane.api.create_namespace(name)
    return name


@pytest.fixture(scope="module")
async def e2e(request, plane):
    async with cluster_of("kube", request, plane) as (cluster, create, fence_ns):
        kube, api = plane, plane.api
        name = unique("dp-e2e")
        labels = {"kubernetes.io/hostname": name, "lj_runtimekit_enable": "true"}
        api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
        # What a kubelet reports besides the device plugin's resources (the harness is only its
        # device manager): Ready, and the CPU, memory and pod count placement's filters check.
        base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        api.patch(f"/api/v1/nodes/{name}/status", {"status": {"capacity": base, "allocatable": base, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dm-harness"}]}})
        with tempfile.TemporaryDirectory(dir="/tmp", prefix="dpe") as tmp:  # unix socket paths stay short
            root = Path(tmp)
            rdma_sysfs(root / "host")
            yamlfmt.dump(topology(name), root / "topology.yaml")
            (root / "cluster.yaml").write_text(yaml.safe_dump({"nodes": [
                {"name": name, "labels": {"lj_runtimekit_enable": "true"}, "topology": str(root / "topology.yaml")}]}))
            kube_args = ["--cluster", "kube", "--kubeconfig", str(kube.kubeconfig)]
            args = {s: list(kube_args) for s in SERVICES}
            args["topology-discovery"] += [
                "--advertise", "device-plugin", "--device-plugin-dir", str(root / "dp"),
                "--pod-resources-socket", str(root / "pr.sock"), "--state-dir", str(root / "state"),
                "--fence-namespace", fence_ns, "--sysfs-root", str(root / "host")]
            args["mig-manager"] += ["--nvml", "fake:A100-40GBx7@off,A100-40GBx1"]
            args["binder"] += ["--fence-namespace", fence_ns]
            args["gang-coordinator"] += ["--resync-s", "1"]
            dm = DeviceManager(bin_path(), root / "dp", root / "pr.sock")
            await dm.start()
            stack = Stack(ClusterFile.load(root / "cluster.yaml"), workdir=str(root / "stack"), service_args=args)
            try:
                stack.start_nats()
                await anyio.to_thread.run_sync(lambda: stack.start_services(timeout_s=120))
                with anyio.fail_after(60):  # the plugin registered: the kubelet counts 7 whole GPUs
                    while (await dm.request("capacity"))["allocatable"].get(GPU) != 7:
                        await anyio.sleep(0.2)
                yield E2E(name, cluster, dm, stack, fence_ns, create, api)
            finally:
                await anyio.to_thread.run_sync(stack.stop)
                await dm.stop()


def pod(name: str, ns: str, limits: dict[str, str], *, rdma: bool = False, **meta: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "registry.example/cuda:12",
                                 "resources": {"limits": dict(limits)}}
    spec: dict[str, Any] = {"schedulerName": "phalanx", "terminationGracePeriodSeconds": 0,
                            "containers": [container]}
    if rdma:
        spec["hostNetwork"] = True
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, **meta}, "spec": spec}


def expected(a: dict[str, Any], isolation: str) -> dict[str, Any]:
    """What docs/delivery.md says the container gets for assignment ``a`` on a CDI node
    without MPS: the GPUs (or the MIG instance) by CDI name, the NICs' device nodes, the limits."""
    names = [a["mig_instance_uuid"]] if a.get("mig_profile") else list(a["gpu_uuids"])
    env = {"NVIDIA_VISIBLE_DEVICES": "void", "PHALANX_GPU_UUIDS": ",".join(names), "PHALANX_ISOLATION": isolation}
    devices: list[str] = []
    if a.get("nics"):
        env["PHALANX_RDMA_DEVICES"] = ",".join(a["nics"])
        devices = sorted([d for n in a["nics"] for d in NIC_NODES[n]] + ["/dev/infiniband/rdma_cm"])
    if not a.get("mig_profile") and a.get("core_pct"):
        env["PHALANX_GPU_CORE_PERCENT"] = str(a["core_pct"])
    if not a.get("mig_profile") and a.get("memory_mib"):
        env["PHALANX_GPU_MEMORY_MIB"] = str(a["memory_mib"])
    return {"cdi": sorted(f"{dv.CDI_KIND}={n}" for n in names), "devices": devices, "env": env}


CASES = [
    pytest.param({GPU: "2"}, {}, "hard", id="whole GPUs"),
    pytest.param({GPU: "1", RDMA: "1"}, {"rdma": True}, "hard", id="a GPU with its RDMA NIC"),
    pytest.param({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"}, {}, "advisory", id="a TDM share"),
    pytest.param({"aliyun.com/gpu-slice": "3", "aliyun.com/gpu-memory": "4"}, {}, "hard", id="a MIG instance"),
]


async def mig_record(e2e: E2E, a: dict[str, Any]):
    """The record mig-manager keeps of the instance it made for ``a`` (from its NVML's listing)."""
    bus = await Bus.connect(e2e.stack.url, service="test")
    try:
        entry = await (await bus.kv(S.KV_MIG)).get(S.token(a["node"]))
        return node_mig_decoder.decode(entry.value).instances[mig_slot(a["gpus"][0], a["mig_start"])]
    finally:
        await bus.close()


async def test_the_four_kinds_of_pod_get_exactly_what_binder_wrote_in_their_annotation(e2e, ns):
    """All four are created at once (binder fences them together), then admitted one by one."""
    for i, case in enumerate(CASES):
        limits, kw, _ = case.values
        await e2e.create(pod(f"p{i}", ns, limits, **kw))
    for i, case in enumerate(CASES):
        raw, a = await e2e.bound(ns, f"p{i}")
        assert (raw["spec"]["nodeName"], a["node"], a["pod"]["uid"]) == (e2e.name, e2e.name, raw["metadata"]["uid"])
        assert await e2e.options(raw) == expected(a, case.values[2]), case.id
        if a.get("mig_profile"):
            record = await mig_record(e2e, a)
            assert (record.uuid, record.pod.uid, record.state) == (a["mig_instance_uuid"], raw["metadata"]["uid"],
                                                                   "ready")
    for i in range(len(CASES)):  # the agent records the level it delivered, on the pod
        with anyio.fail_after(30):
            while (await e2e.cluster.get_pod(PodRef(namespace=ns, name=f"p{i}"))).annotations.get(
                    ISOLATION_ANNOTATION) != CASES[i].values[2]:
                await anyio.sleep(0.2)


async def test_a_pod_that_writes_the_assignment_itself_is_refused_and_binders_pod_is_served(e2e, ns):
    await e2e.create(pod("legit", ns, {GPU: "1"}))
    legit, a = await e2e.bound(ns, "legit")
    # The rogue copies the legit pod's annotation word for word (so its digest is the one in the
    # fence) and puts itself on the node without a scheduler.
    rogue = pod("rogue", ns, {GPU: "1"}, annotations={ASSIGNMENT_ANNOTATION: legit["metadata"]["annotations"][
        ASSIGNMENT_ANNOTATION]})
    rogue["spec"].update(schedulerName="default-scheduler", nodeName=e2e.name)
    rogue = await e2e.create(rogue)
    reply = await e2e.dm.admit(rogue)
    assert not reply["ok"]
    assert reply["error"].endswith(f"code = FailedPrecondition desc = phalanx: {GPU}: no pod that Phalanx bound to "
                                   f"{e2e.name} is being admitted (no pod of the fence is waiting for its devices)")
    assert await e2e.options(legit) == expected(a, "hard")


async def test_a_pod_whose_annotation_was_edited_after_the_bind_is_refused_with_the_reason(e2e, ns):
    await e2e.create(pod("edited", ns, {GPU: "1"}))
    raw, a = await e2e.bound(ns, "edited")
    others = [gpu_uuid(e2e.name, f"GPU{i}") for i in range(7) if gpu_uuid(e2e.name, f"GPU{i}") not in a["gpu_uuids"]]
    forged = json.dumps({**a, "gpu_uuids": others[:1]})
    ref = PodRef(namespace=ns, name="edited", uid=raw["metadata"]["uid"])
    await e2e.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: forged})  # the pod's owner edits it
    reply = await e2e.dm.admit((await e2e.cluster.get_pod(ref)).raw)
    assert not reply["ok"]
    assert f"pod {ns}/edited: phalanx.io/assignment differs from what binder wrote" in reply["error"]


async def test_binder_releases_a_fence_entry_once_the_pod_started_or_was_deleted(e2e, ns):
    await e2e.create(pod("starts", ns, {GPU: "1"}))
    await e2e.create(pod("deleted", ns, {"aliyun.com/gpu-core": "10"}))  # shares a GPU: the node has 7
    started, _ = await e2e.bound(ns, "starts")
    await e2e.bound(ns, "deleted")
    assert {"starts", "deleted"} <= await e2e.fenced()
    assert (await e2e.dm.admit(started)) == {"ok": True}
    ref = PodRef(namespace=ns, name="starts", uid=started["metadata"]["uid"])
    await anyio.to_thread.run_sync(lambda: e2e.api.patch(f"/api/v1/namespaces/{ns}/pods/starts/status", {
        "metadata": {"uid": ref.uid}, "status": {"containerStatuses": [{  # as the kubelet reports a starting container
            "name": "app", "image": "registry.example/cuda:12", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}}))
    await e2e.cluster.delete_pod(PodRef(namespace=ns, name="deleted"))
    with anyio.fail_after(30):
        while {"starts", "deleted"} & await e2e.fenced():
            await anyio.sleep(0.2)
