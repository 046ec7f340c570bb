"""GPU + RDMA NIC joint placement (R7): GPUs and the NICs nearest to them, as one group.

Called by the placement service (and ``phalanx place --rdma``) for members that ask for
``aliyun.com/rdma: "1"`` with whole GPUs. Pure: a topology, the free GPUs and (optionally)
the free NICs in; an ``RdmaChoice`` or a ``NoChoice`` out.

Levels, best first, as the seed's four-level fallback (a GPU/NIC pair's level comes from
their ``nvidia-smi topo`` relation):

=================  ======================  ===================================================
level              relation                meaning
=================  ======================  ===================================================
``pcie-switch``    PIX, PXB                behind the same PCIe switch (tree)
``numa``           PHB, NODE               same NUMA node, through the host bridge(s)
``socket``         SYS, same socket        across the interconnect inside one CPU socket
``cross-socket``   SYS otherwise           across the CPU interconnect (or socket unknown)
=================  ======================  ===================================================

A SYS pair is ``socket`` when both devices report the same NUMA id (one NUMA node spanning
several PCIe root complexes, as on some EPYC boards) or when ``numa_sockets`` (NUMA id ->
socket, which the matrix cannot tell) puts their NUMA ids on one socket; otherwise, or when a
NUMA id is unknown, it is ``cross-socket``. A NIC with no NUMA id takes the NUMA id of a GPU
it reaches at PIX/PXB/PHB/NODE.

How GPU choice and NIC choice interact: each free GPU gets its *best level* (its nearest
usable NIC). The group's level is the worst best-level among its GPUs. Levels are tried best
first; at each level the eligible GPUs are those whose best level is at least that good, and
``gpuset.choose_gpus`` picks among them by its usual objective (ring bottleneck, pair
quality, leftover - measured over *all* free GPUs), with the GPUs' own nearness to a NIC
(level, then relation) as the preference tie-break before lowest indices. So a better level
always wins over a better GPU set, and among sets of the same level the GPU objective
decides. Then every chosen GPU is paired with a NIC at its best level: an unused NIC first
(rail alignment, one NIC per GPU where there are enough), then the closer relation (PIX before
PXB, PHB before NODE), then topology order. NICs are shared devices by default; pass
``free_nics`` when the caller books them exclusively.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Set

import msgspec

from phalanx_engine.gpuset import GpuChoice, NoChoice, choose_gpus
from phalanx_proto.topology import Gpu, Nic, NodeTopology


class RdmaLevel(enum.StrEnum):
    """The fallback level reached; the string values are stable (they go on the wire as
    ``Assignment.rdma_level``)."""

    PCIE_SWITCH = "pcie-switch"
    NUMA = "numa"
    SOCKET = "socket"
    CROSS_SOCKET = "cross-socket"

    @property
    def rank(self) -> int:
        """0 for the best level, 3 for the worst."""
        return _ORDER.index(self)


_ORDER = (RdmaLevel.PCIE_SWITCH, RdmaLevel.NUMA, RdmaLevel.SOCKET, RdmaLevel.CROSS_SOCKET)
_CLOSENESS = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}


class GpuNic(msgspec.Struct, frozen=True, kw_only=True):
    """One chosen GPU and the NIC it is paired with."""

    gpu: int
    nic: str
    relation: str
    level: RdmaLevel


class RdmaChoice(msgspec.Struct, frozen=True, kw_only=True):
    """GPUs (as ``gpuset`` chose them), the distinct NICs of the group in topology order,
    the per-GPU pairing, and the level the group reached (the worst of its pairs)."""

    gpus: GpuChoice
    nics: tuple[str, ...]
    pairs: tuple[GpuNic, ...]
    level: RdmaLevel


def pair_level(
    topology: NodeTopology, gpu: int, nic: str, *, numa_sockets: Mapping[int, int] | None = None
) -> RdmaLevel:
    """The level of one GPU (by index) and one NIC (by name). Raises ``KeyError`` for an
    unknown GPU or NIC."""
    g = _gpu(topology, gpu)
    n = _nic(topology, nic)
    return _level(topology, g.name, g.numa, n, numa_sockets or {})


def choose_gpus_and_nics(
    topology: NodeTopology,
    free: Set[int],
    count: int,
    require: Set[int] = frozenset(),
    *,
    free_nics: Set[str] | None = None,
    numa_sockets: Mapping[int, int] | None = None,
) -> RdmaChoice | NoChoice:
    """The best group of ``count`` free GPUs plus NICs, by the level ladder described in
    the module docstring. ``NoChoice`` when the node has no usable RDMA NIC or not enough free
    GPUs. Raises ``ValueError`` like ``choose_gpus`` for caller bugs."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    sockets = numa_sockets or {}
    nics = [n for n in topology.nics if n.rdma and (free_nics is None or n.name in free_nics)]
    if not nics:
        why = "no free RDMA NIC" if topology.nics and free_nics is not None else "no RDMA NIC"
        return NoChoice(code="no-rdma-nic", reasons=(f"node {topology.node} has {why}",))
    gpus = {g.index: g for g in topology.gpus}
    best: dict[int, tuple[RdmaLevel, list[tuple[int, int, Nic]]]] = {}
    for i in free:
        if i not in gpus:
            raise ValueError(f"free: GPU index {i} is not on node {topology.node}")
        ranked = []
        for order, n in enumerate(nics):
            level = _level(topology, gpus[i].name, gpus[i].numa, n, sockets)
            ranked.append((level.rank, _CLOSENESS.get(_relation(topology, gpus[i].name, n.name), 5), order, n))
        top = min(r[0] for r in ranked)
        best[i] = (_ORDER[top], sorted((c, o, n) for lv, c, o, n in ranked if lv == top))

    # Among equally scored sets, prefer GPUs nearer a NIC (level first, then relation).
    prefer = {i: -(lv.rank * 8 + opts[0][0]) for i, (lv, opts) in best.items()}
    for level in _ORDER:
        eligible = {i for i, (lv, _) in best.items() if lv.rank <= level.rank}
        last = level is RdmaLevel.CROSS_SOCKET  # every free GPU is eligible here
        if not last and (len(eligible) < count or not set(require) <= eligible):
            continue
        chosen = choose_gpus(topology, free, count, require, eligible=eligible, prefer=prefer)
        if isinstance(chosen, NoChoice):
            if last:
                return chosen
            continue
        pairs = _pair(chosen.gpus, best, topology)
        used = {p.nic for p in pairs}
        return RdmaChoice(
            gpus=chosen,
            nics=tuple(n.name for n in nics if n.name in used),
            pairs=pairs,
            level=max((p.level for p in pairs), key=lambda lv: lv.rank),
        )
    raise AssertionError("unreachable: the cross-socket level always returns")


