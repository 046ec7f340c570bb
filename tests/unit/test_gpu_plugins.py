"""Each GPU plugin's rule: the status it gives (code, text, numbers, resolvability), whole."""

from __future__ import annotations

import pytest
from engine_builders import node, pod

from phalanx_engine import gpu_plugins as gpu
from phalanx_engine.decide import DEFAULT_PROFILE
from phalanx_engine.status import Code, Reason, Status
from phalanx_proto.events import Assignment


def status(plugin: str, code: Code, text: str, *, resolvable: bool, **numbers) -> Status:
    return Status(plugin=plugin, reasons=(Reason(code=code, text=text, **numbers),), resolvable=resolvable)


@pytest.mark.parametrize(("n", "expected"), [
    pytest.param(node("a").gpus(8), None, id="an enabled node with a fresh heartbeat is usable"),
    pytest.param(node("a").gpus(8).disabled(), status("NodeUsable", Code.NOT_ENABLED, gpu.R_NOT_ENABLED,
                                                      resolvable=False), id="a node not enabled for Phalanx"),
    pytest.param(node("a").gpus(8).stale(), status("NodeUsable", Code.HEARTBEAT_STALE, gpu.R_STALE, resolvable=False),
                 id="a stale heartbeat is unresolvable like kube-scheduler's not-ready taint"),
])
def test_node_usable(n, expected):
    assert gpu.node_usable(n.view()) == expected


WHOLE = "WholeGpus"


