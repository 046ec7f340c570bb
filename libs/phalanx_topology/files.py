"""Reading a node's topology from a file in either format: ``nvidia-smi topo -m`` text or
the project's YAML (``yamlfmt``). Used by the CLI, the simulator and topology-discovery's
file mode."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import msgspec

from phalanx_input import read_text
from phalanx_proto.topology import NodeTopology
from phalanx_topology import yamlfmt
from phalanx_topology.matrix import parse_topo_matrix

MAX_TOPOLOGY_BYTES = 1024 * 1024
"""A topology file is a few KB (a 64-GPU, 64-NIC matrix is under 100 KB)."""
_YAML_SUFFIXES = (".yaml", ".yml")
_YAML_KIND = re.compile(r"^kind\s*:", re.MULTILINE)


def is_yaml(path: str | Path, text: str) -> bool:
    """YAML by extension (``.yaml``/``.yml``); otherwise by content (a top-level ``kind:``)."""
    if Path(path).suffix.lower() in _YAML_SUFFIXES:
        return True
    return _YAML_KIND.search(text) is not None


def load_file(path: str | Path, *, node: str | None = None) -> NodeTopology:
    """The topology in ``path``, whichever format it is in.

    ``node`` names the node: a matrix has no node name (default: the file name without its
    extension); for a YAML file it overrides the name written in the file. ``source`` is
    ``topo-matrix:<path>`` or ``yaml:<path>``. Raises ``OSError`` (``phalanx_input.Unreadable``
    for a file too large, binary or not YAML) when the file cannot be read and
    ``TopologyParseError`` (a ``ValueError``) when it is not a valid topology.
    """
    text = read_text(path, limit=MAX_TOPOLOGY_BYTES)
    if is_yaml(path, text):
        topo = yamlfmt.loads(text, source=f"yaml:{path}")
        return msgspec.structs.replace(topo, node=node) if node else topo
    return parse_topo_matrix(text, node=node or Path(path).stem, source=f"topo-matrix:{path}")


@functools.lru_cache(maxsize=64)
def _parsed(path: str) -> NodeTopology:
    return load_file(path)


def topology_from_file(path: str, node: str, *, gpu_model: str = "", gpu_memory_mib: int = 0,
                       mig_enabled: bool = False) -> NodeTopology:
    """``node``'s topology from an ``nvidia-smi topo -m`` or Phalanx YAML file, with what the
    file does not say filled in (a topo -m matrix names no model or memory; NVML reports the
    real MIG mode). Each file is parsed once per process: a node fleet (or ``phalanx sim``)
    serves thousands of simulated nodes from a handful of files. Raises as ``load_file``."""
    topo = _parsed(str(path))
    gpus = tuple(msgspec.structs.replace(g, model=g.model or gpu_model, memory_mib=g.memory_mib or gpu_memory_mib,
                                         mig_enabled=g.mig_enabled or mig_enabled) for g in topo.gpus)
    return msgspec.structs.replace(topo, node=node, gpus=gpus)
