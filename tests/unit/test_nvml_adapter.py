"""The NVML adapter's own code, run on the fake NVML built from each real fixture: the model
that comes out must be the model that went in."""

from __future__ import annotations

import ctypes
import inspect
from pathlib import Path

import msgspec
import pynvml
import pytest

from phalanx_nvml import DiscoveryError, NvmlDiscovery, NvmlUnavailable
from phalanx_nvmlfake.nvml import FakeMachine, FakeNvml
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology import load_file

ROOT = Path(__file__).parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "topology"
ALL = sorted(p.name for p in FIXTURES.glob("*.txt"))


def discover(topo: NodeTopology, tmp_path: Path, nvml_class: type = FakeNvml) -> tuple[NodeTopology, FakeMachine, FakeNvml]:
    machine = FakeMachine.from_topology(topo)
    machine.write_sysfs(tmp_path)
    nvml = nvml_class(machine)
    return NvmlDiscovery(nvml, sysfs_root=tmp_path).discover(topo.node), machine, nvml


@pytest.mark.parametrize("fixture", ALL)
def test_the_adapter_on_a_fake_built_from_a_fixture_discovers_the_same_model(fixture, tmp_path):
    parsed = load_file(FIXTURES / fixture, node="n1")
    got, machine, nvml = discover(parsed, tmp_path)
    assert got == machine.expected
    rename = machine.renamed
    assert got.relations == {rename[a]: {rename[b]: r for b, r in row.items()} for a, row in parsed.relations.items()}
    assert [(g.index, g.numa, g.cpu_affinity) for g in got.gpus] == [(g.index, g.numa, g.cpu_affinity) for g in parsed.gpus]
    assert sorted((n.device, n.numa) for n in got.nics) == sorted((rename[n.name], n.numa) for n in parsed.nics)
    assert got.nvswitch is parsed.nvswitch
    assert nvml.initialized == 0