@pytest.mark.parametrize(("plugin", "p", "n", "expected"), [
    pytest.param(gpu.GpuPresent(), pod("p").gpus(1), node("a"),
                 status("GpuPresent", Code.NO_GPUS, gpu.R_NO_GPUS, resolvable=False),
                 id="a GPU request on a node that reported no GPU"),
    pytest.param(gpu.GpuPresent(), pod("p"), node("a"), None, id="a pod without GPUs needs none"),
    pytest.param(gpu.GpuVendor(), pod("p").gpus(1).vendor("amd"), node("a").gpus(8),
                 status("GpuVendor", Code.GPU_VENDOR, gpu.R_VENDOR, resolvable=False, detail="amd"),
                 id="the vendor hint does not match the node's GPUs"),
    pytest.param(gpu.GpuVendor(), pod("p").share(core=30), node("a").gpus(8, vendor="amd"),
                 status("GpuVendor", Code.AMD_WHOLE_ONLY, gpu.R_AMD_SLICE, resolvable=False),
                 id="AMD GPUs take whole GPUs only"),
    pytest.param(gpu.GpuVendor(), pod("p").gpus(2), node("a").gpus(8, vendor="amd"), None,
                 id="whole GPUs on an AMD node are fine"),
    pytest.param(gpu.RdmaNic(), pod("p").gpus(2).rdma(), node("a").gpus(8, model="H100"),
                 status("RdmaNic", Code.NO_RDMA_NIC, gpu.R_NO_RDMA, resolvable=False),
                 id="RDMA on a node without an RDMA NIC"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(4), node("a").gpus(8).busy(0, 1, 2, 3, 4),
                 status(WHOLE, Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=True, resource="nvidia.com/gpu",
                        requested=4, free=3, capacity=8),
                 id="too few free GPUs now is resolvable"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(9, resource="aliyun.com/gpu"), node("a").gpus(8),
                 status(WHOLE, Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=False, resource="aliyun.com/gpu",
                        requested=9, free=8, capacity=8),
                 id="more GPUs than the node has is unresolvable"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(2), node("a").gpus(8).share(0, core=10).mig_instance(1, "1g.5gb", 0),
                 None, id="shared GPUs are not free but the others are"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(1), node("a").gpus(2, model="A100", mig=True),
                 status(WHOLE, Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=False, resource="nvidia.com/gpu",
                        requested=1, free=0, capacity=0),
                 id="GPUs in MIG mode are never given whole"),
    pytest.param(gpu.TdmShare(), pod("p").share(core=60), node("a").gpus(2).share(0, core=50).share(1, core=50),
                 status("TdmShare", Code.INSUFFICIENT_GPU_CORE, gpu.R_CORE, resolvable=True, resource="gpu-core",
                        requested=60, free=50, capacity=100),
                 id="not enough core percent left on any GPU"),
    pytest.param(gpu.TdmShare(), pod("p").share(memory_mib=8192), node("a").gpus(1).share(0, memory_mib=12288),
                 status("TdmShare", Code.INSUFFICIENT_GPU_MEMORY, gpu.R_MEMORY, resolvable=True, resource="gpu-memory",
                        requested=8192, free=4096, capacity=16384),
                 id="not enough GPU memory left"),
    pytest.param(gpu.TdmShare(), pod("p").share(memory_mib=32768), node("a").gpus(2),
                 status("TdmShare", Code.INSUFFICIENT_GPU_MEMORY, gpu.R_MEMORY, resolvable=False, resource="gpu-memory",
                        requested=32768, free=16384, capacity=16384),
                 id="more GPU memory than the GPU has is unresolvable"),
    pytest.param(gpu.TdmShare(), pod("p").share(core=10, memory_mib=1024), node("a").gpus(2, memory_mib=0),
                 status("TdmShare", Code.GPU_MEMORY_UNKNOWN, gpu.R_MEM_UNKNOWN, resolvable=False),
                 id="GPU memory asked on GPUs that did not report theirs"),
    pytest.param(gpu.TdmShare(), pod("p").share(core=10, gpus=3), node("a").gpus(3).busy(0, 1),
                 status("TdmShare", Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=True, resource="gpus",
                        requested=3, free=1, capacity=3),
                 id="a share of three GPUs where two are taken whole"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(4), node("a").gpus(4).unhealthy(2),
                 status(WHOLE, Code.GPU_UNHEALTHY, gpu.R_UNHEALTHY, resolvable=False, resource="nvidia.com/gpu",
                        requested=4, free=3, capacity=3, detail="GPU 2 reported unhealthy"),
                 id="an unhealthy GPU is neither free nor capacity: the refusal says it"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(2), node("a").gpus(4).unhealthy(2).busy(0, 1),
                 status(WHOLE, Code.GPU_UNHEALTHY, gpu.R_UNHEALTHY, resolvable=True, resource="nvidia.com/gpu",
                        requested=2, free=1, capacity=3, detail="GPU 2 reported unhealthy"),
                 id="the unhealthy GPU would have made up the difference"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(3), node("a").gpus(4).unhealthy(3).busy(0, 1),
                 status(WHOLE, Code.INSUFFICIENT_GPUS, gpu.R_GPUS, resolvable=True, resource="nvidia.com/gpu",
                        requested=3, free=1, capacity=3, detail="GPU 3 reported unhealthy"),
                 id="too few GPUs even were the unhealthy one healthy: the shortfall, with the detail"),
    pytest.param(gpu.WholeGpus(), pod("p").gpus(3), node("a").gpus(4).unhealthy(3), None,
                 id="the healthy GPUs suffice"),
    pytest.param(gpu.GpuPresent(), pod("p").gpus(1), node("a").gpus(2).unhealthy(0, 1),
                 status("GpuPresent", Code.GPU_UNHEALTHY, gpu.R_UNHEALTHY, resolvable=False,
                        detail="GPU 0, 1 reported unhealthy"),
                 id="every GPU of the node unhealthy"),
    pytest.param(gpu.TdmShare(), pod("p").share(core=60), node("a").gpus(2).share(0, core=50).unhealthy(1),
                 status("TdmShare", Code.INSUFFICIENT_GPU_CORE, gpu.R_CORE, resolvable=True, resource="gpu-core",
                        requested=60, free=50, capacity=100, detail="GPU 1 reported unhealthy"),
                 id="a share never goes on an unhealthy GPU"),
    pytest.param(gpu.MigSlice(), pod("p").mig(3, 20480), node("v").gpus(8),
                 status("MigSlice", Code.NO_MIG_GPU, gpu.R_NO_MIG, resolvable=False), id="MIG on V100"),
    pytest.param(gpu.MigSlice(), pod("p").mig(3, 20480), node("m").gpus(8, model="A100"),
                 status("MigSlice", Code.MIG_NOT_ENABLED, gpu.R_MIG_OFF, resolvable=False),
                 id="MIG on an A100 that is not in MIG mode"),
])
def test_filter(plugin, p, n, expected):
    assert plugin.filter(p.member(), n.state()) == expected


