"""The ``nvidia-smi topo -m`` parser on real outputs (tests/fixtures/topology) and on every
kind of malformed matrix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology import TopologyParseError, load_file, parse_topo_matrix
from phalanx_topology.model import detect_nvswitch

FIXTURES = Path(__file__).parent.parent / "fixtures" / "topology"
DGX1V = "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
HGX_A100 = "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt"
P5_H100 = "aws-p5.48xlarge_8xH100_NV18.txt"
A4_B200 = "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt"
L40S = "pcie-8xL40S_node-sys_nccl-tests-issue273.txt"
RTX4090 = "pcie-8xRTX4090_allSYS_go-gpuallocator-issue17.txt"
ALL = [DGX1V, HGX_A100, P5_H100, A4_B200, L40S, RTX4090]


def parsed(fixture: str) -> NodeTopology:
    return load_file(FIXTURES / fixture)


@pytest.mark.parametrize("fixture", ALL)
def test_every_fixture_keeps_its_source_line_and_parses_into_a_symmetric_complete_matrix(fixture):
    text = (FIXTURES / fixture).read_text()
    assert text.startswith("# SOURCE:")
    topo = parse_topo_matrix(text, node="n1", source=f"topo-matrix:{fixture}")
    names = [g.name for g in topo.gpus] + [n.name for n in topo.nics]
    assert sorted(topo.relations) == sorted(names)
    for a in names:
        assert sorted(topo.relations[a]) == sorted(set(names) - {a})
        for b in topo.relations[a]:
            assert topo.relations[a][b] == topo.relations[b][a]
    assert topo.source == f"topo-matrix:{fixture}"


RELATIONS = [
    # fixture, a, b, relation
    (DGX1V, "GPU0", "GPU3", "NV2"),
    (DGX1V, "GPU0", "GPU1", "NV1"),
    (DGX1V, "GPU0", "GPU5", "SYS"),
    (DGX1V, "GPU0", "GPU4", "NV2"),
    (DGX1V, "mlx5_0", "GPU2", "PIX"),
    (DGX1V, "mlx5_0", "GPU0", "NODE"),
    (DGX1V, "mlx5_0", "GPU7", "SYS"),
    (HGX_A100, "GPU0", "GPU7", "NV12"),
    (HGX_A100, "mlx5_0", "GPU2", "PXB"),
    (HGX_A100, "mlx5_0", "GPU3", "PXB"),
    (HGX_A100, "mlx5_0", "GPU0", "SYS"),
    (P5_H100, "GPU3", "GPU4", "NV18"),
    (A4_B200, "GPU0", "NIC0", "PIX"),
    (A4_B200, "GPU0", "NIC2", "NODE"),
    (A4_B200, "GPU0", "NIC4", "SYS"),
    (A4_B200, "NIC0", "NIC1", "PIX"),
    (A4_B200, "NIC0", "NIC2", "NODE"),
    (A4_B200, "NIC6", "GPU7", "PIX"),
    (A4_B200, "GPU5", "GPU6", "NV18"),
    (L40S, "GPU0", "GPU1", "NODE"),
    (L40S, "GPU0", "GPU4", "SYS"),
    (L40S, "NIC0", "GPU5", "SYS"),
    (RTX4090, "GPU0", "GPU1", "SYS"),
    (RTX4090, "GPU4", "GPU5", "SYS"),
    (RTX4090, "GPU6", "NIC0", "PHB"),
    (RTX4090, "GPU7", "NIC1", "SYS"),
    (RTX4090, "NIC0", "NIC1", "PIX"),
]


@pytest.mark.parametrize(("fixture", "a", "b", "relation"), RELATIONS,
                         ids=[f"{f.split('_')[0]}-{a}-{b}-is-{r}" for f, a, b, r in RELATIONS])
def test_a_fixture_pair_has_the_relation_the_file_shows_in_both_directions(fixture, a, b, relation):
    topo = parsed(fixture)
    assert (topo.relation(a, b), topo.relation(b, a)) == (relation, relation)


FACTS = [
    # fixture, GPU NUMA ids, {nic: (device, numa)}, nvswitch
    (DGX1V, [0, 0, 0, 0, 1, 1, 1, 1], {"mlx5_0": ("mlx5_0", 0)}, False),
    (HGX_A100, [3, 3, 1, 1, 7, 7, 5, 5], {"mlx5_0": ("mlx5_0", 1)}, True),
    (P5_H100, [0, 0, 0, 0, 1, 1, 1, 1], {}, True),
    (A4_B200, [0, 0, 0, 0, 1, 1, 1, 1], {f"NIC{i}": (f"mlx5_{i}", 0 if i < 4 else 1) for i in range(8)}, True),
    (L40S, [0, 0, 0, 0, 1, 1, 1, 1], {"NIC0": ("", -1)}, False),
    (RTX4090, [0, 0, 0, 0, 1, 1, 1, 1], {"NIC0": ("", 1), "NIC1": ("", 1)}, False),
]


@pytest.mark.parametrize(("fixture", "numa", "nics", "nvswitch"), FACTS, ids=[f[0].split("_")[0] for f in FACTS])
def test_a_fixture_gives_the_numa_layout_nic_devices_and_fabric_it_shows(fixture, numa, nics, nvswitch):
    topo = parsed(fixture)
    assert [g.numa for g in topo.gpus] == numa
    assert [g.index for g in topo.gpus] == list(range(8))
    assert {n.name: (n.device, n.numa) for n in topo.nics} == nics
    assert topo.nvswitch is nvswitch


def test_the_cpu_affinity_column_is_kept_per_gpu():
    assert [g.cpu_affinity for g in parsed(DGX1V).gpus] == ["0-11,24-35"] * 4 + ["12-23,36-47"] * 4
    assert [g.cpu_affinity for g in parsed(HGX_A100).gpus][::2] == ["48-63", "16-31", "112-127", "80-95"]


def test_a_small_tab_separated_matrix_parses_into_exactly_this_model():
    text = ("# SOURCE: made up for this test\n"
            "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV4\tPIX\t0-7\t0\t\tN/A\n"
            "GPU1\tNV4\t X \tSYS\t8-15\t1\t\tN/A\n"
            "mlx5_0\tPIX\tSYS\t X \n"
            "\n"
            "Legend:\n"
            "  X    = Self\n")
    assert parse_topo_matrix(text, node="n1", source="s") == NodeTopology(
        node="n1", source="s", nvswitch=False,
        gpus=(Gpu(index=0, name="GPU0", numa=0, cpu_affinity="0-7"),
              Gpu(index=1, name="GPU1", numa=1, cpu_affinity="8-15")),
        nics=(Nic(name="mlx5_0", device="mlx5_0", numa=0),),
        relations={"GPU0": {"GPU1": "NV4", "mlx5_0": "PIX"},
                   "GPU1": {"GPU0": "NV4", "mlx5_0": "SYS"},
                   "mlx5_0": {"GPU0": "PIX", "GPU1": "SYS"}})


def test_without_a_numa_column_devices_with_one_cpu_affinity_share_a_domain_in_order_of_appearance():
    text = ("   GPU0  GPU1  GPU2  CPU Affinity\n"
            "GPU0  X   SYS   NODE  8-15\n"
            "GPU1 SYS   X    SYS   0-7\n"
            "GPU2 NODE SYS   X     8-15\n")
    assert [g.numa for g in parse_topo_matrix(text, node="n").gpus] == [0, 1, 0]


def test_without_any_affinity_column_every_numa_id_is_unknown():
    text = "  GPU0 GPU1\nGPU0 X PIX\nGPU1 PIX X\n"
    topo = parse_topo_matrix(text, node="n")
    assert [(g.numa, g.cpu_affinity) for g in topo.gpus] == [(-1, ""), (-1, "")]


def test_the_legacy_soc_relation_reads_as_sys():
    topo = parse_topo_matrix("  GPU0 GPU1\nGPU0 X SOC\nGPU1 SOC X\n", node="n")
    assert topo.relation("GPU0", "GPU1") == "SYS"


def test_comment_lines_inside_the_table_are_ignored():
    text = "# SOURCE: x\n  GPU0 GPU1\nGPU0 X NV2\n# a note\nGPU1 NV2 X\n"
    assert parse_topo_matrix(text, node="n").relation("GPU1", "GPU0") == "NV2"


def _uniform(n: int, relation: str) -> dict[str, dict[str, str]]:
    names = [f"GPU{i}" for i in range(n)]
    return {a: {b: relation for b in names if b != a} for a in names}


@pytest.mark.parametrize(("case", "n", "relation", "fabric"), [
    ("8 GPUs all NV12 (HGX A100) are a fabric", 8, "NV12", True),
    ("8 GPUs all NV18 (H100, B200) are a fabric", 8, "NV18", True),
    ("4 GPUs all NV4 (a direct mesh of 12 links each) are not", 4, "NV4", False),
    ("4 GPUs all NV6 (H100 4-GPU board, 18 direct links) are not", 4, "NV6", False),
    ("2 GPUs joined by an NVLink bridge are not", 2, "NV4", False),
    ("8 GPUs all on PCIe are not", 8, "SYS", False),
    ("1 GPU is not", 1, "NV18", False),
])
def test_nvswitch_is_detected_only_when_the_uniform_bundle_cannot_be_direct_links(case, n, relation, fabric):
    names = [f"GPU{i}" for i in range(n)]
    assert detect_nvswitch(names, _uniform(n, relation)) is fabric


def test_the_dgx1v_hybrid_cube_mesh_is_not_a_fabric():
    topo = parsed(DGX1V)
    assert detect_nvswitch([g.name for g in topo.gpus], topo.relations) is False


GOOD = ("# SOURCE: test\n"
        "        GPU0    GPU1    mlx5_0  CPU Affinity    NUMA Affinity\n"
        "GPU0     X      NV1     PIX     0-7     0\n"
        "GPU1    NV1      X      PHB     0-7     0\n"
        "mlx5_0  PIX     PHB      X\n")


def _edit(old: str, new: str, text: str = GOOD) -> str:
    assert old in text
    return text.replace(old, new, 1)


MALFORMED = [
    ("a missing cell",
     _edit("GPU1    NV1      X      PHB", "GPU1    NV1      X"),
     "line 4: row 'GPU1' has 4 cells, expected 5 (3 devices + CPU Affinity, NUMA Affinity)"),
    ("a missing cell in a NIC row",
     _edit("mlx5_0  PIX     PHB      X", "mlx5_0  PIX      X"),
     "line 5: row 'mlx5_0' has 2 cells, expected 3 (one per device) or 5 (3 devices + CPU Affinity, NUMA Affinity)"),
    ("an asymmetric relation",
     _edit("GPU1    NV1 ", "GPU1    NV2 "),
     "line 4: GPU0–GPU1 is NV1 on line 3 but GPU1–GPU0 is NV2 (the matrix must be symmetric)"),
    ("fused column names",
     _edit("GPU0    GPU1 ", "GPU0GPU1     "),
     "line 2: column name 'GPU0GPU1' looks like several names run together"),
    ("fused NIC column names",
     _edit("GPU1    mlx5_0", "GPU1    mlx5_0mlx5_1"),
     "line 2: column name 'mlx5_0mlx5_1' looks like several names run together"),
    ("a row that is not a device",
     _edit("mlx5_0  PIX", "mlx5_9  PIX"),
     "line 5: row 'mlx5_9' is not a device of the header (GPU0 GPU1 mlx5_0)"),
    ("an unknown relation string",
     _edit("GPU0     X      NV1     PIX", "GPU0     X      NV1     QPI"),
     "line 3: GPU0–mlx5_0 has unknown relation 'QPI'"),
    ("a zero NVLink count",
     _edit("GPU0     X      NV1 ", "GPU0     X      NV0 "),
     "line 3: GPU0–GPU1 has unknown relation 'NV0'"),
    ("a diagonal that is not X",
     _edit("GPU0     X ", "GPU0    PIX"),
     "line 3: GPU0–GPU0 is the diagonal and must be 'X', not 'PIX'"),
    ("an X off the diagonal",
     _edit("mlx5_0  PIX ", "mlx5_0  X   "),
     "line 5: mlx5_0–GPU0 is 'X' (self) off the diagonal"),
    ("a row given twice",
     _edit("mlx5_0  PIX     PHB      X\n", "GPU1    NV1      X      PHB     0-7     0\n"),
     "line 5: row 'GPU1' appears twice (first on line 4)"),
    ("a device column without a row",
     _edit("mlx5_0  PIX     PHB      X\n", ""),
     "line 4: the matrix ends without a row for mlx5_0"),
    ("a column given twice",
     _edit("GPU1    mlx5_0", "GPU1    GPU1  "),
     "line 2: column 'GPU1' appears twice"),
    ("a header without GPUs",
     "  mlx5_0 mlx5_1\nmlx5_0 X PIX\nmlx5_1 PIX X\n",
     "line 1: the header has no GPU column"),
    ("a word that is not a device in the header",
     _edit("GPU1    mlx5_0", "GPU1    Foo   "),
     "line 2: 'Foo' is not a device name"),
    ("a column after the affinity columns",
     _edit("NUMA Affinity", "NUMA Affinity  GPU2"),
     "line 2: column 'GPU2' comes after the affinity columns"),
    ("a cpu affinity that is not a cpu list",
     _edit("PIX     0-7", "PIX     0-x"),
     "line 3: CPU Affinity: '0-x' is not a CPU list"),
    ("a numa affinity that is not a number",
     _edit("0-7     0\nGPU1", "0-7     zero\nGPU1"),
     "line 3: NUMA Affinity is 'zero', expected a NUMA node number below 1024 or N/A"),
    ("a numa affinity in Arabic-Indic digits is not a number",
     _edit("0-7     0\nGPU1", "0-7     ٣\nGPU1"),
     "line 3: NUMA Affinity is '٣', expected a NUMA node number below 1024 or N/A"),
    ("an NVLink count of NV99999999999999999999 is bounded",
     _edit("GPU0     X      NV1 ", "GPU0     X      NV99999999999999999999 "),
     "line 3: GPU0–GPU1 is 'NV99999999999999999999': a GPU pair has at most 18 NVLinks (the most one GPU has)"),
    ("NV19 is more links than a GPU has", _edit("GPU0     X      NV1 ", "GPU0     X      NV19 "),
     "line 3: GPU0–GPU1 is 'NV19': a GPU pair has at most 18 NVLinks (the most one GPU has)"),
    ("a GPU index in Arabic-Indic digits is not a GPU name",
     _edit("        GPU0    GPU1", "        GPU٠    GPU1"),
     "line 2: column name 'GPU٠' looks like several names run together"),
    ("a GPU index of 64 is beyond any node", _edit("        GPU0    GPU1", "        GPU64    GPU1"),
     "line 2: 'GPU64': a GPU index is below 64 (no node has more GPUs)"),
    ("a CPU affinity too wide to expand is refused before it is expanded",
     _edit("0-7     0\nGPU1", "0-99999999999     0\nGPU1"),
     "line 3: CPU Affinity: '0-99999999999' is not a CPU list"),
    ("a CPU id beyond Linux's largest is refused", _edit("0-7     0\nGPU1", "0-8192     0\nGPU1"),
     "line 3: CPU Affinity: '0-8192' names CPU 8192: CPU ids are below 8192 (Linux's largest NR_CPUS)"),
    ("an empty text",
     "# SOURCE: nothing\n\n",
     "line 1: no matrix found"),
    ("a NIC legend for a NIC that is not in the matrix",
     "  GPU0 NIC0\nGPU0 X PIX\nNIC0 PIX X\n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC5: mlx5_5\n",
     "line 8: NIC Legend names 'NIC5', which is not a column of the matrix"),
]


@pytest.mark.parametrize(("case", "text", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_matrix_raises_one_parse_error_naming_the_line_and_the_problem(case, text, message):
    with pytest.raises(TopologyParseError, match="^" + re.escape(message)):
        parse_topo_matrix(text, node="n")


def test_the_parse_error_is_a_value_error():
    assert issubclass(TopologyParseError, ValueError)


@pytest.mark.parametrize("fixture", ALL)
def test_any_single_damaged_token_either_parses_or_raises_the_parse_error_never_another(fixture):
    """Every cell of every line replaced by garbage, or deleted, one at a time."""
    lines = (FIXTURES / fixture).read_text().splitlines()
    for i, line in enumerate(lines):
        tokens = line.split()
        for j in range(len(tokens)):
            for replacement in ("??", ""):
                damaged = " ".join(tokens[:j] + ([replacement] if replacement else []) + tokens[j + 1:])
                text = "\n".join(lines[:i] + [("  " if line[:1].isspace() else "") + damaged] + lines[i + 1:])
                try:
                    topo = parse_topo_matrix(text, node="n")
                except TopologyParseError:
                    continue
                assert isinstance(topo, NodeTopology)
