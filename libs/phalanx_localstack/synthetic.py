"""Synthetic clusters of many identical nodes with network tiers, for the simulator and the
benchmarks (``phalanx up --synthetic 1000x8v100``, ``bench/scale.py``).

A spec is ``<count>x<shape>``; a shape is one of ``SHAPES``: a topology file packaged with this
module (``shapes/``, copies of three of ``examples/``, kept equal by
``tests/unit/test_stack_fleet.py``) plus the GPU model and memory a ``nvidia-smi topo -m`` file
does not carry. Node ``i`` is
named ``<shape>-<i>`` (zero-padded) and labelled, as ``bench/placement_speed.py`` lays out its
synthetic cluster, into HyperNodes of 8 nodes, leaf switches of 64 nodes and network-pods of
512 nodes (``phalanx.io/hypernode``, ``phalanx.io/leaf-switch``, ``phalanx.io/network-pod``),
and enabled for Phalanx (``lj_runtimekit_enable=true``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from phalanx_localstack.stack import ClusterFile, ClusterNode, StackError
from phalanx_proto.kubeapi import ENABLE_LABEL, HYPERNODE_LABEL, LEAF_LABEL, NETPOD_LABEL

TOPOLOGIES = Path(str(files("phalanx_localstack") / "shapes"))
"""The shapes' topology files: package data, on disk in any installed (not zipped) copy."""
HYPERNODE, LEAF, NETPOD = 8, 64, 512
"""Nodes per HyperNode, per leaf switch and per network-pod."""
MAX_NODES = 100_000


@dataclass(frozen=True)
class Shape:
    topology: Path
    gpu_model: str
    gpu_memory_mib: int
    mig_enabled: bool = False


SHAPES = {
    "8v100": Shape(TOPOLOGIES / "dgx1v-like_8xV100-SXM2_mlx5_oneflow.txt", "Tesla V100-SXM2-16GB", 16384),
    "8a100": Shape(TOPOLOGIES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt", "NVIDIA A100-SXM4-40GB", 40960),
    "8a100mig": Shape(TOPOLOGIES / "hgx-a100_8x_NV12_1xmlx5_epyc7763_pleiades.txt", "NVIDIA A100-SXM4-40GB", 40960,
                      mig_enabled=True),
    "8h100": Shape(TOPOLOGIES / "p5-8xH100-nvswitch.yaml", "NVIDIA H100 80GB HBM3", 81920),
}


def tier_labels(i: int) -> dict[str, str]:
    """Enablement and network-tier labels of the ``i``-th synthetic node."""
    return {ENABLE_LABEL: "true", HYPERNODE_LABEL: f"hn-{i // HYPERNODE}",
            LEAF_LABEL: f"leaf-{i // LEAF}", NETPOD_LABEL: f"pod-{i // NETPOD}"}


def parse_spec(spec: str) -> tuple[int, str]:
    """``"1000x8v100"`` → ``(1000, "8v100")``; ``StackError`` naming the rule otherwise."""
    count, sep, shape = spec.partition("x")
    if not sep or not count.isascii() or not count.isdigit():
        raise StackError(f"--synthetic {spec!r}: want <count>x<shape>, e.g. 1000x8v100")
    if not 1 <= int(count) <= MAX_NODES:
        raise StackError(f"--synthetic {spec!r}: the node count must be 1..{MAX_NODES}")
    if shape not in SHAPES:
        raise StackError(f"--synthetic {spec!r}: unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return int(count), shape


def synthetic_cluster(spec: str) -> ClusterFile:
    """The cluster a spec names (see the module docstring)."""
    count, name = parse_spec(spec)
    shape = SHAPES[name]
    width = len(str(count - 1))
    return ClusterFile(tuple(
        ClusterNode(f"{name}-{i:0{width}d}", tier_labels(i), str(shape.topology), shape.gpu_model,
                    shape.gpu_memory_mib, shape.mig_enabled)
        for i in range(count)))