@pytest.mark.parametrize(("p", "n", "expected"), [
    pytest.param(pod("g").mig(7, 40960), node("m").gpus(1, model="A100", mig=True).mig_instance(0, "1g.5gb", 0),
                 status("MigSlice", Code.NO_MIG_SLOT, gpu.R_MIG_FULL, resolvable=True),
                 id="the 7-slice profile waits for the 1-slice instance to go"),
    pytest.param(pod("g").mig(5), node("m").gpus(1, model="A100", mig=True),
                 status("MigSlice", Code.NO_MIG_SLOT, gpu.R_MIG_FULL, resolvable=False),
                 id="no A100 profile has five slices"),
    pytest.param(pod("g").mig(3, 20480), node("m").gpus(1, model="A100", mig=True),
                 Assignment(pod=pod("g").spec().pod, node="m", gpus=(0,), gpu_uuids=("",), memory_mib=20480,
                            mig_profile="3g.20gb", mig_start=4),
                 id="a 3-slice instance takes the slot that keeps the most capacity"),
])
def test_mig_allocation(p, n, expected):
    assert gpu.MigSlice().allocate(p.member(), n.state()) == expected


def test_a_mig_slice_never_goes_on_an_unhealthy_gpu():
    n = node("m").gpus(2, model="A100", mig=True).mig_instance(0, "3g.20gb", 4).unhealthy(0)
    got = gpu.MigSlice().allocate(pod("g").mig(3, 20480).member(), n.state())
    assert got == Assignment(pod=pod("g").spec().pod, node="m", gpus=(1,), gpu_uuids=("",), memory_mib=20480,
                             mig_profile="3g.20gb", mig_start=4)
    full = node("m").gpus(1, model="A100", mig=True).unhealthy(0)
    assert gpu.MigSlice().allocate(pod("g").mig(3, 20480).member(), full.state()) == status(
        "MigSlice", Code.NO_MIG_SLOT, gpu.R_MIG_FULL, resolvable=False, detail="GPU 0 reported unhealthy")


def test_an_unhealthy_gpu_s_reservation_stays_booked_and_new_work_takes_the_healthy_ones():
    held = Assignment(pod=pod("old").spec().pod, node="a", gpus=(1,))
    st = node("a").gpus(4).reserved(held).unhealthy(1, 2).state()
    assert (st.whole, st.free_whole(), st.whole_capacity(), st.unhealthy) == ({1}, {0, 3}, 2, frozenset({1, 2}))
    got = DEFAULT_PROFILE.evaluate(pod("new").gpus(2).member(), st)
    assert got == Assignment(pod=pod("new").spec().pod, node="a", gpus=(0, 3), gpu_uuids=("", ""))


def test_the_profile_reports_the_first_filter_that_refuses():
    got = DEFAULT_PROFILE.evaluate(pod("p").mig(1).vendor("amd").member(), node("v").gpus(8).state())
    assert got == status("GpuVendor", Code.GPU_VENDOR, gpu.R_VENDOR, resolvable=False, detail="amd")


def test_a_pod_without_gpus_takes_no_gpu():
    got = DEFAULT_PROFILE.evaluate(pod("cpu").member(), node("a").gpus(2).state())
    assert got == Assignment(pod=pod("cpu").spec().pod, node="a")
