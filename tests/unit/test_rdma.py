"""GPU + RDMA NIC joint placement (R7): the four-level fallback on the NIC-bearing fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx_engine.gpuset import GpuChoice, GpuSetScore, NoChoice
from phalanx_engine.rdma import GpuNic, RdmaChoice, RdmaLevel, choose_gpus_and_nics, pair_level
from phalanx_proto.topology import NodeTopology
from phalanx_topology import load_file


def cases(*rows: tuple) -> list:
    """Parametrize rows whose first item is the case sentence; the sentence is the test id."""
    return [pytest.param(*row, id=row[0]) for row in rows]


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
V100 = "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
B200 = "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt"
A100 = "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt"
L40S = "pcie-8xL40S_node-sys_nccl-tests-issue273.txt"
RTX4090 = "pcie-8xRTX4090_allSYS_go-gpuallocator-issue17.txt"
H100 = "aws-p5.48xlarge_8xH100_NV18.txt"
ALL = frozenset(range(8))
EPYC_SOCKETS = {1: 0, 3: 0, 5: 1, 7: 1}  # pleiades: 2x EPYC 7763, GPUs on NUMA 1, 3 (socket 0) and 5, 7

PCIE, NUMA, SOCKET, CROSS = RdmaLevel.PCIE_SWITCH, RdmaLevel.NUMA, RdmaLevel.SOCKET, RdmaLevel.CROSS_SOCKET

_NODES: dict[str, NodeTopology] = {}


def node(fixture: str) -> NodeTopology:
    if fixture not in _NODES:
        _NODES[fixture] = load_file(FIXTURES / fixture)
    return _NODES[fixture]


def test_rdma_levels_have_stable_names_in_fallback_order() -> None:
    assert [(lv.value, lv.rank) for lv in RdmaLevel] == [
        ("pcie-switch", 0), ("numa", 1), ("socket", 2), ("cross-socket", 3)]


def test_rdma_one_gpu_on_the_v100_node_is_the_whole_expected_value() -> None:
    assert choose_gpus_and_nics(node(V100), ALL, 1) == RdmaChoice(
        gpus=GpuChoice(gpus=(2,), ring=(2,), exact=True,
                       score=GpuSetScore(ring_link="", pair_nvlinks=0, pair_class_sum=0, pair_same_numa=0,
                                         leftover_nvlinks=18, leftover_class_sum=60, leftover_same_numa=9)),
        nics=("mlx5_0",), level=PCIE,
        pairs=(GpuNic(gpu=2, nic="mlx5_0", relation="PIX", level=PCIE),))


CASES = [
    # (sentence, fixture, free, count, keyword args, gpus, nics, level)
    ("on the V100 node two GPUs share the NIC's PCIe switch and an NV2 link", V100, ALL, 2, {}, (2, 3), ("mlx5_0",),
     PCIE),
    ("on the V100 node four GPUs fall back to the NIC's NUMA node", V100, ALL, 4, {}, (0, 1, 2, 3), ("mlx5_0",), NUMA),
    ("on the V100 node eight GPUs reach across sockets", V100, ALL, 8, {}, tuple(range(8)), ("mlx5_0",), CROSS),
    ("on the V100 node a busy GPU 3 moves the pair to the NUMA level", V100, ALL - {3}, 2, {}, (1, 2), ("mlx5_0",),
     NUMA),
    ("on the B200 node each GPU of a pair gets its own PIX NIC", B200, ALL, 2, {}, (0, 1), ("NIC0", "NIC1"), PCIE),
    ("on the B200 node four GPUs use the four NICs of their two switches", B200, ALL, 4, {}, (0, 1, 2, 3),
     ("NIC0", "NIC1", "NIC2", "NIC3"), PCIE),
    ("on the B200 node eight GPUs are rail-aligned with eight NICs", B200, ALL, 8, {}, tuple(range(8)),
     tuple(f"NIC{i}" for i in range(8)), PCIE),
    ("on the B200 node only free NICs are used", B200, ALL, 2, {"free_nics": {"NIC4", "NIC5", "NIC6", "NIC7"}},
     (4, 5), ("NIC4", "NIC5"), PCIE),
    ("on the B200 node two GPUs share the one free NIC of their switch", B200, ALL, 2, {"free_nics": {"NIC0"}},
     (0, 1), ("NIC0",), PCIE),
    ("on the B200 node GPUs on two switches each get their own NIC", B200, {0, 2, 4, 6}, 2, {}, (0, 2),
     ("NIC0", "NIC2"), PCIE),
    ("on the A100 node a pair sits under the NIC's PCIe bridges", A100, ALL, 2, {}, (2, 3), ("mlx5_0",), PCIE),
    ("on the A100 node four GPUs without a socket map reach across sockets", A100, ALL, 4, {}, (0, 1, 2, 3),
     ("mlx5_0",), CROSS),
    ("on the A100 node four GPUs with a socket map stay on the NIC's socket", A100, ALL, 4,
     {"numa_sockets": EPYC_SOCKETS}, (0, 1, 2, 3), ("mlx5_0",), SOCKET),
    ("on the RTX 4090 node one GPU takes the GPU behind the NIC's host bridge", RTX4090, ALL, 1, {}, (6,),
     ("NIC0",), NUMA),
    ("on the RTX 4090 node a pair keeps the host-bridge GPU and stays on its NUMA id", RTX4090, ALL, 2, {}, (4, 6),
     ("NIC0", "NIC1"), SOCKET),
    ("on the L40S node the only NIC is across the sockets from every GPU", L40S, ALL, 1, {}, (0,), ("NIC0",), CROSS),
]


@pytest.mark.parametrize(("case", "fixture", "free", "count", "kw", "gpus", "nics", "level"), CASES,
                         ids=[c[0] for c in CASES])
def test_rdma_joint_placement_reaches_the_expected_level(case: str, fixture: str, free: set[int], count: int,
                                                         kw: dict, gpus: tuple[int, ...], nics: tuple[str, ...],
                                                         level: RdmaLevel) -> None:
    choice = choose_gpus_and_nics(node(fixture), set(free), count, **kw)
    assert isinstance(choice, RdmaChoice)
    assert (choice.gpus.gpus, choice.nics, choice.level) == (gpus, nics, level)


def test_rdma_pairs_name_each_gpus_nic_relation_and_level() -> None:
    choice = choose_gpus_and_nics(node(V100), ALL, 4)
    assert isinstance(choice, RdmaChoice)
    assert choice.pairs == (
        GpuNic(gpu=0, nic="mlx5_0", relation="NODE", level=NUMA),
        GpuNic(gpu=1, nic="mlx5_0", relation="NODE", level=NUMA),
        GpuNic(gpu=2, nic="mlx5_0", relation="PIX", level=PCIE),
        GpuNic(gpu=3, nic="mlx5_0", relation="PIX", level=PCIE),
    )


@pytest.mark.parametrize(("case", "fixture", "gpu", "nic", "sockets", "level"), cases(
    ("PIX is the same PCIe switch", V100, 2, "mlx5_0", None, PCIE),
    ("PXB is the same PCIe switch tree", A100, 3, "mlx5_0", None, PCIE),
    ("NODE is the same NUMA node", V100, 0, "mlx5_0", None, NUMA),
    ("PHB is the same NUMA node", RTX4090, 6, "NIC1", None, NUMA),
    ("SYS on one NUMA id is the same socket", RTX4090, 4, "NIC0", None, SOCKET),
    ("SYS between NUMA nodes the map puts on one socket is the same socket", A100, 0, "mlx5_0", EPYC_SOCKETS,
     SOCKET),
    ("SYS between sockets is cross-socket", A100, 4, "mlx5_0", EPYC_SOCKETS, CROSS),
    ("SYS without a socket map is cross-socket", V100, 4, "mlx5_0", None, CROSS),
))
def test_rdma_pair_level_follows_the_relation(case: str, fixture: str, gpu: int, nic: str,
                                              sockets: dict[int, int] | None, level: RdmaLevel) -> None:
    assert pair_level(node(fixture), gpu, nic, numa_sockets=sockets) is level


@pytest.mark.parametrize(("case", "fixture", "free", "count", "kw", "expected"), cases(
    ("a node without NICs has no RDMA placement", H100, ALL, 2, {},
     NoChoice(code="no-rdma-nic", reasons=("node aws-p5.48xlarge_8xH100_NV18 has no RDMA NIC",))),
    ("a node whose NICs are all taken has no RDMA placement", V100, ALL, 2, {"free_nics": set()},
     NoChoice(code="no-rdma-nic", reasons=("node dgx1v-like_8xV100-SXM2_mlx5_oneflow has no free RDMA NIC",))),
    ("too few free GPUs do not fit at any level", V100, {0, 1}, 3, {},
     NoChoice(code="not-enough-free-gpus", reasons=("3 GPUs asked, 2 free",))),
    ("a busy required GPU does not fit", V100, {0, 1}, 2, {"require": {3}},
     NoChoice(code="required-gpu-not-free", reasons=("required GPUs [3] are not free",))),
))
def test_rdma_no_fit_says_why(case: str, fixture: str, free: set[int], count: int, kw: dict,
                              expected: NoChoice) -> None:
    assert choose_gpus_and_nics(node(fixture), set(free), count, **kw) == expected


def test_rdma_a_required_far_gpu_drags_the_group_to_its_level() -> None:
    choice = choose_gpus_and_nics(node(V100), ALL, 2, {4})
    assert isinstance(choice, RdmaChoice)
    assert (choice.gpus.gpus, choice.level) == ((4, 7), CROSS)


def test_rdma_caller_bugs_raise() -> None:
    with pytest.raises(ValueError, match="count must be at least 1"):
        choose_gpus_and_nics(node(V100), ALL, 0)
    with pytest.raises(ValueError, match="GPU index 9"):
        choose_gpus_and_nics(node(V100), {9}, 1)
    with pytest.raises(KeyError):
        pair_level(node(V100), 0, "mlx5_9")