def _pair(
    chosen: tuple[int, ...], best: dict[int, tuple[RdmaLevel, list[tuple[int, int, Nic]]]], topology: NodeTopology
) -> tuple[GpuNic, ...]:
    used: dict[str, int] = {}
    out = []
    for i in chosen:
        level, options = best[i]
        # fewest GPUs already on the NIC, then closest relation, then topology order
        closeness, _, nic = min(options, key=lambda o: (used.get(o[2].name, 0), o[0], o[1]))
        used[nic.name] = used.get(nic.name, 0) + 1
        gpu_name = next(g.name for g in topology.gpus if g.index == i)
        out.append(GpuNic(gpu=i, nic=nic.name, relation=_relation(topology, gpu_name, nic.name), level=level))
    return tuple(out)


def _relation(topology: NodeTopology, a: str, b: str) -> str:
    return topology.relations.get(a, {}).get(b) or topology.relations.get(b, {}).get(a) or ""


def _nic_numa(topology: NodeTopology, nic: Nic) -> int:
    if nic.numa >= 0:
        return nic.numa
    for g in sorted(topology.gpus, key=lambda g: g.index):
        if g.numa >= 0 and _relation(topology, g.name, nic.name) in ("PIX", "PXB", "PHB", "NODE"):
            return g.numa
    return -1


def _level(topology: NodeTopology, gpu_name: str, gpu_numa: int, nic: Nic, sockets: Mapping[int, int]) -> RdmaLevel:
    rel = _relation(topology, gpu_name, nic.name)
    if rel in ("PIX", "PXB"):
        return RdmaLevel.PCIE_SWITCH
    if rel in ("PHB", "NODE"):
        return RdmaLevel.NUMA
    # SYS (or unknown): the path crosses the SMP interconnect. Same socket when both sit on
    # one NUMA id (a NUMA node spanning several dies) or the map puts their NUMA ids together.
    nic_numa = _nic_numa(topology, nic)
    if gpu_numa >= 0 and nic_numa >= 0:
        if gpu_numa == nic_numa or (gpu_numa in sockets and sockets.get(gpu_numa) == sockets.get(nic_numa)):
            return RdmaLevel.SOCKET
    return RdmaLevel.CROSS_SOCKET


def _gpu(topology: NodeTopology, index: int) -> Gpu:
    for g in topology.gpus:
        if g.index == index:
            return g
    raise KeyError(f"GPU {index} is not on node {topology.node}")


def _nic(topology: NodeTopology, name: str) -> Nic:
    for n in topology.nics:
        if n.name == name:
            return n
    raise KeyError(f"NIC {name!r} is not on node {topology.node}")
