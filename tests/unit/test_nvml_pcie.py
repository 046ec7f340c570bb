"""PCI paths to nvidia-smi relations, bus ids, and sysfs reading."""

from __future__ import annotations

import os

import pytest

from phalanx_nvml.pcie import (
    PciDevice,
    normalize_bus_id,
    numa_relation,
    pci_device,
    rdma_devices,
    same_bridge_relation,
    socket_of_numa,
)

R = "pci0000:00"
RP1, RP2 = "0000:00:01.0", "0000:00:02.0"
UP, D1, D2 = "0000:01:00.0", "0000:02:01.0", "0000:02:02.0"


@pytest.mark.parametrize(("case", "a", "b", "relation"), [
    ("two functions of one card are PIX", (R, RP1, "0000:01:00.0"), (R, RP1, "0000:01:00.1"), "PIX"),
    ("two devices below one switch are PIX", (R, RP1, UP, D1, "0000:03:00.0"), (R, RP1, UP, D2, "0000:04:00.0"), "PIX"),
    ("two devices two switches apart are PXB",
     (R, RP1, UP, D1, "0000:03:00.0", "0000:04:01.0", "0000:05:00.0"), (R, RP1, UP, D2, "0000:06:00.0"), "PXB"),
    ("two devices on different root ports meet at the host bridge: PHB",
     (R, RP1, UP, D1, "0000:03:00.0"), (R, RP2, "0000:08:00.0"), "PHB"),
])
def test_same_bridge_relation(case, a, b, relation):
    assert same_bridge_relation(a, b) == same_bridge_relation(b, a) == relation


def test_same_bridge_relation_refuses_two_host_bridges():
    with pytest.raises(ValueError, match="different host bridges"):
        same_bridge_relation(("pci0000:00", "x"), ("pci0000:80", "y"))


@pytest.mark.parametrize(("a", "b", "relation"), [(0, 0, "NODE"), (0, 1, "SYS"), (-1, -1, "SYS"), (0, -1, "SYS")])
def test_numa_relation_counts_unknown_as_far(a, b, relation):
    assert numa_relation(a, b) == relation


@pytest.mark.parametrize(("raw", "canonical"), [
    ("00000000:07:00.0", "0000:07:00.0"), (b"00000000:B7:1F.3", "0000:b7:1f.3"), ("0000:0c:00.1", "0000:0c:00.1"),
    ("0001:c0:00.0", "0001:c0:00.0"),
])
def test_bus_ids_are_normalized_to_sysfs_form(raw, canonical):
    assert normalize_bus_id(raw) == canonical


def test_a_string_that_is_not_a_bus_id_is_refused():
    with pytest.raises(ValueError, match="is not a PCI bus id"):
        normalize_bus_id("GPU-1234")


def _device(root, path: tuple[str, ...], numa: int | None = None, cpus: str = ""):
    d = root / "sys" / "devices"
    d = d.joinpath(*path)
    d.mkdir(parents=True)
    if numa is not None:
        (d / "numa_node").write_text(f"{numa}\n")
    if cpus:
        (d / "local_cpulist").write_text(f"{cpus}\n")
    return d


def test_rdma_devices_are_read_in_natural_order_and_software_devices_are_skipped(tmp_path):
    ib = tmp_path / "sys" / "class" / "infiniband"
    for name, bus in [("mlx5_10", "0000:0a:00.0"), ("mlx5_2", "0000:02:00.0")]:
        d = _device(tmp_path, (R, RP1, bus), numa=1, cpus="0-3,8")
        (ib / name).mkdir(parents=True)
        (ib / name / "device").symlink_to(os.path.relpath(d, ib / name))
    virtual = tmp_path / "sys" / "devices" / "virtual" / "net" / "eth0"
    virtual.mkdir(parents=True)
    (ib / "rxe0").mkdir()
    (ib / "rxe0" / "device").symlink_to(virtual)
    found = rdma_devices(tmp_path)
    assert [(d.name, d.pci) for d in found] == [
        ("mlx5_2", PciDevice(bus_id="0000:02:00.0", path=(R, RP1, "0000:02:00.0"), numa=1, cpu_affinity="0-3,8")),
        ("mlx5_10", PciDevice(bus_id="0000:0a:00.0", path=(R, RP1, "0000:0a:00.0"), numa=1, cpu_affinity="0-3,8")),
    ]


def test_no_infiniband_class_means_no_rdma_devices(tmp_path):
    assert rdma_devices(tmp_path) == ()


def test_a_gpu_pci_device_is_found_through_the_bus_link_and_a_missing_one_is_none(tmp_path):
    d = _device(tmp_path, (R, RP2, "0000:08:00.0"))
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:08:00.0").symlink_to(os.path.relpath(d, bus))
    assert pci_device(tmp_path, "0000:08:00.0") == PciDevice(bus_id="0000:08:00.0", path=(R, RP2, "0000:08:00.0"))
    assert pci_device(tmp_path, "0000:09:00.0") is None


def test_the_socket_of_a_numa_node_is_the_package_of_its_first_cpu(tmp_path):
    system = tmp_path / "sys" / "devices" / "system"
    (system / "node" / "node1").mkdir(parents=True)
    (system / "node" / "node1" / "cpulist").write_text("12-23,36-47\n")
    (system / "cpu" / "cpu12" / "topology").mkdir(parents=True)
    (system / "cpu" / "cpu12" / "topology" / "physical_package_id").write_text("1\n")
    assert (socket_of_numa(tmp_path, 1), socket_of_numa(tmp_path, 0), socket_of_numa(tmp_path, -1)) == (1, -1, -1)
