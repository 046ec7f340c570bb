"""The device plugin registered with the kubelet's own device manager (k8s.io/kubernetes v1.36.3,
``dm-harness``), admitting pods as the kubelet does: pods bound by a binder stand-in that takes
the real fence code path (annotation, one fence write per batch through the Kubernetes port,
Binding). Every scenario runs on both adapters of the port: the simulated cluster on a real
nats-server, and the real kube-apiserver (pods, Bindings and fence leases through
``KubeCluster``). The container options the kubelet would hand the runtime must equal the
assignment, exactly."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from dmharness import DeviceManager, bin_path, cluster_of
from dpkit import MIG_UUID, UUIDS, Binder, assignment, node_topology, pod, rdma_sysfs

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.agent import AgentConfig, PluginAgent
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION, ISOLATION_ANNOTATION

pytestmark = [pytest.mark.anyio, pytest.mark.deviceplugin]
GPU = "nvidia.com/gpu"
_n = iter(range(10_000))


class Node:
    """One node: the kubelet device manager, the plugin agent, the cluster and a binder."""

    def __init__(self, root: Path, cluster: Any, tg, create_pod, namespace: str) -> None:
        k = next(_n)
        self.name, self.namespace = f"dp-node-{k}", namespace
        self.root, self.cluster, self.tg = root, cluster, tg
        self._create_pod = create_pod
        self.topology = node_topology(self.name)
        self.binder = Binder(cluster, node=self.name, namespace=self.namespace)
        self.dm = DeviceManager(bin_path(), root / "dp", root / "pr.sock")
        self.unhealthy: frozenset[str] = frozenset()
        self.agent: PluginAgent | None = None

    async def start_plugin(self) -> None:
        config = AgentConfig(node=self.name, socket_dir=str(self.root / "dp"),
                             pod_resources_socket=str(self.root / "pr.sock"), state_dir=str(self.root / "state"),
                             fence_namespace=self.namespace,
                             delivery=dv.Delivery(sysfs_root=str(self.root / "host")), health_s=0.5)
        self.agent = PluginAgent(self.tg, self.cluster, config, lambda uuids: self.unhealthy)
        await self.agent.ensure(self.topology, True)
        await self.registered()

    async def registered(self, gpus: int = 3) -> None:
        """Until the kubelet counts the plugin's healthy whole GPUs."""
        with anyio.fail_after(30):
            while (await self.dm.request("capacity"))["allocatable"].get(GPU) != gpus:
                await anyio.sleep(0.1)

    async def create(self, name: str, limits: dict[str, str]) -> dict[str, Any]:
        obj = pod(name, limits, namespace=self.namespace)
        del obj["metadata"]["uid"], obj["status"]
        return await self._create_pod(obj)

    def assign(self, p: dict[str, Any], **fields: Any) -> Assignment:
        return assignment(p, node=self.name, **fields)

    async def admit(self, p: dict[str, Any]) -> dict[str, Any]:
        """The pod as the kubelet sees it once bound, admitted by the device manager."""
        m = p["metadata"]
        current = await self.cluster.get_pod(PodRef(namespace=m["namespace"], name=m["name"], uid=m["uid"]))
        return await self.dm.admit(current.raw)

    async def options(self, p: dict[str, Any]) -> dict[str, Any]:
        """What the runtime would be told for container c0 (PreStartContainer runs first)."""
        reply = await self.dm.start_container(p["metadata"]["uid"])
        assert reply["ok"], reply
        o = reply["options"]
        return {"cdi": sorted(d["Name"] for d in o.get("CDIDevices") or []),
                "devices": sorted(d["PathOnHost"] for d in o.get("Devices") or []),
                "env": {e["Name"]: e["Value"] for e in o.get("Envs") or []}}

    async def devices(self, p: dict[str, Any]) -> dict[str, list[str]]:
        return (await self.dm.request("devices", uid=p["metadata"]["uid"]))["devices"]["c0"]


