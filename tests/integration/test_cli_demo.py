"""`phalanx demo` and `phalanx up` as a user runs them (subprocesses, real nats-server)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def phalanx(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx_cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_demo_json_has_the_documented_shape_and_schedules_whole_card_demo_on_one_gpu():
    proc = phalanx("demo", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc) == ["pods"]
    for pod in doc["pods"]:
        assert set(pod) == {"namespace", "name", "status", "node", "gpus", "reason"}
        assert pod["status"] in ("scheduled", "pending")
        assert (pod["status"] == "scheduled") == bool(pod["node"]) == (pod["reason"] == "")
    by_name = {p["name"]: p for p in doc["pods"]}
    card = by_name["whole-card-demo"]
    assert (card["status"], len(card["gpus"])) == ("scheduled", 1)
    assert by_name["too-big-9gpu"]["reason"].startswith("0/2 nodes are available: 2 insufficient free GPUs")
    quads = {tuple(p["gpus"]) for p in doc["pods"] if len(p["gpus"]) == 4}
    assert quads <= {(0, 1, 2, 3), (4, 5, 6, 7)} and quads


def test_demo_prints_a_table_with_one_row_per_pod():
    proc = phalanx("demo")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["NAMESPACE", "POD", "STATUS", "NODE", "GPUS", "REASON"]
    assert any(line.split()[1:3] == ["whole-card-demo", "scheduled"] for line in lines[1:])
    assert "scheduled default/whole-card-demo" in proc.stderr


def test_a_bad_cluster_file_is_refused_with_the_key_named_and_exit_1(tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n- name: a\n  topology: t.txt\n  gpus: 8\n")
    proc = phalanx("up", "--cluster-file", str(bad))
    assert (proc.returncode, proc.stderr) == (1, f"phalanx: {bad}: nodes[0]: Object contains unknown field `gpus`\n")
