"""phalanx_localstack.draslices: simulated nodes' topology with GPU identities, and the
ResourceSlices and DeviceClasses NVIDIA's DRA driver (and our RDMA NIC driver) would publish for
them. The shapes are checked here against the API's rules as the wire contract states them
(``phalanx_proto.dra`` bounds) and the pool rules (complete, unique names, counters that exist);
tests/kube/test_draslices_api.py posts them to the real API server."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from phalanx_localstack import draslices as ds
from phalanx_proto import dra
from phalanx_topology import yamlfmt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "topology"
DGX1V = EXAMPLES / "dgx1v-8xV100-1xmlx5.yaml"
P5 = EXAMPLES / "p5-8xH100-nvswitch.yaml"
A4 = EXAMPLES / "a4-8xB200-8xmlx5.yaml"
L40S = EXAMPLES / "pcie-4xL40S-handwritten.yaml"
ALL = (DGX1V, P5, A4, L40S)
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUALIFIED = re.compile(r"^([a-z0-9.-]{1,63}/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")


def _snake(key: str) -> str:
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()


def as_wire_slice(obj: dict[str, Any]) -> dra.Slice:
    """A ResourceSlice API object as the wire contract's ``Slice`` (fails where a bound is broken)."""
    spec = obj["spec"]

    def device(d: dict[str, Any]) -> dict[str, Any]:
        out = {_snake(k): v for k, v in d.items() if k not in ("consumesCounters", "attributes", "capacity")}
        out["attributes"] = {k: {"int" if "int" in v else next(iter(v)): next(iter(v.values()))}
                             for k, v in d.get("attributes", {}).items()}
        out["capacity"] = d.get("capacity", {})
        out["consumes_counters"] = [{"counter_set": c["counterSet"],
                                     "counters": {k: v["value"] for k, v in c["counters"].items()}}
                                    for c in d.get("consumesCounters", ())]
        return out

    wire = {"name": obj["metadata"]["name"], "generation": spec["pool"]["generation"],
            "slice_count": spec["pool"]["resourceSliceCount"], "nodes": {"node_name": spec["nodeName"]},
            "devices": [device(d) for d in spec.get("devices", ())],
            "shared_counters": [{"name": c["name"], "counters": {k: v["value"] for k, v in c["counters"].items()}}
                                for c in spec.get("sharedCounters", ())]}
    return msgspec.convert(wire, dra.Slice)


def check_pool(slices: list[dict[str, Any]], node: str, driver: str) -> None:
    """One complete pool of ``node``: every slice names the node, the driver and the pool, the
    count and generation agree, device names are unique DNS labels, attribute and capacity
    names are qualified names, each attribute has exactly one value, and every consumed counter
    exists in the pool's counter sets with enough of it."""
    assert slices
    for s in slices:
        as_wire_slice(s)
        spec = s["spec"]
        assert (spec["driver"], spec["pool"]["name"], spec["nodeName"]) == (driver, node, node)
        assert spec["pool"]["resourceSliceCount"] == len(slices)
        assert bool(spec.get("devices")) != bool(spec.get("sharedCounters")), "a slice has devices or counters"
        if any(d.get("consumesCounters") or d.get("taints") for d in spec.get("devices", ())):
            assert len(spec["devices"]) <= 64
    assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    devices = [d for s in slices for d in s["spec"].get("devices", ())]
    names = Counter(d["name"] for d in devices)
    assert max(names.values()) == 1, names
    sets = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters", ())}
    for d in devices:
        assert DNS_LABEL.match(d["name"]), d["name"]
        for name, value in d.get("attributes", {}).items():
            assert QUALIFIED.match(name), name
            assert len(value) == 1 and next(iter(value)) in ("int", "bool", "string", "version"), value
        for name in d.get("capacity", {}):
            assert QUALIFIED.match(name), name
        assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= dra.MAX_ATTRIBUTES
        for use in d.get("consumesCounters", ()):
            counters = sets[use["counterSet"]]
            for c, v in use["counters"].items():
                assert c in counters, (d["name"], c)
                assert _quantity(v["value"]) <= _quantity(counters[c]["value"])


def _quantity(text: str) -> int:
    for suffix, mult in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * mult
    return int(text)