@pytest.fixture(params=["sim", "kube"])
async def node(request):
    async with cluster_of(request.param, request) as (cluster, create, namespace):
        with tempfile.TemporaryDirectory(dir="/tmp", prefix="dp") as tmp:  # unix socket paths must stay short
            root = Path(tmp)
            rdma_sysfs(root / "host")
            async with anyio.create_task_group() as tg:
                n = Node(root, cluster, tg, create, namespace)
                await n.dm.start()
                try:
                    await n.start_plugin()
                    yield n
                finally:
                    await n.agent.stop()
                    await n.dm.stop()
                    tg.cancel_scope.cancel()


def gpus(*indices: int) -> list[str]:
    return [f"nvidia.com/gpu={UUIDS[i]}" for i in indices]


async def test_two_pods_bound_at_once_are_steered_to_exactly_their_own_gpus_and_nics(node):
    big = await node.create("big", {GPU: "2"})
    rdma = await node.create("rdma", {GPU: "1", "aliyun.com/rdma": "1"})
    await node.binder.bind([node.assign(big, gpus=(2, 0), gpu_uuids=(UUIDS[2], UUIDS[0])),
                            node.assign(rdma, gpus=(1,), gpu_uuids=(UUIDS[1],), nics=("mlx5_1",))])
    assert await node.admit(big) == {"ok": True}
    assert await node.admit(rdma) == {"ok": True}

    assert await node.devices(big) == {GPU: sorted([UUIDS[0], UUIDS[2]])}
    assert await node.devices(rdma) == {GPU: [UUIDS[1]], "aliyun.com/rdma": ["mlx5_1-rdma-0"]}
    b = await node.options(big)
    assert (b["cdi"], b["env"]["PHALANX_GPU_UUIDS"]) == (gpus(0, 2), f"{UUIDS[2]},{UUIDS[0]}")  # the assignment's order
    o = await node.options(rdma)
    assert (o["cdi"], o["devices"], o["env"]["PHALANX_RDMA_DEVICES"], o["env"]["NVIDIA_VISIBLE_DEVICES"]) == (
        gpus(1), ["/dev/infiniband/rdma_cm", "/dev/infiniband/umad1", "/dev/infiniband/uverbs1"], "mlx5_1", "void")


