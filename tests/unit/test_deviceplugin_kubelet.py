"""The device plugin over real unix sockets against a fake kubelet (Registration +
PodResources servers and a client of the plugin's sockets), with the real fence code path."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import grpc
import pytest
from dpkit import NODE, UUIDS, Binder, FakeKubelet, MemCluster, assignment, node_topology, pod, rdma_sysfs

from phalanx_deviceplugin import delivery as dv
from phalanx_deviceplugin.devices import DeviceTable
from phalanx_deviceplugin.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from phalanx_deviceplugin.plugin import Plugin
from phalanx_deviceplugin.served import ServedStore
from phalanx_deviceplugin.server import Devices, KubeletSession, PodResourcesClient
from phalanx_nvml.health import NvmlHealth
from phalanx_nvmlfake.nvml import FakeMachine, FakeNvml
from phalanx_proto.kubeapi import ASSIGNMENT_ANNOTATION

pytestmark = pytest.mark.anyio
GPU = "nvidia.com/gpu"


class Node:
    """One node: fake kubelet, in-memory cluster, binder stand-in, and the plugin session."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "device-plugins"
        self.dir.mkdir()
        self.kubelet = FakeKubelet(self.dir)
        self.cluster = MemCluster()
        self.binder = Binder(self.cluster)
        self.served = ServedStore(root / "served.json")
        self.table = DeviceTable(node_topology())
        self.devices = Devices(self.table)
        self.unhealthy: frozenset[str] = frozenset()
        self.plugin = Plugin(node=NODE, table=self.table, cluster=self.cluster,
                             pod_resources=PodResourcesClient(self.kubelet.pod_resources_socket), served=self.served,
                             delivery=dv.Delivery(sysfs_root=str(rdma_sysfs(root / "host"))))
        self.session = KubeletSession(socket_dir=self.dir, plugin=self.plugin, devices=self.devices,
                                      unhealthy=lambda: self.unhealthy, poll_s=0.05, health_s=0.05)

    def admitting(self, *pods: dict, holding: dict[str, dict[str, list[str]]] | None = None) -> None:
        """What the kubelet's List shows: these pods, with the devices they already hold."""
        holding = holding or {}
        self.kubelet.listed = [(p["metadata"]["namespace"], p["metadata"]["name"],
                                {"c0": holding.get(p["metadata"]["name"], {})}) for p in pods]

    async def call(self, resource: str, method: str, request):
        channel, stub = self.kubelet.plugin(resource)
        async with channel:
            with anyio.fail_after(10):
                return await getattr(stub, method)(request)


@pytest.fixture
async def node():
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # short path: unix socket names are limited
        n = Node(Path(tmp))
        await n.kubelet.start()
        async with anyio.create_task_group() as tg:
            await tg.start(n.session.run)
            yield n
            tg.cancel_scope.cancel()
        await n.kubelet.stop()


async def until(predicate, what: str) -> None:
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.02)


async def test_every_resource_registers_with_prestart_and_preferred_allocation_and_lists_its_devices(node):
    regs = {r.resource_name: r for r in node.kubelet.registered}
    assert sorted(regs) == sorted(node.table.resources)
    assert all(r.version == "v1beta1" and r.options.pre_start_required and r.options.get_preferred_allocation_available
               for r in regs.values())
    channel, stub = node.kubelet.plugin(GPU)
    async with channel:
        first = await anext(aiter(stub.ListAndWatch(dp.Empty())))
    assert [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices] == [
        (UUIDS[0], "Healthy", [0]), (UUIDS[1], "Healthy", [0]), (UUIDS[2], "Healthy", [1])]


async def test_a_gpu_that_nvml_loses_is_streamed_as_unhealthy(node):
    machine = FakeMachine.from_topology(node_topology())
    nvml = FakeNvml(machine)
    health = NvmlHealth(nvml)
    node.session.unhealthy = lambda: frozenset(f"gpu:{u}" for u in health.unhealthy(UUIDS))
    channel, stub = node.kubelet.plugin(GPU)
    async with channel:
        stream = aiter(stub.ListAndWatch(dp.Empty()))
        assert {d.health for d in (await anext(stream)).devices} == {"Healthy"}
        nvml.lost.add(UUIDS[1])
        with anyio.fail_after(10):
            update = await anext(stream)
    assert [(d.ID, d.health) for d in update.devices] == [
        (UUIDS[0], "Healthy"), (UUIDS[1], "Unhealthy"), (UUIDS[2], "Healthy")]


async def test_the_plugin_registers_again_when_the_kubelet_restarts(node):
    before = len(node.kubelet.registered)
    await node.kubelet.restart()
    # The session counts a registration once every resource's Register call has returned;
    # the kubelet records each call as it arrives, a moment earlier.
    await until(lambda: node.session.registrations >= 2, "re-registration")
    assert (node.session.registrations, len(node.kubelet.registered)) == (2, 2 * before)
    reply = await node.call(GPU, "GetDevicePluginOptions", dp.Empty())
    assert reply.pre_start_required


