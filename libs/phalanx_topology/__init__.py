"""Reading a node's GPU/NIC topology and ranking its links (used by topology-discovery,
placement and the CLI).

* ``matrix.parse_topo_matrix`` reads ``nvidia-smi topo -m`` text;
* ``yamlfmt`` reads and writes the project's YAML format; ``load_file`` takes either;
* ``links`` orders relations for placement; ``groups`` gives NVLink groups, NIC affinity and
  NUMA layout; ``tiers`` reads the network tiers (HyperNode, leaf, network-pod) from labels.
"""

from phalanx_topology.files import load_file
from phalanx_topology.matrix import parse_topo_matrix
from phalanx_topology.model import TopologyParseError

__all__ = ["TopologyParseError", "load_file", "parse_topo_matrix"]