async def test_a_tdm_share_and_a_mig_slice_get_their_gpu_their_limits_and_an_honest_isolation_level(node):
    tdm = await node.create("tdm", {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"})
    mig = await node.create("mig", {"aliyun.com/gpu-slice": "1", "aliyun.com/gpu-memory": "5"})
    await node.binder.bind([node.assign(tdm, gpus=(1,), gpu_uuids=(UUIDS[1],), core_pct=50, memory_mib=4096),
                            node.assign(mig, gpus=(3,), gpu_uuids=(UUIDS[3],), mig_profile="1g.5gb", mig_start=0,
                                        mig_instance_uuid=MIG_UUID, memory_mib=5120)])
    assert await node.admit(tdm) == {"ok": True}
    assert await node.admit(mig) == {"ok": True}

    t = await node.options(tdm)
    assert (t["cdi"], {k: v for k, v in t["env"].items() if k.startswith("PHALANX_GPU_")}, t["env"]["PHALANX_ISOLATION"]) == (
        gpus(1), {"PHALANX_GPU_UUIDS": UUIDS[1], "PHALANX_GPU_CORE_PERCENT": "50", "PHALANX_GPU_MEMORY_MIB": "4096"},
        "advisory")
    m = await node.options(mig)
    assert (m["cdi"], m["env"]["PHALANX_ISOLATION"]) == ([f"nvidia.com/gpu={MIG_UUID}"], "hard")
    assert {r: {i.rsplit("-", 1)[0] for i in ids} for r, ids in (await node.devices(tdm)).items()} == {
        "aliyun.com/gpu-core": {f"{UUIDS[1]}-core"}, "aliyun.com/gpu-memory": {f"{UUIDS[1]}-mem"}}

    ref = PodRef(namespace=node.namespace, name="tdm")
    with anyio.fail_after(15):
        while (await node.cluster.get_pod(ref)).annotations.get(ISOLATION_ANNOTATION) != "advisory":
            await anyio.sleep(0.1)
    assert [(e.reason, e.type) for e in await node.cluster.list_events(ref)] == [("GpuIsolation", "Warning")]


async def test_a_request_that_cannot_match_the_assignment_fails_closed_and_holds_nothing(node):
    node.unhealthy = frozenset({UUIDS[2]})  # GPU2 failed after placement chose it
    await node.registered(gpus=2)
    p = await node.create("late", {GPU: "1"})
    await node.binder.bind([node.assign(p, gpus=(2,), gpu_uuids=(UUIDS[2],))])
    reply = await node.admit(p)
    assert not reply["ok"]
    assert reply["error"] in [f"rpc error: code = FailedPrecondition desc = phalanx: pod {node.namespace}/late: "
                              f"nvidia.com/gpu: the kubelet chose devices on {u}, the assignment is {UUIDS[2]}"
                              for u in UUIDS[:2]]  # the kubelet's own pick among the healthy ones
    assert (await node.dm.request("devices", uid=p["metadata"]["uid"]))["ok"] is False  # rejected: not kept


async def test_a_pod_that_wrote_phalanx_annotations_itself_is_refused_while_binders_pod_is_served(node):
    legit = await node.create("legit", {GPU: "1"})
    rogue = await node.create("rogue", {GPU: "1"})
    await node.binder.bind([node.assign(legit, gpus=(0,), gpu_uuids=(UUIDS[0],))])
    import msgspec

    forged = node.assign(rogue, gpus=(1,), gpu_uuids=(UUIDS[1],))
    ref = forged.pod
    await node.cluster.annotate_pod(ref, {ASSIGNMENT_ANNOTATION: msgspec.json.encode(forged).decode()})
    await node.cluster.bind(ref, node.name)
    reply = await node.admit(rogue)
    assert not reply["ok"] and "no pod that Phalanx bound to" in reply["error"]
    assert await node.admit(legit) == {"ok": True}
    assert (await node.options(legit))["cdi"] == gpus(0)


async def test_a_plugin_restart_between_admission_and_container_start_loses_nothing(node):
    a = await node.create("a", {GPU: "1"})
    b = await node.create("b", {GPU: "1"})
    await node.binder.bind([node.assign(a, gpus=(1,), gpu_uuids=(UUIDS[1],)),
                            node.assign(b, gpus=(2,), gpu_uuids=(UUIDS[2],))])
    assert await node.admit(a) == {"ok": True}
    await node.agent.stop()
    await anyio.sleep(0.5)
    await node.start_plugin()  # a new plugin process: its record of what it served comes from disk
    assert (await node.options(a))["cdi"] == gpus(1)
    assert await node.admit(b) == {"ok": True}
    assert (await node.options(b))["cdi"] == gpus(2)


async def test_a_kubelet_restart_keeps_admitted_pods_devices_and_the_plugin_registers_again(node):
    a = await node.create("a", {GPU: "2"})
    b = await node.create("b", {GPU: "1"})
    await node.binder.bind([node.assign(a, gpus=(0, 2), gpu_uuids=(UUIDS[0], UUIDS[2])),
                            node.assign(b, gpus=(1,), gpu_uuids=(UUIDS[1],))])
    assert await node.admit(a) == {"ok": True}
    before = await node.options(a)
    await node.dm.stop()
    await node.dm.start()  # wipes the plugin sockets, keeps its checkpoint
    await node.registered()
    current = await node.cluster.get_pod(PodRef(namespace=node.namespace, name="a"))
    assert (await node.dm.request("restore", pod=current.raw))["ok"]
    assert await node.options(a) == before
    assert await node.admit(b) == {"ok": True}
    assert (await node.options(b))["cdi"] == gpus(1)
    assert node.agent.session.registrations == 2
