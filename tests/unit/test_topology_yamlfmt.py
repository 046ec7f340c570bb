"""The project's YAML topology format: round trips, examples, docs, strictness, and
``load_file`` telling the two formats apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phalanx_input import Unreadable
from phalanx_proto.topology import Gpu, Nic, NodeTopology
from phalanx_topology import TopologyParseError, load_file
from phalanx_topology.yamlfmt import dump, dumps, load, loads

ROOT = Path(__file__).parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "topology"
EXAMPLES = sorted((ROOT / "examples" / "topology").glob("*.yaml"))


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_dumping_a_parsed_fixture_and_loading_it_back_gives_the_same_model(fixture):
    topo = load_file(FIXTURES / fixture)
    assert loads(dumps(topo), source=topo.source) == topo


def test_every_model_field_survives_the_round_trip():
    topo = NodeTopology(
        node="n1", generation=4, nvswitch=False, source="yaml:x",
        gpus=(Gpu(index=0, name="GPU0", uuid="GPU-1", model="NVIDIA A100-SXM4-80GB", memory_mib=81920,
                  mig_capable=True, mig_enabled=True, numa=1, socket=0, cpu_affinity="0-3", pci_bus_id="0000:07:00.0"),
              Gpu(index=1, name="gpu-b", vendor="ppu")),
        nics=(Nic(name="NIC0", device="mlx5_0", numa=1, socket=0, pci_bus_id="0000:0c:00.0", cpu_affinity="0-3"),
              Nic(name="mlx5_1", device="", rdma=False)),
        relations={"GPU0": {"gpu-b": "NV12", "NIC0": "PIX", "mlx5_1": "SYS"},
                   "gpu-b": {"GPU0": "NV12", "NIC0": "SYS", "mlx5_1": "SYS"},
                   "NIC0": {"GPU0": "PIX", "gpu-b": "SYS", "mlx5_1": "SYS"},
                   "mlx5_1": {"GPU0": "SYS", "gpu-b": "SYS", "NIC0": "SYS"}})
    assert loads(dumps(topo), source="yaml:x") == topo


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_file_loads_and_dumps_back_to_the_same_model(example):
    topo = load(example)
    assert topo.source == f"yaml:{example}"
    assert loads(dumps(topo), source=topo.source) == topo


def test_the_dgx1v_example_is_the_fixture_matrix_with_model_and_memory():
    example = load_file(ROOT / "examples" / "topology" / "dgx1v-8xV100-1xmlx5.yaml")
    fixture = load_file(FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt")
    assert example.relations == fixture.relations
    assert [(g.model, g.memory_mib, g.numa) for g in example.gpus] == (
        [("Tesla V100-SXM2-16GB", 16160, 0)] * 4 + [("Tesla V100-SXM2-16GB", 16160, 1)] * 4)


def test_the_handwritten_example_uses_the_short_forms():
    topo = load_file(ROOT / "examples" / "topology" / "pcie-4xL40S-handwritten.yaml")
    assert [g.name for g in topo.gpus] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.nics == (Nic(name="mlx5_0", device="mlx5_0", numa=0),)
    assert (topo.relation("GPU0", "mlx5_0"), topo.relation("GPU2", "GPU3"), topo.nvswitch) == ("PIX", "NODE", False)


def _doc_yaml_blocks() -> list[str]:
    text = (ROOT / "docs" / "topology.md").read_text()
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kind: NodeTopology" in b]


def test_the_yaml_examples_in_the_docs_load():
    blocks = _doc_yaml_blocks()
    assert blocks
    for block in blocks:
        assert isinstance(loads(block), NodeTopology)


def test_the_module_docstring_example_loads():
    import phalanx_topology.yamlfmt as module
    block = module.__doc__.split("::\n\n", 1)[1].split("\n\nConfig-style", 1)[0]
    topo = loads("\n".join(line[4:] for line in block.splitlines()))
    assert topo.relation("GPU0", "mlx5_0") == "NODE"


SMALL = """\
apiVersion: phalanx.io/v1alpha1
kind: NodeTopology
node: n1
gpus:
  - {index: 0, numa: 0}
  - {index: 1, numa: 0}
nics:
  - {name: mlx5_0}
matrix:
  columns: GPU0 GPU1 mlx5_0
  GPU0:    X    NV2  PIX
  GPU1:    NV2  X    PHB
  mlx5_0:  PIX  PHB  X
