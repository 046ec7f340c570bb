"""Which processes a simulated stack runs (one per node and role, or one node fleet), and the
synthetic clusters the benchmarks and ``phalanx up --synthetic`` use."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phalanx_localstack.stack import FLEET_ABOVE, ClusterFile, Stack, StackError
from phalanx_localstack.synthetic import SHAPES, TOPOLOGIES, synthetic_cluster

SERVICES = ["placement", "binder", "gang-coordinator"]


@pytest.mark.parametrize(("case", "nodes", "fleet", "agents"), [
    ("two nodes run two agent processes each", 2, None, ["topology-discovery@8v100-0", "mig-manager@8v100-0",
                                                         "topology-discovery@8v100-1", "mig-manager@8v100-1"]),
    ("a cluster above the threshold runs one fleet", FLEET_ABOVE + 1, None, ["node-fleet"]),
    ("fleet=True asks for a fleet at any size", 2, True, ["node-fleet"]),
    ("fleet=False keeps the per-node processes at any size", FLEET_ABOVE + 1, False, None),
])
def test_the_stack_plans_node_agents_by_size_or_by_flag(tmp_path, case, nodes, fleet, agents):
    stack = Stack(synthetic_cluster(f"{nodes}x8v100"), workdir=str(tmp_path), fleet=fleet)
    names = [name for name, _, _ in stack.plan()]
    assert names[-3:] == SERVICES
    if agents is None:
        assert len(names) == 2 * nodes + 3
    else:
        assert names[:-3] == agents
    if names[0] == "node-fleet":
        assert stack.plan()[0][2] == ["--cluster-file", str(tmp_path / "fleet-cluster.yaml")]


def test_a_synthetic_cluster_has_named_nodes_in_nested_network_tiers_and_survives_a_file_round_trip(tmp_path):
    cluster = synthetic_cluster("600x8v100")
    n = cluster.nodes[515]
    assert (n.name, n.gpu_model, n.labels) == ("8v100-515", "Tesla V100-SXM2-16GB", {
        "lj_runtimekit_enable": "true", "phalanx.io/hypernode": "hn-64", "phalanx.io/leaf-switch": "leaf-8",
        "phalanx.io/network-pod": "pod-1"})
    assert ClusterFile.load(cluster.dump(tmp_path / "c.yaml")) == cluster


@pytest.mark.parametrize(("spec", "message"), [
    ("1000", "want <count>x<shape>"),
    ("tenx8v100", "want <count>x<shape>"),
    ("٤x8v100", "want <count>x<shape>"),
    ("0x8v100", "the node count must be 1..100000"),
    ("1000x8k80", "unknown shape '8k80'; known: 8v100, 8a100, 8a100mig, 8h100"),
])
def test_a_bad_synthetic_spec_is_refused_naming_the_rule(spec, message):
    with pytest.raises(StackError, match=message):
        synthetic_cluster(spec)


def test_the_synthetic_shapes_topologies_are_packaged_and_equal_to_the_examples_they_copy():
    examples = Path(__file__).resolve().parents[2] / "examples"
    for name, shape in SHAPES.items():
        assert shape.topology.is_relative_to(TOPOLOGIES), f"{name} is read from the package, not from examples/"
        (original,) = examples.rglob(shape.topology.name)
        assert shape.topology.read_bytes() == original.read_bytes(), f"{name}: the packaged copy drifted"


def test_a_dra_only_node_of_the_cluster_file_runs_its_agent_advertising_nothing(tmp_path):
    """``advertise: none`` (a node whose GPUs only a DRA driver offers) reaches its
    topology-discovery as ``--advertise none`` and survives the fleet's file round trip (the
    fleet gives each node's agent its own mode)."""
    cluster = synthetic_cluster("2x8v100")
    dra = ClusterFile((cluster.nodes[0], dataclasses.replace(cluster.nodes[1], advertise="none")))
    assert ClusterFile.load(dra.dump(tmp_path / "c.yaml")) == dra
    args = {name: extra for name, _, extra in Stack(dra, workdir=str(tmp_path)).plan()}
    assert "--advertise" not in args["topology-discovery@8v100-0"]
    assert args["topology-discovery@8v100-1"][-2:] == ["--advertise", "none"]
