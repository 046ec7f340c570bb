"""``phalanx topology show`` and ``discover``, through ``phalanx_cli.main.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx_cli import cmd_topology, main
from phalanx_nvml import NvmlDiscovery
from phalanx_nvmlfake.nvml import FakeMachine, FakeNvml
from phalanx_topology import load_file

ROOT = Path(__file__).parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "topology"
DGX1V = FIXTURES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt"
A4 = FIXTURES / "gcp-a4-highgpu-8g_8xB200_NV18_8xmlx5_dranet.txt"
REAL_COMMANDS = list(main.COMMANDS)


@pytest.fixture(autouse=True)
def only_topology(monkeypatch):
    """Build the CLI with this subcommand alone, so other subcommands' imports do not matter."""
    monkeypatch.setattr(main, "COMMANDS", ["phalanx_cli.cmd_topology"])


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_topology_command_is_registered_in_the_cli():
    assert "phalanx_cli.cmd_topology" in REAL_COMMANDS


def test_show_prints_gpus_nvlink_groups_nics_and_numa_for_the_dgx1v_matrix(capsys):
    code, out, err = run(capsys, "topology", "show", str(DGX1V))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1:3] == ["GPUs: 8", "  GPU0   index 0   NUMA 0, CPUs 0-11,24-35"]
    assert "NVLink: 1 group(s) of directly linked GPUs" in lines
    assert "  clique: GPU0 GPU1 GPU2 GPU3" in lines
    assert "  mlx5_0  NUMA 0, closest GPUs GPU2 GPU3 (PIX)" in lines
    assert lines[-3:] == ["NUMA:", "  0: GPU0 GPU1 GPU2 GPU3 mlx5_0", "  1: GPU4 GPU5 GPU6 GPU7"]


def test_show_names_an_nvswitch_fabric_and_the_nic_legend_devices(capsys):
    code, out, _ = run(capsys, "topology", "show", str(A4))
    assert code == 0
    assert "NVLink: NVSwitch fabric, all 8 GPUs all-to-all (NV18 each)" in out
    assert "  NIC0 (mlx5_0)  NUMA 0, closest GPUs GPU0 GPU1 (PIX)" in out


def test_show_json_is_one_document_with_gpus_nics_and_the_full_matrix(capsys):
    code, out, _ = run(capsys, "topology", "show", str(DGX1V), "--json")
    doc = json.loads(out)
    assert code == 0
    assert [(g["index"], g["numa"]) for g in doc["gpus"]] == [(i, 0 if i < 4 else 1) for i in range(8)]
    assert [n["name"] for n in doc["nics"]] == ["mlx5_0"]
    assert doc["matrix"]["GPU0"] == {"GPU1": "NV1", "GPU2": "NV1", "GPU3": "NV2", "GPU4": "NV2", "GPU5": "SYS",
                                     "GPU6": "SYS", "GPU7": "SYS", "mlx5_0": "NODE"}
    assert doc["matrix"] == load_file(DGX1V).relations
    assert all(a not in row for a, row in doc["matrix"].items())
    assert doc["nics"][0]["closest_gpus"] == ["GPU2", "GPU3"]
    assert doc["numa"] == [{"id": 0, "gpus": ["GPU0", "GPU1", "GPU2", "GPU3"], "nics": ["mlx5_0"]},
                           {"id": 1, "gpus": ["GPU4", "GPU5", "GPU6", "GPU7"], "nics": []}]


def test_show_json_keeps_unknown_numa_as_minus_one(capsys):
    _, out, _ = run(capsys, "topology", "show", str(FIXTURES / "pcie-8xL40S_node-sys_nccl-tests-issue273.txt"), "--json")
    assert json.loads(out)["nics"][0]["numa"] == -1


def test_show_reads_a_yaml_file_with_the_same_matrix_as_its_fixture(capsys):
    code, out, _ = run(capsys, "topology", "show", str(ROOT / "examples/topology/dgx1v-8xV100-1xmlx5.yaml"), "--json")
    doc = json.loads(out)
    assert (code, doc["node"], doc["matrix"]) == (0, "dgx1v-01", load_file(DGX1V).relations)
    assert doc["gpus"][0]["model"] == "Tesla V100-SXM2-16GB"


def test_show_with_node_names_the_node(capsys):
    _, out, _ = run(capsys, "topology", "show", str(DGX1V), "--node", "gpu-7", "--json")
    assert json.loads(out)["node"] == "gpu-7"


def test_show_exits_2_with_the_reason_on_stderr_for_a_missing_file(capsys, tmp_path):
    code, out, err = run(capsys, "topology", "show", str(tmp_path / "nope.txt"))
    assert (code, out) == (2, "")
    assert err == f"phalanx topology show: cannot read {tmp_path / 'nope.txt'}: No such file or directory\n"


def test_show_exits_1_naming_the_line_for_a_malformed_matrix(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("  GPU0 GPU1\nGPU0 X NV1\nGPU1 NV2 X\n")
    code, out, err = run(capsys, "topology", "show", str(bad))
    assert (code, out) == (1, "")
    assert err.startswith(f"phalanx topology show: {bad}: line 3: GPU0–GPU1 is NV1 on line 2 but GPU1–GPU0 is NV2")


def test_show_exits_1_naming_the_key_for_an_invalid_yaml_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: phalanx.io/v1alpha1\nkind: NodeTopology\nnode: n\ngpu: []\n")
    code, _, err = run(capsys, "topology", "show", str(bad))
    assert code == 1
    assert "unknown field `gpu`" in err


def test_topology_without_an_action_prints_usage_and_exits_2(capsys):
    code, _, err = run(capsys, "topology")
    assert code == 2
    assert "show" in err and "discover" in err


def test_discover_without_nvidia_driver_exits_2_saying_nvml_is_not_available(capsys, monkeypatch):
    monkeypatch.setattr(cmd_topology, "NvmlDiscovery", lambda **kw: NvmlDiscovery(FakeNvml(None), **kw))
    code, out, err = run(capsys, "topology", "discover")
    assert (code, out) == (2, "")
    assert err == "phalanx topology discover: NVML not available: NVML Shared Library Not Found\n"


def test_discover_prints_what_the_adapter_reads_from_this_machine(capsys, monkeypatch, tmp_path):
    machine = FakeMachine.from_topology(load_file(A4, node="a4-01"))
    machine.write_sysfs(tmp_path)
    monkeypatch.setattr(cmd_topology, "NvmlDiscovery", lambda **kw: NvmlDiscovery(FakeNvml(machine), **kw))
    code, out, _ = run(capsys, "topology", "discover", "--node", "a4-01", "--sysfs-root", str(tmp_path), "--json")
    doc = json.loads(out)
    assert (code, doc["node"], doc["source"], doc["nvswitch"]) == (0, "a4-01", "nvml", True)
    assert doc["matrix"] == machine.expected.relations
    assert [n["name"] for n in doc["nics"]] == [f"mlx5_{i}" for i in range(8)]