"""


def test_a_small_file_loads_into_exactly_this_model():
    assert loads(SMALL, source="yaml:small.yaml") == NodeTopology(
        node="n1", source="yaml:small.yaml", nvswitch=False,
        gpus=(Gpu(index=0, name="GPU0", numa=0), Gpu(index=1, name="GPU1", numa=0)),
        nics=(Nic(name="mlx5_0", device="mlx5_0", numa=0),),
        relations={"GPU0": {"GPU1": "NV2", "mlx5_0": "PIX"}, "GPU1": {"GPU0": "NV2", "mlx5_0": "PHB"},
                   "mlx5_0": {"GPU0": "PIX", "GPU1": "PHB"}})


def _edit(old: str, new: str) -> str:
    assert old in SMALL
    return SMALL.replace(old, new, 1)


INVALID = [
    ("an unknown top-level key", _edit("node: n1", "node: n1\nnodes: n2"),
     "small.yaml: Object contains unknown field `nodes`"),
    ("an unknown gpu key", _edit("{index: 0, numa: 0}", "{index: 0, numa: 0, nvlinks: 6}"),
     "small.yaml: gpus[0]: unknown key 'nvlinks'"),
    ("an unknown nic key", _edit("{name: mlx5_0}", "{name: mlx5_0, port: 1}"),
     "small.yaml: nics[0]: unknown key 'port'"),
    ("a wrongly typed gpu value", _edit("{index: 1, numa: 0}", "{index: 1, numa: zero}"),
     "small.yaml: gpus[1]: Expected `int`, got `str` - at `$.numa`"),
    ("a gpu without index", _edit("{index: 1, numa: 0}", "{numa: 0}"),
     "small.yaml: gpus[1]: Object missing required field `index`"),
    ("a missing node", _edit("node: n1\n", ""),
     "small.yaml: Object missing required field `node`"),
    ("the wrong kind", _edit("kind: NodeTopology", "kind: Node"),
     "small.yaml: expected apiVersion: phalanx.io/v1alpha1 and kind: NodeTopology, got phalanx.io/v1alpha1 / Node"),
    ("a row with a missing cell", _edit("GPU1:    NV2  X    PHB", "GPU1:    NV2  X"),
     "small.yaml: matrix.GPU1: 2 cells, expected 3 (one per column: GPU0 GPU1 mlx5_0)"),
    ("a missing row", _edit("  mlx5_0:  PIX  PHB  X\n", ""),
     "small.yaml: matrix: no row for mlx5_0"),
    ("a row for an unknown device", _edit("  mlx5_0:  PIX  PHB  X\n", "  mlx5_0:  PIX  PHB  X\n  mlx5_1:  PIX  PHB  X\n"),
     "small.yaml: matrix.mlx5_1: not a device listed under gpus or nics"),
    ("columns out of order", _edit("columns: GPU0 GPU1 mlx5_0", "columns: GPU1 GPU0 mlx5_0"),
     "small.yaml: matrix.columns must list the gpus, then the nics, in file order"),
    ("an asymmetric pair", _edit("GPU1:    NV2  X    PHB", "GPU1:    NV1  X    PHB"),
     "small.yaml: matrix: GPU0–GPU1 is NV2 but GPU1–GPU0 is NV1"),
    ("an unknown relation", _edit("GPU1:    NV2  X    PHB", "GPU1:    NV2  X    QPI"),
     "small.yaml: matrix.GPU1: GPU1–mlx5_0 has unknown relation 'QPI'"),
    ("a device name used twice", _edit("{name: mlx5_0}", "{name: GPU1}"),
     "small.yaml: device name 'GPU1' is used twice"),
    ("an NVLink count of NV99999999999999999999 is bounded",
     _edit("GPU0:    X    NV2  PIX\n  GPU1:    NV2", "GPU0:    X    NV99999999999999999999  PIX\n  GPU1:    "
                                                     "NV99999999999999999999"),
     "small.yaml: matrix.GPU0: GPU0–GPU1 is 'NV99999999999999999999': a GPU pair has at most 18 NVLinks"),
    ("a GPU index of 10^20 is bounded", _edit("{index: 1, numa: 0}", "{index: 100000000000000000000, numa: 0}"),
     "small.yaml: gpus[1]: Expected `int` <= 63 - at `$.index`"),
    ("10^20 MiB of GPU memory is bounded", _edit("{index: 1, numa: 0}", "{index: 1, numa: 0, memory_mib: 100000000000000000000}"),
     "small.yaml: gpus[1]: Expected `int` <= 1048576 - at `$.memory_mib`"),
    ("a NUMA id beyond Linux's is bounded", _edit("{index: 1, numa: 0}", "{index: 1, numa: 99999}"),
     "small.yaml: gpus[1]: Expected `int` <= 1023 - at `$.numa`"),
    ("a CPU list too wide to expand is refused before it is expanded",
     _edit("{index: 1, numa: 0}", "{index: 1, numa: 0, cpu_affinity: 0-99999999999}"),
     "small.yaml: 'GPU1': cpu_affinity: '0-99999999999' is not a CPU list"),
    ("two YAML documents are not one topology", SMALL + "---\n" + SMALL,
     "small.yaml: 2 YAML documents; a topology file holds one"),
    ("a document that is not a mapping", "- 1\n- 2\n", "small.yaml: Expected `object`, got `array`"),
]


@pytest.mark.parametrize(("case", "text", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_an_invalid_file_is_rejected_with_a_message_naming_the_key_or_row(case, text, message):
    with pytest.raises(TopologyParseError, match="^" + re.escape(message)):
        loads(text, source="yaml:small.yaml")


def test_nvswitch_is_detected_from_the_matrix_when_the_file_does_not_say():
    names = [f"GPU{i}" for i in range(8)]
    rows = "\n".join(f"  {a}: " + " ".join("X" if a == b else "NV12" for b in names) for a in names)
    text = ("apiVersion: phalanx.io/v1alpha1\nkind: NodeTopology\nnode: n\n"
            "gpus: [" + ", ".join(f"{{index: {i}}}" for i in range(8)) + "]\nmatrix:\n" + rows + "\n")
    assert loads(text).nvswitch is True
    assert loads(text.replace("node: n\n", "node: n\nnvswitch: false\n")).nvswitch is False


def test_load_file_reads_a_matrix_whatever_its_extension_and_names_the_node_after_the_file(tmp_path):
    src = FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
    path = tmp_path / "dgx.topo"
    path.write_text(src.read_text())
    topo = load_file(path)
    assert (topo.node, topo.source) == ("dgx", f"topo-matrix:{path}")
    assert load_file(path, node="n7").node == "n7"


def test_load_file_reads_yaml_by_extension_or_by_content_and_node_overrides_the_file(tmp_path):
    for name in ("a.yaml", "a.yml", "a.txt"):
        path = tmp_path / name
        path.write_text(SMALL)
        assert load_file(path).node == "n1"
        assert load_file(path, node="other").node == "other"


UNREADABLE = [
    ("a duplicate key", _edit("  GPU1:    NV2  X    PHB\n", "  GPU1:    NV2  X    PHB\n  GPU1:    NV2  X    PHB\n"),
     "small.yaml: line 13: not valid YAML (duplicate key 'GPU1')"),
    ("text that is not YAML", "gpus: [\n", "small.yaml: line 2: not valid YAML"),
    ("an alias bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(7)),
     "small.yaml: line 6: more than 1000000 YAML nodes once aliases are expanded"),
]


@pytest.mark.parametrize(("case", "text", "message"), UNREADABLE, ids=[c[0] for c in UNREADABLE])
def test_text_that_is_not_safe_yaml_is_unreadable(case, text, message):
    with pytest.raises(Unreadable, match="^" + re.escape(message)):
        loads(text, source="yaml:small.yaml")


@pytest.mark.parametrize(("case", "data", "message"), [
    pytest.param("binary", b"\xff\xfe\x00GPU0", "not a text file (a NUL byte at offset 2)", id="binary"),
    pytest.param("not UTF-8", b"GPU0 \xff", "not UTF-8 text (invalid start byte at byte 5)", id="not UTF-8"),
    pytest.param("too large", b"#" * (1024 * 1024 + 1), "larger than 1048576 bytes", id="too large"),
])
def test_load_file_refuses_what_is_not_a_small_text_file(case, data, message, tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(data)
    with pytest.raises(Unreadable, match="^" + re.escape(message)):
        load_file(path)


def test_load_file_raises_os_error_for_a_missing_file(tmp_path):
    with pytest.raises(OSError):
        load_file(tmp_path / "missing.txt")


def test_dump_writes_the_file_that_load_reads(tmp_path):
    topo = load_file(FIXTURES / "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt")
    dump(topo, tmp_path / "a4.yaml")
    again = load(tmp_path / "a4.yaml")
    assert again.nics == topo.nics and again.relations == topo.relations and again.nvswitch