def attr(device: dict[str, Any], name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


# --- identities ------------------------------------------------------------------------------------
def test_identities_are_deterministic_well_formed_and_distinct_per_node_and_gpu():
    a = ds.with_identity(DGX1V, "node-a")
    again = ds.with_identity(DGX1V, "node-a")
    b = ds.with_identity(DGX1V, "node-b")
    assert a == again
    assert a.node == "node-a"
    uuids = [g.uuid for g in a.gpus] + [g.uuid for g in b.gpus]
    assert all(UUID.match(u) for u in uuids), uuids
    assert len(set(uuids)) == 16
    assert ds.gpu_uuid("node-a", 3) == a.gpus[3].uuid
    buses = [g.pci_bus_id for g in a.gpus] + [n.pci_bus_id for n in a.nics]
    assert all(BDF.match(x) for x in buses) and len(set(buses)) == len(buses)


def test_identity_keeps_what_nvml_reported_and_is_idempotent():
    topo = ds.topology(DGX1V)
    real = msgspec.structs.replace(topo.gpus[0], uuid="GPU-real", pci_bus_id="0000:07:00.0")
    topo = msgspec.structs.replace(topo, gpus=(real, *topo.gpus[1:]))
    once = ds.with_identity(topo)
    assert (once.gpus[0].uuid, once.gpus[0].pci_bus_id) == ("GPU-real", "0000:07:00.0")
    assert ds.with_identity(once) == once


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_the_topology_with_identities_round_trips_through_the_yaml_format(path, tmp_path):
    """The node's topology file the tests write for Phalanx carries the identities."""
    t = ds.with_identity(path, "n1")
    assert yamlfmt.loads(yamlfmt.dumps(t), source=t.source) == t
    as_doc = yaml.safe_load(yamlfmt.dumps(t))
    assert ds.with_identity(as_doc) == msgspec.structs.replace(t, source="")


# --- PCIe roots ------------------------------------------------------------------------------------
def groups(roots: dict[str, str]) -> set[frozenset[str]]:
    by_root: dict[str, set[str]] = {}
    for dev, root in roots.items():
        by_root.setdefault(root, set()).add(dev)
    return {frozenset(v) for v in by_root.values()}


def test_pcie_roots_follow_the_pcie_relations():
    # DGX-1V: mlx5_0 is PIX to GPU2 and GPU3, NODE or SYS to the rest; NVLink hides the GPUs' own paths.
    dgx = groups(ds.pcie_roots(ds.topology(DGX1V)))
    assert frozenset({"GPU2", "GPU3", "mlx5_0"}) in dgx
    assert {frozenset({f"GPU{i}"}) for i in (0, 1, 4, 5, 6, 7)} <= dgx
    # a4: each pair of GPUs shares a switch with a pair of NICs.
    a4 = groups(ds.pcie_roots(ds.topology(A4)))
    assert a4 == {frozenset({f"GPU{2 * k}", f"GPU{2 * k + 1}", f"NIC{2 * k}", f"NIC{2 * k + 1}"}) for k in range(4)}
    # L40S: GPU0, GPU1 and the NIC PIX; GPU2–GPU3 NODE (two host bridges of one NUMA node).
    assert groups(ds.pcie_roots(ds.topology(L40S))) == {
        frozenset({"GPU0", "GPU1", "mlx5_0"}), frozenset({"GPU2"}), frozenset({"GPU3"})}
    # p5 in this file has no PCIe relation at all: every GPU on its own root.
    assert len(groups(ds.pcie_roots(ds.topology(P5)))) == 8
    roots = set(ds.pcie_roots(ds.topology(A4)).values())
    assert all(re.fullmatch(r"pci0000:[0-9a-f]{2}", r) for r in roots)


def small(matrix: list[list[str]]) -> dict[str, Any]:
    return {"apiVersion": "phalanx.io/v1alpha1", "kind": "NodeTopology", "node": "n",
            "gpus": [{"index": i} for i in range(3)], "nics": [{"name": "mlx5_0"}],
            "matrix": {n: row for n, row in zip(("GPU0", "GPU1", "GPU2", "mlx5_0"), matrix, strict=True)}}


def test_phb_is_the_same_host_bridge_and_node_is_not():
    t = ds.topology(small([["X", "PHB", "NODE", "PHB"], ["PHB", "X", "NODE", "PIX"],
                           ["NODE", "NODE", "X", "SYS"], ["PHB", "PIX", "SYS", "X"]]))
    assert groups(ds.pcie_roots(t)) == {frozenset({"GPU0", "GPU1", "mlx5_0"}), frozenset({"GPU2"})}


def test_relations_that_put_two_host_bridges_under_one_root_are_refused():
    t = ds.topology(small([["X", "NV1", "NODE", "PIX"], ["NV1", "X", "SYS", "SYS"],
                           ["NODE", "SYS", "X", "PIX"], ["PIX", "SYS", "PIX", "X"]]))
    with pytest.raises(ValueError, match="GPU0 and GPU2 are NODE"):
        ds.pcie_roots(t)


# --- slices ----------------------------------------------------------------------------------------
def test_a_gpu_is_published_as_nvidias_driver_publishes_it():
    t = ds.with_identity(DGX1V, "n1")
    (s,) = ds.gpu_slices("n1", t)
    check_pool([s], "n1", ds.GPU_DRIVER)
    assert s["metadata"]["name"] == "n1-gpu.nvidia.com-0"
    devices = s["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    gpu2 = devices[2]
    assert gpu2["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": t.gpus[2].uuid},
        "productName": {"string": "Tesla V100-SXM2-16GB"}, "brand": {"string": "Tesla"},
        "architecture": {"string": "Volta"}, "cudaComputeCapability": {"version": "7.0.0"},
        "driverVersion": {"version": "580.95.5"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": t.gpus[2].pci_bus_id},
        "resource.kubernetes.io/pcieRoot": {"string": ds.pcie_roots(t)["GPU2"]},
        "resource.kubernetes.io/numaNode": {"int": 0}}
    assert gpu2["capacity"] == {"memory": {"value": "16160Mi"}}
    assert [attr(d, "resource.kubernetes.io/numaNode") for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {attr(d, "uuid") for d in devices} == {g.uuid for g in t.gpus}


def test_facts_the_topology_lacks_come_from_the_model_or_the_caller():
    facts = ds.GpuFacts(driver_version="550.54.15", cuda_driver_version="12.4")
    (s,) = ds.gpu_slices("p5", P5, facts=facts)
    d = s["spec"]["devices"][0]
    assert (attr(d, "productName"), attr(d, "brand"), attr(d, "architecture")) == (
        "NVIDIA H100 80GB HBM3", "Nvidia", "Hopper")
    assert (attr(d, "cudaComputeCapability"), attr(d, "driverVersion"), attr(d, "cudaDriverVersion")) == (
        "9.0.0", "550.54.15", "12.4.0")


def test_an_unknown_numa_node_is_left_out_and_a_gpu_without_memory_has_no_capacity():
    doc = small([["X", "PIX", "SYS", "PIX"], ["PIX", "X", "SYS", "PIX"], ["SYS", "SYS", "X", "SYS"],
                 ["PIX", "PIX", "SYS", "X"]])
    (s,) = ds.gpu_slices("n", doc)
    check_pool([s], "n", ds.GPU_DRIVER)
    assert all("resource.kubernetes.io/numaNode" not in d["attributes"] and "capacity" not in d
               for d in s["spec"]["devices"])


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_every_example_gives_valid_pools(path):
    check_pool(ds.gpu_slices("n1", path), "n1", ds.GPU_DRIVER)
    check_pool(ds.gpu_slices("n1", path, mig_devices=True), "n1", ds.GPU_DRIVER)
    nics = ds.nic_slices("n1", path)
    if ds.topology(path).nics:
        check_pool(nics, "n1", ds.NIC_DRIVER)
    else:
        assert nics == []


def test_nics_share_their_gpus_pcie_root():
    t = ds.with_identity(A4, "a4")
    (gpus,) = ds.gpu_slices("a4", t)
    (nics,) = ds.nic_slices("a4", t)
    assert [d["name"] for d in nics["spec"]["devices"]] == [f"nic-{k}" for k in range(8)]
    root = {d["name"]: attr(d, "resource.kubernetes.io/pcieRoot") for d in gpus["spec"]["devices"] + nics["spec"]["devices"]}
    for k in range(4):
        assert root[f"gpu-{2 * k}"] == root[f"gpu-{2 * k + 1}"] == root[f"nic-{2 * k}"] == root[f"nic-{2 * k + 1}"]
    assert len(set(root.values())) == 4
    nic0 = nics["spec"]["devices"][0]
    assert (attr(nic0, "type"), attr(nic0, "rdmaDevice"), attr(nic0, "resource.kubernetes.io/numaNode")) == (
        "rdma", "mlx5_0", 0)
    assert attr(nic0, "resource.kubernetes.io/pciBusID") == t.nics[0].pci_bus_id


def test_dynamic_mig_publishes_a_counter_set_per_gpu_and_every_possible_mig_device():
    t = ds.with_identity(P5, "p5")
    slices = ds.gpu_slices("p5", t, mig_devices=True)
    check_pool(slices, "p5", ds.GPU_DRIVER)
    counters, *per_gpu = slices
    assert len(per_gpu) == 8 and "devices" not in counters["spec"]
    sets = {c["name"]: c["counters"] for c in counters["spec"]["sharedCounters"]}
    assert list(sets) == [f"gpu-{i}-counter-set" for i in range(8)]
    assert set(sets["gpu-0-counter-set"]) == {"multiprocessors", "copy-engines", "memory",
                                             *(f"memory-slice-{i}" for i in range(8))}
    gpu0 = {d["name"]: d for d in per_gpu[0]["spec"]["devices"]}
    # H100: 1g.10gb ×7 starts, 1g.20gb ×4, 2g.20gb ×3, 3g.40gb ×2, 4g.40gb, 7g.80gb, and the whole GPU.
    assert len(gpu0) == 19
    assert per_gpu[0]["spec"]["devices"][0]["name"] == "gpu-0"
    whole = gpu0["gpu-0"]
    assert whole["consumesCounters"] == [{"counterSet": "gpu-0-counter-set", "counters": sets["gpu-0-counter-set"]}]
    m = gpu0["gpu-0-mig-3g40gb-9-4"]
    assert {k: next(iter(v.values())) for k, v in m["attributes"].items()
            if k in ("type", "parentUUID", "profile", "productName")} == {
        "type": "mig", "parentUUID": t.gpus[0].uuid, "profile": "3g.40gb", "productName": "NVIDIA H100 80GB HBM3"}
    assert "uuid" not in m["attributes"]
    (use,) = m["consumesCounters"]
    assert {k for k in use["counters"] if k.startswith("memory-slice")} == {f"memory-slice-{i}" for i in (4, 5, 6, 7)}
    assert m["capacity"]["memory"] == {"value": "40Gi"}
    assert set(gpu0) >= {"gpu-0-mig-1g10gb-19-6", "gpu-0-mig-1g20gb-15-6", "gpu-0-mig-2g20gb-14-4",
                         "gpu-0-mig-4g40gb-5-0", "gpu-0-mig-7g80gb-0-0"}


def test_gpus_without_mig_stay_plain_devices_in_the_mig_layout():
    slices = ds.gpu_slices("dgx", DGX1V, mig_devices=True)
    assert all("sharedCounters" not in s["spec"] for s in slices)
    assert [[d["name"] for d in s["spec"]["devices"]] for s in slices] == [[f"gpu-{i}"] for i in range(8)]


def test_taints_land_on_the_named_devices_and_a_new_generation_is_published_whole():
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    slices = ds.gpu_slices("p5", P5, mig_devices=True, taints={"gpu-0": [taint], "gpu-1-mig-7g80gb-0-0": [taint]},
                           generation=3)
    check_pool(slices, "p5", ds.GPU_DRIVER)
    tainted = {d["name"] for s in slices for d in s["spec"].get("devices", ()) if d.get("taints")}
    assert tainted == {"gpu-0", "gpu-1-mig-7g80gb-0-0"}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}


def test_the_device_classes_are_the_helm_charts_and_one_for_the_nic_driver():
    classes = {c["metadata"]["name"]: c["spec"] for c in ds.device_classes()}
    assert classes == {
        "gpu.nvidia.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
            "extendedResourceName": "nvidia.com/gpu"},
        "mig.nvidia.com": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
        "rdma.example.com": {"selectors": [{"cel": {"expression": "device.driver == 'rdma.example.com'"}}]},
    }
    assert "extendedResourceName" not in ds.device_classes(extended_resource=False)[0]["spec"]
