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

from phalanx_proto.kubeapi import ACK_LABEL, ENABLE_LABEL, TIER_LABEL_KEYS
from phalanx_proto.topology import NetworkTiers


class TierLabels(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Label keys per tier, most authoritative first (config: unknown fields are refused)."""

    hypernode: tuple[str, ...]
    leaf: tuple[str, ...]
    netpod: tuple[str, ...]


DEFAULT = TierLabels(**TIER_LABEL_KEYS)
"""The keys ``phalanx_proto.kubeapi`` lists for each tier (Phalanx's own first)."""


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




def enabled_by_labels(labels: dict[str, str]) -> bool:
    """R10/R11: ``lj_runtimekit_enable=true`` or ``ack.node.gpu.schedule=topology`` enables a
    node; ``ack.node.gpu.schedule=default`` hands it back to regular scheduling."""
    ack = labels.get(ACK_LABEL)
    if ack == "default":
        return False
    return labels.get(ENABLE_LABEL) == "true" or ack == "topology"
