"""NVLink groups and cliques, NIC affinity and NUMA layout, on the real fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx_topology import load_file, parse_topo_matrix
from phalanx_topology.groups import NumaDomain, closest_gpus, numa_layout, nvlink_cliques, nvlink_components

FIXTURES = Path(__file__).parent.parent / "fixtures" / "topology"


def fixture(name: str):
    return load_file(next(FIXTURES.glob(f"{name}*")))


ALL8 = tuple(f"GPU{i}" for i in range(8))


@pytest.mark.parametrize(("name", "components", "cliques"), [
    ("dgx1v", (ALL8,),
     (("GPU0", "GPU1", "GPU2", "GPU3"), ("GPU4", "GPU5", "GPU6", "GPU7"),
      ("GPU0", "GPU4"), ("GPU1", "GPU5"), ("GPU2", "GPU6"), ("GPU3", "GPU7"))),
    ("hgx-a100", (ALL8,), (ALL8,)),
    ("aws-p5", (ALL8,), (ALL8,)),
    ("pcie-8xL40S", tuple((g,) for g in ALL8), ()),
])
def test_nvlink_components_and_maximal_cliques_follow_the_matrix(name, components, cliques):
    topo = fixture(name)
    assert (nvlink_components(topo), nvlink_cliques(topo)) == (components, cliques)


def test_two_nvlink_islands_are_two_components():
    text = ("  GPU0 GPU1 GPU2 GPU3\n"
            "GPU0 X NV4 SYS SYS\nGPU1 NV4 X SYS SYS\nGPU2 SYS SYS X NV4\nGPU3 SYS SYS NV4 X\n")
    topo = parse_topo_matrix(text, node="n")
    assert nvlink_components(topo) == (("GPU0", "GPU1"), ("GPU2", "GPU3"))
    assert nvlink_cliques(topo) == (("GPU0", "GPU1"), ("GPU2", "GPU3"))


@pytest.mark.parametrize(("name", "nic", "closest"), [
    ("dgx1v", "mlx5_0", ("PIX", ("GPU2", "GPU3"))),
    ("hgx-a100", "mlx5_0", ("PXB", ("GPU2", "GPU3"))),
    ("gcp-a4", "NIC0", ("PIX", ("GPU0", "GPU1"))),
    ("gcp-a4", "NIC7", ("PIX", ("GPU6", "GPU7"))),
    ("pcie-8xRTX4090", "NIC1", ("PHB", ("GPU6",))),
    ("pcie-8xL40S", "NIC0", ("SYS", ALL8)),
])
def test_a_nic_is_closest_to_the_gpus_at_its_best_relation(name, nic, closest):
    assert closest_gpus(fixture(name), nic) == closest


def test_the_numa_layout_lists_each_domain_with_its_gpus_and_nics_unknown_last():
    assert numa_layout(fixture("hgx-a100")) == (
        NumaDomain(id=1, gpus=("GPU2", "GPU3"), nics=("mlx5_0",)),
        NumaDomain(id=3, gpus=("GPU0", "GPU1"), nics=()),
        NumaDomain(id=5, gpus=("GPU6", "GPU7"), nics=()),
        NumaDomain(id=7, gpus=("GPU4", "GPU5"), nics=()))
    assert numa_layout(fixture("pcie-8xL40S"))[-1] == NumaDomain(id=-1, gpus=(), nics=("NIC0",))
