"""Preferring the best-connected GPUs among valid DRA allocations (``phalanx_engine.dra.rank``) on
real ``nvidia-smi topo -m`` topologies: devices joined to topology GPUs by UUID or PCI address,
k-sets tried NVLink-best first, a NIC following its GPU through ``pcieRoot``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import msgspec
import pytest
from dra_builders import (
    MIG_CLASS,
    NIC_CLASS,
    NVIDIA,
    claim,
    gpu_pool,
    match,
    nic_pool,
    on,
    pci,
    pool,
    request,
    slice_,
)

from phalanx_engine.dra import Allocation, Ranking, Refusal, Usage, allocate, gather, pci_address
from phalanx_engine.snapshot import NodeView, Snapshot
from phalanx_proto.dra import (
    AllocatedDevice,
    AttrValue,
    ClaimAllocated,
    ClaimAllocation,
    Device,
    DeviceClassRef,
    DraPool,
    PodClaim,
)
from phalanx_proto.events import Assignment, PodRef
from phalanx_proto.topology import NodeTopology
from phalanx_topology import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
ROOT = "resource.kubernetes.io/pcieRoot"


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


def topology(fixture: str) -> NodeTopology:
    """A fixture with the GPU UUIDs and PCI addresses the DRA builders publish (nvidia-smi's
    8-digit PCI domain, as NVML reports it, on odd GPUs)."""
    t = load_file(FIXTURES / fixture, node="n1")
    gpus = tuple(msgspec.structs.replace(g, uuid=f"GPU-{g.index:08d}",
                                         pci_bus_id=("0000" if g.index % 2 else "") + pci(g.index).upper())
                 for g in t.gpus)
    return msgspec.structs.replace(t, gpus=gpus)


V100 = topology("dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt")  # hybrid cube mesh, NIC under GPUs 2 and 3
H100 = topology("aws-p5.48xlarge_8xH100_NV18.txt")


def run(claims: list, pools: list[DraPool], topo: NodeTopology, *, connected: bool = True):
    return allocate(claims, gather(pools, "n1"), Usage(pools), Ranking(topo, connected=connected))


def devices(result) -> list[str]:
    assert isinstance(result, Allocation), result
    return [d.device for c in result.claims for d in c.allocation.devices]


@pytest.mark.parametrize("case,count,in_use,first_fit,ranked", cases(
    ("4 GPUs with GPU 1 busy: first-fit breaks both quads, ranking takes the whole second quad", 4, ["gpu-1"],
     ["gpu-0", "gpu-2", "gpu-3", "gpu-4"], ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]),
    ("2 GPUs: first-fit takes an NV1 pair, ranking an NV2 pair", 2, [],
     ["gpu-0", "gpu-1"], ["gpu-0", "gpu-3"]),
    ("3 GPUs: ranking takes the triangle with two NV2 links", 3, [],
     ["gpu-0", "gpu-1", "gpu-2"], ["gpu-0", "gpu-2", "gpu-3"]),
    ("a pair keeps the other quad whole when GPU 0 is busy", 2, ["gpu-0"],
     ["gpu-1", "gpu-2"], ["gpu-2", "gpu-3"]),
))
def test_gpus_on_the_v100_cube_mesh(case: str, count: int, in_use: list, first_fit: list, ranked: list) -> None:
    pools = [gpu_pool("n1", in_use=in_use)]
    c = [claim("c", request("gpu", count=count))]
    assert (devices(run(c, pools, V100, connected=False)), devices(run(c, pools, V100))) == (first_fit, ranked)


def test_the_result_names_the_topology_gpus() -> None:
    got = run([claim("c", request("gpu", count=4))], [gpu_pool("n1", in_use=["gpu-1"])], V100)
    assert isinstance(got, Allocation)
    assert (got.gpus, got.claims[0].gpus) == ((4, 5, 6, 7), (4, 5, 6, 7))


def test_a_gpu_and_the_nic_under_it() -> None:
    # mlx5_0 sits under GPUs 2 and 3 (PIX): its pcieRoot is theirs.
    pools = [gpu_pool("n1"), nic_pool("n1", 1, roots=["pci0000:40"])]
    c = [claim("c", request("gpu", count=2), request("nic", NIC_CLASS), constraints=[match(ROOT)])]
    got = run(c, pools, V100)
    assert devices(got) == ["gpu-2", "gpu-3", "nic-0"]
    assert got.gpus == (2, 3)


def test_one_gpu_follows_the_nic_and_keeps_the_best_pair_free() -> None:
    # GPUs 2 and 3 are both under the NIC; taking 2 leaves 3 with 0 and 1 (NV2, NV1) and
    # taking 3 leaves 2 likewise: the tie goes to the lower index.
    pools = [gpu_pool("n1"), nic_pool("n1", 1, roots=["pci0000:40"])]
    c = [claim("c", request("gpu"), request("nic", NIC_CLASS), constraints=[match(ROOT)])]
    assert devices(run(c, pools, V100)) == ["gpu-2", "nic-0"]


def test_on_an_nvswitch_node_every_set_is_as_good_so_the_lowest_free_gpus_win() -> None:
    got = run([claim("c", request("gpu", count=4))], [gpu_pool("n1", in_use=["gpu-1", "gpu-6"])], H100)
    assert devices(got) == ["gpu-0", "gpu-2", "gpu-3", "gpu-4"]


def test_mig_devices_keep_upstreams_order_and_report_their_gpu() -> None:
    got = run([claim("c", request("m", MIG_CLASS, count=2,
                                  selectors=["device.attributes['gpu.nvidia.com'].profile == '7g.80gb'"]))],
              [gpu_pool("n1", 8, mig=True)], V100)
    assert devices(got) == ["gpu-0-mig-7g80gb-0", "gpu-1-mig-7g80gb-0"]
    assert got.gpus == (0, 1)


def test_a_device_of_another_driver_joins_by_pci_address() -> None:
    other = pool("gpu.example.com", "n1", slice_("s", *[
        Device(name=f"acc-{i}", attributes={"resource.kubernetes.io/pciBusID": AttrValue(string=pci(i))})
        for i in range(8)], nodes=on("n1")), in_use=[])
    got = run([claim("c", request("a", DeviceClassRef(name="any"), count=2))], [other], V100)
    assert devices(got) == ["acc-0", "acc-3"]
    assert got.gpus == (0, 3)


def test_a_gpu_unknown_to_the_topology_keeps_upstreams_order() -> None:
    stranger = pool(NVIDIA, "n1", slice_("s", *[
        Device(name=f"gpu-{i}", attributes={"type": AttrValue(string="gpu"), "uuid": AttrValue(string=f"GPU-x{i}")})
        for i in range(4)], nodes=on("n1")))
    got = run([claim("c", request("gpu", count=2))], [stranger], V100)
    assert (devices(got), got.gpus) == (["gpu-0", "gpu-1"], ())


@pytest.mark.parametrize("case,text,want", cases(
    ("the canonical form stays", "0000:65:00.0", "0000:65:00.0"),
    ("nvidia-smi's 8-digit domain", "00000000:65:00.0", "0000:65:00.0"),
    ("upper case", "0000:6A:00.0", "0000:6a:00.0"),
    ("no domain", "65:00.0", "0000:65:00.0"),
    ("not an address", "bogus", "bogus"),
))
def test_pci_addresses_are_compared_in_one_form(case: str, text: str, want: str) -> None:
    assert pci_address(text) == want


def test_ranking_does_not_lose_a_solution_a_constraint_needs() -> None:
    # Only GPUs 6 and 7 share the NIC's root: the NVLink-best pairs all fail the constraint.
    pools = [gpu_pool("n1"), nic_pool("n1", 1, roots=["pci0000:c0"])]
    c = [claim("c", request("gpu", count=2), request("nic", NIC_CLASS), constraints=[match(ROOT)])]
    assert devices(run(c, pools, V100)) == ["gpu-6", "gpu-7", "nic-0"]


def test_devices_on_no_gpu_are_not_ranked() -> None:
    got = run([claim("c", request("nic", NIC_CLASS, count=2))], [nic_pool("n1", 4)], V100)
    assert devices(got) == ["nic-0", "nic-1"]
    assert got.gpus == ()


def test_the_benchmark_runs_and_shows_ranking_take_the_whole_quad(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("dra_allocator_bench", FIXTURES.parents[2] / "bench" / "dra_allocator.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "(0, 2, 3, 4) -> (4, 5, 6, 7)" in out


def test_the_package_docstrings_way_of_calling_it_places_a_gang_member_after_member() -> None:
    held = ClaimAllocated(claim="x/y/z", allocation=ClaimAllocation(devices=(
        AllocatedDevice(request="gpu", driver=NVIDIA, pool="n1", device="gpu-1"),)))
    view = NodeView(name="n1", topology=V100, dra=(gpu_pool("n1"), nic_pool("n1", 8)),
                    allocations=(Assignment(pod=PodRef(namespace="x", name="p", uid="u"), node="n1", claims=(held,)),))
    snapshot = Snapshot(nodes=(view,))
    usage = Usage([p for v in snapshot.nodes for p in v.dra],
                  [c for v in snapshot.nodes for a in v.allocations for c in a.claims])
    devices_of = {view.name: gather(view.dra, view.name, view.kube.labels if view.kube else {})}
    ranking_of = {view.name: Ranking(view.topology)}
    trial = usage.copy()
    placed = []
    for m in range(3):
        got = allocate([PodClaim(name="gpus", claim=claim(f"m{m}", request("gpu", count=2)))], devices_of["n1"], trial,
                       ranking_of["n1"])
        assert not isinstance(got, Refusal), got
        trial.add_allocated(got.claims)
        placed.append(got.gpus)
    assert placed == [(2, 3), (5, 6), (4, 7)]  # NV2 pairs, GPU 1 being held
    assert not usage.exclusive((NVIDIA, "n1", "gpu-4"))
