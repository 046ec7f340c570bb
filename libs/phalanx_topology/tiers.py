"""Network tiers from Node labels: node < HyperNode < leaf switch < network-pod (R8).

topology-discovery calls ``tiers_from_labels`` on its Node's labels and ships the result in
``NodeTopologyReported``; placement builds its domain tree from it. Each tier has an ordered
list of label keys; the first key present with a non-empty value wins. The defaults accept
Phalanx's own keys, the keys ACK Lingjun's network-topology collector writes, and every
generation of NVIDIA topograph's keys (docs/topology.md cites them).

A tier with no label inherits the domain of the tier below it, so the domains always nest:
a node with no labels at all is its own domain at every tier (``node:<name>``); a node with
only a HyperNode label is alone in ``hypernode:<value>`` at the leaf and network-pod tiers.
"""

from __future__ import annotations

import msgspec

from phalanx_proto.topology import NetworkTiers


class TierLabels(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Label keys per tier, most authoritative first (config: unknown fields are refused)."""

    hypernode: tuple[str, ...]
    leaf: tuple[str, ...]
    netpod: tuple[str, ...]


HYPERNODE_LABEL = "phalanx.io/hypernode"
LEAF_LABEL = "phalanx.io/leaf-switch"
NETPOD_LABEL = "phalanx.io/network-pod"
"""Phalanx's own label key of each tier, the first of its ``DEFAULT`` keys."""

DEFAULT = TierLabels(
    hypernode=(
        HYPERNODE_LABEL,
        "accelerator.topograph.run/domain",         # topograph v1
        "network.topology.nvidia.com/accelerator",  # topograph before v1
        "nvidia.com/gpu.clique",                    # GPU Operator, MNNVL systems
    ),
    leaf=(
        LEAF_LABEL,
        "alibabacloud.com/asw-id",                  # ACK Lingjun: access switch
        "fabric.topograph.run/tier-0",              # topograph v1: switch closest to the node
        "network.topology.nvidia.com/leaf",         # topograph 0.2+
        "network.topology.nvidia.com/block",        # topograph 0.1
    ),
    netpod=(
        NETPOD_LABEL,
        "alibabacloud.com/point-of-delivery",       # ACK Lingjun: PoD above the ASWs
        "fabric.topograph.run/tier-1",              # topograph v1: next switch tier up
        "network.topology.nvidia.com/spine",        # topograph, every version before v1
    ),
)


def _first(labels: dict[str, str], keys: tuple[str, ...]) -> str:
    return next((labels[k] for k in keys if labels.get(k)), "")


def tiers_from_labels(node_name: str, labels: dict[str, str], config: TierLabels = DEFAULT) -> NetworkTiers:
    """The node's domain at each tier. A labelled tier takes the label's value as is; an
    unlabelled tier takes the domain below it, prefixed by that tier's name (``node:<name>``,
    ``hypernode:<value>``, ``leaf:<value>``) so it cannot equal another node's label value."""
    hypernode = _first(labels, config.hypernode) or f"node:{node_name}"
    leaf = _first(labels, config.leaf) or _inherit("hypernode", hypernode)
    netpod = _first(labels, config.netpod) or _inherit("leaf", leaf)
    return NetworkTiers(hypernode=hypernode, leaf=leaf, netpod=netpod)


def _inherit(tier: str, value: str) -> str:
    """An unlabelled tier's domain: the one below, which is ``node:…`` already or gets a prefix."""
    if value.startswith(("node:", "hypernode:", "leaf:")):
        return value
    return f"{tier}:{value}"


ENABLE_LABEL = "lj_runtimekit_enable"
ACK_LABEL = "ack.node.gpu.schedule"


def enabled_by_labels(labels: dict[str, str]) -> bool:
    """R10/R11: ``lj_runtimekit_enable=true`` or ``ack.node.gpu.schedule=topology`` enables a
    node; ``ack.node.gpu.schedule=default`` hands it back to regular scheduling."""
    ack = labels.get(ACK_LABEL)
    if ack == "default":
        return False
    return labels.get(ENABLE_LABEL) == "true" or ack == "topology"