async def test_two_pods_bound_at_once_each_get_exactly_their_own_gpus(node):
    p1, p2 = pod("p1", {GPU: "1"}), pod("p2", {GPU: "2"})
    node.cluster.add(p1), node.cluster.add(p2)
    await node.binder.bind([assignment(p1, gpus=(2,), gpu_uuids=(UUIDS[2],)),
                            assignment(p2, gpus=(0, 1), gpu_uuids=UUIDS[:2])])
    got = {}
    for p, size, holding in ((p2, 2, {}), (p1, 1, {"p2": {GPU: list(UUIDS[:2])}})):
        node.admitting(p1, p2, holding=holding) if holding else node.admitting(p2)
        pref = await node.call(GPU, "GetPreferredAllocation", dp.PreferredAllocationRequest(container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=list(UUIDS[:3]), allocation_size=size)]))
        ids = list(pref.container_responses[0].deviceIDs)
        resp = await node.call(GPU, "Allocate", dp.AllocateRequest(container_requests=[
            dp.ContainerAllocateRequest(devices_ids=ids)]))
        got[p["metadata"]["name"]] = (ids, list(c.name for c in resp.container_responses[0].cdi_devices))
    assert got == {"p2": (list(UUIDS[:2]), [f"nvidia.com/gpu={u}" for u in UUIDS[:2]]),
                   "p1": ([UUIDS[2]], [f"nvidia.com/gpu={UUIDS[2]}"])}


@pytest.mark.parametrize(("tamper", "reason"), [
    pytest.param("self-annotated", "no pod that Phalanx bound to gpu-node-1 is being admitted",
                 id="a pod that wrote the annotation itself"),
    pytest.param("edited", "differs from what binder wrote", id="a pod whose annotation was edited after binding"),
    pytest.param("other-ids", "the kubelet chose devices on", id="a request that does not match the assignment"),
])
async def test_what_binder_did_not_decide_fails_closed_with_the_reason(node, tamper, reason):
    p = pod("p", {GPU: "1"})
    node.cluster.add(p)
    a = assignment(p, gpus=(0,), gpu_uuids=(UUIDS[0],))
    if tamper == "self-annotated":
        import msgspec

        await node.cluster.annotate_pod(a.pod, {ASSIGNMENT_ANNOTATION: msgspec.json.encode(a).decode()})
        await node.cluster.bind(a.pod, NODE)
    else:
        await node.binder.bind([a])
    if tamper == "edited":
        await node.cluster.annotate_pod(a.pod, {ASSIGNMENT_ANNOTATION: node.cluster.pods[("default", "p")]["metadata"]
                                                ["annotations"][ASSIGNMENT_ANNOTATION].replace(UUIDS[0], UUIDS[1])})
    node.admitting(p)
    ids = [UUIDS[2]] if tamper == "other-ids" else [UUIDS[0]]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node.call(GPU, "Allocate", dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason in err.value.details()
    assert node.served.all() == []


async def test_a_fence_entry_of_a_deleted_pod_blocks_nothing_and_prestart_checks_the_kubelets_mapping(node):
    gone, p = pod("gone", {GPU: "1"}), pod("p", {GPU: "1"})
    node.cluster.add(gone), node.cluster.add(p)
    await node.binder.bind([assignment(gone, gpus=(1,), gpu_uuids=(UUIDS[1],)),
                            assignment(p, gpus=(0,), gpu_uuids=(UUIDS[0],))])
    node.cluster.remove("default", "gone")
    node.admitting(gone, p)  # the kubelet still lists the deleted pod: it is skipped, not a second candidate
    await node.call(GPU, "Allocate", dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[UUIDS[0]])]))
    node.admitting(p, holding={"p": {GPU: [UUIDS[0]]}})
    await node.call(GPU, "PreStartContainer", dp.PreStartContainerRequest(devices_ids=[UUIDS[0]]))
    node.admitting(gone, holding={"gone": {GPU: [UUIDS[0]]}})  # the kubelet says another pod holds them
    with pytest.raises(grpc.aio.AioRpcError, match="are held by default/gone"):
        await node.call(GPU, "PreStartContainer", dp.PreStartContainerRequest(devices_ids=[UUIDS[0]]))


async def test_a_tdm_pod_gets_its_gpu_once_and_an_rdma_pod_its_nic_device_nodes(node):
    tdm = pod("tdm", {"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "4"})
    rdma = pod("rdma", {GPU: "1", "aliyun.com/rdma": "1"})
    node.cluster.add(tdm), node.cluster.add(rdma)
    await node.binder.bind([assignment(tdm, gpus=(1,), gpu_uuids=(UUIDS[1],), core_pct=50, memory_mib=4096),
                            assignment(rdma, gpus=(2,), gpu_uuids=(UUIDS[2],), nics=("mlx5_1",))])
    node.admitting(tdm)
    core = await node.call("aliyun.com/gpu-core", "Allocate", dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=[f"{UUIDS[1]}-core-{k}" for k in range(50)])]))
    mem = await node.call("aliyun.com/gpu-memory", "Allocate", dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=[f"{UUIDS[1]}-mem-{k}" for k in range(4)])]))
    c, m = core.container_responses[0], mem.container_responses[0]
    assert ([d.name for d in c.cdi_devices], dict(c.envs)["PHALANX_GPU_CORE_PERCENT"], dict(c.envs)["PHALANX_ISOLATION"]) == (
        [f"nvidia.com/gpu={UUIDS[1]}"], "50", "advisory")
    assert (list(m.cdi_devices), dict(m.envs)) == ([], {})  # verified, but the GPU is named once
    node.admitting(tdm, rdma, holding={"tdm": {"aliyun.com/gpu-core": ["x"] * 50, "aliyun.com/gpu-memory": ["x"] * 4}})
    r = await node.call("aliyun.com/rdma", "Allocate", dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=["mlx5_1-rdma-0"])]))
    assert [d.host_path for d in r.container_responses[0].devices] == [
        "/dev/infiniband/uverbs1", "/dev/infiniband/umad1", "/dev/infiniband/rdma_cm"]
