"""Network tiers (node < HyperNode < leaf switch < network-pod) from Node labels."""

from __future__ import annotations

import msgspec
import pytest

from phalanx_proto.topology import NetworkTiers
from phalanx_topology.tiers import DEFAULT, TierLabels, tiers_from_labels

CASES = [
    ("a node without tier labels is its own domain at every tier",
     {"kubernetes.io/hostname": "n1"}, NetworkTiers(hypernode="node:n1", leaf="node:n1", netpod="node:n1")),
    ("phalanx's own keys give every tier",
     {"phalanx.io/hypernode": "hn1", "phalanx.io/leaf-switch": "s1", "phalanx.io/network-pod": "p1"},
     NetworkTiers(hypernode="hn1", leaf="s1", netpod="p1")),
    ("topograph v1 keys map domain, tier-0 and tier-1",
     {"accelerator.topograph.run/domain": "nvl1", "accelerator.topograph.run/sub-domain": "nvl1.r1",
      "fabric.topograph.run/tier-0": "s1", "fabric.topograph.run/tier-1": "s2", "fabric.topograph.run/tier-2": "s3"},
     NetworkTiers(hypernode="nvl1", leaf="s1", netpod="s2")),
    ("topograph v0.1 keys map accelerator, block and spine",
     {"network.topology.nvidia.com/accelerator": "nvl1", "network.topology.nvidia.com/block": "s1",
      "network.topology.nvidia.com/spine": "s2", "network.topology.nvidia.com/datacenter": "s3"},
     NetworkTiers(hypernode="nvl1", leaf="s1", netpod="s2")),
    ("topograph 0.x keys map accelerator, leaf and spine",
     {"network.topology.nvidia.com/accelerator": "nvl1", "network.topology.nvidia.com/leaf": "s1",
      "network.topology.nvidia.com/spine": "s2", "network.topology.nvidia.com/core": "s3"},
     NetworkTiers(hypernode="nvl1", leaf="s1", netpod="s2")),
    ("ACK Lingjun keys map the access switch and the PoD",
     {"alibabacloud.com/asw-id": "asw-7", "alibabacloud.com/point-of-delivery": "pod-2"},
     NetworkTiers(hypernode="node:n1", leaf="asw-7", netpod="pod-2")),
    ("the GPU Operator's clique label is a HyperNode",
     {"nvidia.com/gpu.clique": "c0ffee.1"},
     NetworkTiers(hypernode="c0ffee.1", leaf="hypernode:c0ffee.1", netpod="hypernode:c0ffee.1")),
    ("phalanx's key wins over topograph's",
     {"phalanx.io/leaf-switch": "mine", "fabric.topograph.run/tier-0": "theirs"},
     NetworkTiers(hypernode="node:n1", leaf="mine", netpod="leaf:mine")),
    ("an empty label value counts as absent",
     {"phalanx.io/leaf-switch": "", "network.topology.nvidia.com/leaf": "s9"},
     NetworkTiers(hypernode="node:n1", leaf="s9", netpod="leaf:s9")),
    ("only a HyperNode label: the node is alone in its HyperNode's domain above",
     {"phalanx.io/hypernode": "hn1"}, NetworkTiers(hypernode="hn1", leaf="hypernode:hn1", netpod="hypernode:hn1")),
    ("only a network-pod label: below it the node is its own domain",
     {"phalanx.io/network-pod": "p1"}, NetworkTiers(hypernode="node:n1", leaf="node:n1", netpod="p1")),
]


@pytest.mark.parametrize(("case", "labels", "tiers"), CASES, ids=[c[0] for c in CASES])
def test_tiers_from_labels(case, labels, tiers):
    assert tiers_from_labels("n1", labels) == tiers


def test_two_unlabelled_nodes_share_no_domain_and_two_nodes_on_one_leaf_share_it():
    a, b = tiers_from_labels("a", {}), tiers_from_labels("b", {})
    assert {a.hypernode, a.leaf, a.netpod} & {b.hypernode, b.leaf, b.netpod} == set()
    s1 = {"phalanx.io/leaf-switch": "s1"}
    assert tiers_from_labels("a", s1).leaf == tiers_from_labels("b", s1).leaf == "s1"


def test_a_custom_config_reads_other_keys():
    config = TierLabels(hypernode=("example.com/nvl",), leaf=("example.com/rack",), netpod=("example.com/row",))
    labels = {"example.com/rack": "r4", "example.com/row": "row1", "phalanx.io/hypernode": "ignored"}
    assert tiers_from_labels("n1", labels, config) == NetworkTiers(hypernode="node:n1", leaf="r4", netpod="row1")


def test_the_tier_label_config_refuses_unknown_fields():
    with pytest.raises(msgspec.ValidationError, match="unknown field `spine`"):
        msgspec.convert({"hypernode": [], "leaf": [], "netpod": [], "spine": []}, TierLabels)


def test_the_default_keys_start_with_phalanx_own():
    assert (DEFAULT.hypernode[0], DEFAULT.leaf[0], DEFAULT.netpod[0]) == (
        "phalanx.io/hypernode", "phalanx.io/leaf-switch", "phalanx.io/network-pod")