def test_the_adapter_asks_nvml_for_every_fact_it_reports(tmp_path):
    _, _, nvml = discover(load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"), tmp_path)
    assert {"nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
            "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMigMode",
            "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetTopologyCommonAncestor",
            "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemoteDeviceType",
            "nvmlShutdown"} <= set(nvml.calls)
    assert (nvml.calls[0], nvml.calls[-1]) == ("nvmlInit", "nvmlShutdown")


def test_the_example_file_s_model_memory_and_mig_come_back_from_nvml(tmp_path):
    topo = load_file(ROOT / "examples" / "topology" / "p5-8xH100-nvswitch.yaml")
    topo = msgspec.structs.replace(topo, gpus=tuple(msgspec.structs.replace(g, mig_enabled=g.index == 3)
                                                    for g in topo.gpus))
    got, machine, _ = discover(topo, tmp_path)
    assert got == machine.expected
    assert [(g.model, g.memory_mib, g.mig_capable, g.mig_enabled) for g in got.gpus][2:4] == [
        ("NVIDIA H100 80GB HBM3", 81559, True, False), ("NVIDIA H100 80GB HBM3", 81559, True, True)]
    assert all(g.uuid.startswith("GPU-") and g.pci_bus_id for g in got.gpus)


def test_a_small_node_is_discovered_as_exactly_this_model(tmp_path):
    topo = NodeTopology(
        node="n1",
        gpus=(Gpu(index=0, name="GPU0", uuid="GPU-a", model="NVIDIA L40S", memory_mib=46068, numa=0, cpu_affinity="0-3"),
              Gpu(index=1, name="GPU1", uuid="GPU-b", model="NVIDIA L40S", memory_mib=46068, numa=1, cpu_affinity="4-7")),
        nics=(Nic(name="NIC0", device="mlx5_0", numa=0, cpu_affinity="0-3"),),
        relations={"GPU0": {"GPU1": "SYS", "NIC0": "PIX"}, "GPU1": {"GPU0": "SYS", "NIC0": "SYS"},
                   "NIC0": {"GPU0": "PIX", "GPU1": "SYS"}})
    got, machine, _ = discover(topo, tmp_path)
    gpu0, gpu1, nic = machine.gpus[0].gpu.pci_bus_id, machine.gpus[1].gpu.pci_bus_id, machine.nics[0].nic.pci_bus_id
    assert got == NodeTopology(
        node="n1", source="nvml",
        gpus=(Gpu(index=0, name="GPU0", uuid="GPU-a", model="NVIDIA L40S", memory_mib=46068, numa=0,
                  cpu_affinity="0-3", pci_bus_id=gpu0),
              Gpu(index=1, name="GPU1", uuid="GPU-b", model="NVIDIA L40S", memory_mib=46068, numa=1,
                  cpu_affinity="4-7", pci_bus_id=gpu1)),
        nics=(Nic(name="mlx5_0", device="mlx5_0", numa=0, cpu_affinity="0-3", pci_bus_id=nic),),
        relations={"GPU0": {"GPU1": "SYS", "mlx5_0": "PIX"}, "GPU1": {"GPU0": "SYS", "mlx5_0": "SYS"},
                   "mlx5_0": {"GPU0": "PIX", "GPU1": "SYS"}})


class _OldDriver(FakeNvml):
    """An NVML without nvmlDeviceGetNumaNodeId and nvmlDeviceGetNvLinkRemoteDeviceType."""

    nvmlDeviceGetNumaNodeId = None
    nvmlDeviceGetNvLinkRemoteDeviceType = None


@pytest.mark.parametrize("fixture", ["dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", "aws-p5.48xlarge_8xH100_NV18.txt"])
def test_an_older_driver_without_numa_and_remote_type_calls_gives_the_same_model(fixture, tmp_path):
    got, machine, nvml = discover(load_file(FIXTURES / fixture), tmp_path, _OldDriver)
    assert got == machine.expected
    assert "nvmlDeviceGetNumaNodeId" not in nvml.calls


def test_no_nvidia_driver_raises_nvml_unavailable_with_nvml_s_reason():
    with pytest.raises(NvmlUnavailable, match="^NVML Shared Library Not Found$"):
        NvmlDiscovery(FakeNvml(None)).discover("n1")


def test_the_real_pynvml_module_raises_nvml_unavailable_on_a_machine_without_the_driver():
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has the NVIDIA driver; the fake-driven tests cover the adapter")
    with pytest.raises(NvmlUnavailable):
        NvmlDiscovery().discover("n1")


class _FailingUuid(FakeNvml):
    def nvmlDeviceGetUUID(self, handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


def test_a_failing_nvml_call_raises_discovery_error_and_still_shuts_nvml_down(tmp_path):
    machine = FakeMachine.from_topology(load_file(FIXTURES / "aws-p5.48xlarge_8xH100_NV18.txt"))
    nvml = _FailingUuid(machine)
    with pytest.raises(DiscoveryError, match="^NVML call failed: GPU is lost$"):
        NvmlDiscovery(nvml, sysfs_root=tmp_path).discover("n1")
    assert nvml.initialized == 0


def test_without_sysfs_nics_are_not_found_and_gpus_keep_their_nvml_facts(tmp_path):
    machine = FakeMachine.from_topology(load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"))
    got = NvmlDiscovery(FakeNvml(machine), sysfs_root=tmp_path).discover("n1")
    assert got.nics == ()
    assert got.gpus == machine.expected.gpus
    assert got.relations == {a: {b: r for b, r in row.items() if b != "mlx5_0"}
                             for a, row in machine.expected.relations.items() if a != "mlx5_0"}


def test_the_adapter_gives_the_same_answer_twice_so_a_change_can_be_detected(tmp_path):
    machine = FakeMachine.from_topology(load_file(FIXTURES / "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt"))
    machine.write_sysfs(tmp_path)
    adapter = NvmlDiscovery(FakeNvml(machine), sysfs_root=tmp_path)
    assert adapter.discover("n1") == adapter.discover("n1")


def _fake_functions() -> list[str]:
    return sorted(n for n in vars(FakeNvml) if n.startswith("nvml"))


@pytest.mark.parametrize("name", _fake_functions())
def test_every_fake_nvml_function_has_pynvml_s_name_and_parameters(name):
    fake = inspect.signature(getattr(FakeNvml, name))
    real = inspect.signature(getattr(pynvml, name))
    assert list(fake.parameters)[1:] == list(real.parameters)


def test_every_fake_nvml_constant_has_pynvml_s_value():
    consts = {n: v for n, v in vars(FakeNvml).items() if n.startswith("NVML")}
    assert consts and all(getattr(pynvml, n) == v for n, v in consts.items())
    assert FakeNvml.NVMLError is pynvml.NVMLError


def test_the_fake_refuses_relations_no_pcie_tree_produces():
    topo = NodeTopology(
        node="n", gpus=(Gpu(index=0, name="GPU0"),),
        nics=(Nic(name="a"), Nic(name="b")),
        relations={"GPU0": {"a": "PIX", "b": "PIX"}, "a": {"GPU0": "PIX", "b": "SYS"}, "b": {"GPU0": "PIX", "a": "SYS"}})
    with pytest.raises(ValueError, match="no PCIe tree has a–b SYS while both share one host bridge"):
        FakeMachine.from_topology(topo)


def test_the_fake_refuses_gpus_that_are_not_numbered_from_zero():
    with pytest.raises(ValueError, match="GPU0..GPUn-1"):
        FakeMachine.from_topology(NodeTopology(node="n", gpus=(Gpu(index=1, name="GPU1"),), relations={"GPU1": {}}))
