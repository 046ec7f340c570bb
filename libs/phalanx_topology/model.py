"""Rules every topology reader shares: device names, relation strings, CPU lists, and the
facts derived from a matrix (NUMA domains, NIC NUMA, NVSwitch fabric).

The ``nvidia-smi topo -m`` parser (``matrix``), the YAML format (``yamlfmt``) and the NVML
adapter (``phalanx_nvml``) all call these, so the three readers agree on one model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from phalanx_proto.topology import (
    MAX_DIRECT_NVLINKS,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS,
    MAX_NICS,
    MAX_NUMA,
    MAX_SOCKETS,
    PCIE_RELATIONS,
    Gpu,
    Nic,
    NodeTopology,
    topology_problem,
)
from phalanx_topology.links import nvlink_count

__all__ = ["MAX_DIRECT_NVLINKS", "MAX_GPUS", "MAX_GPU_MEMORY_MIB", "MAX_NICS", "MAX_NUMA", "MAX_SOCKETS",
           "PCIE_RELATIONS"]
# The bounds and relation names are the wire contract's (``phalanx_proto.topology``); a
# per-pair bundle of ``k`` links to each of ``n - 1`` peers needs ``k * (n - 1)`` links per GPU,
# so more than ``MAX_DIRECT_NVLINKS`` can only be a switch.

LEGACY_RELATIONS = {"SOC": "SYS"}
"""Names older nvidia-smi releases printed, mapped to today's."""

MAX_CPUS = 8192
"""Linux's largest NR_CPUS: CPU ids in an affinity list are below it."""

# ASCII digits only: a Unicode digit such as '٣' is not an index, count or CPU id.
_NV = re.compile(r"NV([1-9][0-9]*)")
_GPU = re.compile(r"GPU([0-9]+)")
_NIC_INDEXED = re.compile(r"NIC([0-9]+)")
_NIC_DEVICE = re.compile(r"[a-z][a-z0-9_.-]*")
_FUSED_LOWER = re.compile(r"([a-z]+[0-9]*_)[0-9]+\1[0-9]+")
_CPU_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")


class TopologyParseError(ValueError):
    """A topology file or text that does not describe a node; the message names the place
    (``line 7`` or a YAML path) and the rule that was broken."""


# --- device names -------------------------------------------------------------------------

def gpu_index(name: str) -> int | None:
    """The index in ``GPU<n>`` (below ``MAX_GPUS``), or None when ``name`` is not a GPU name."""
    m = _GPU.fullmatch(name)
    return int(m.group(1)) if m and len(m.group(1)) <= 3 and int(m.group(1)) < MAX_GPUS else None


def device_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a device column (``GPU3``, ``NIC0``, ``mlx5_0``), or None."""
    if _GPU.fullmatch(name) and gpu_index(name) is None:
        return f"{name!r}: a GPU index is below {MAX_GPUS} (no node has more GPUs)"
    if _GPU.fullmatch(name) or _NIC_INDEXED.fullmatch(name):
        return None
    if "GPU" in name or "NIC" in name or _FUSED_LOWER.fullmatch(name):
        return f"column name {name!r} looks like several names run together (columns are separated by whitespace)"
    if not _NIC_DEVICE.fullmatch(name):
        return f"{name!r} is not a device name (GPU<n>, NIC<n> or an RDMA device such as mlx5_0)"
    return None


def is_indexed_nic(name: str) -> bool:
    """True for ``NIC<n>``, the names newer nvidia-smi gives NICs (with a ``NIC Legend``)."""
    return _NIC_INDEXED.fullmatch(name) is not None


# --- relations ----------------------------------------------------------------------------

def normalize_relation(cell: str) -> str | None:
    """The canonical relation for a matrix cell (``NV2``, ``PIX`` … ``SYS``; legacy ``SOC`` is
    ``SYS``), or None when the cell is not a relation. ``X`` (self) is not a relation."""
    cell = LEGACY_RELATIONS.get(cell, cell)
    if cell in PCIE_RELATIONS or _NV.fullmatch(cell):
        return cell
    return None


def cell_problem(row: str, col: str, cell: str) -> str | None:
    """Why ``cell`` cannot stand at (row, col) of a matrix, or None."""
    if row == col:
        return None if cell == "X" else f"{row}–{col} is the diagonal and must be 'X', not {cell!r}"
    if cell == "X":
        return f"{row}–{col} is 'X' (self) off the diagonal"
    if normalize_relation(cell) is None:
        return (f"{row}–{col} has unknown relation {cell!r} "
                f"(expected NV<n>, PIX, PXB, PHB, NODE or SYS)")
    m = _NV.fullmatch(cell)
    if m and (len(m.group(1)) > 3 or int(m.group(1)) > MAX_DIRECT_NVLINKS):
        return (f"{row}–{col} is {_cut(cell)}: a GPU pair has at most {MAX_DIRECT_NVLINKS} NVLinks (the most one "
                "GPU has)")
    return None


def _cut(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:30] + "...") + f" ({len(text)} characters)"


def asymmetry(relations: Mapping[str, Mapping[str, str]], names: Sequence[str]) -> tuple[str, str] | None:
    """The first pair ``(a, b)`` whose relation differs from ``(b, a)``, or None."""
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if relations[a][b] != relations[b][a]:
                return a, b
    return None


# --- CPU lists ----------------------------------------------------------------------------

def parse_cpulist(text: str) -> frozenset[int]:
    """``0-11,24-35`` → the set of CPUs (ids below ``MAX_CPUS``, checked before any range is
    expanded); raises ValueError for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        m = _CPU_RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"{_cut(text)} is not a CPU list (like 0-11,24-35)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"{_cut(text)} has a descending range {part!r}")
        if hi >= MAX_CPUS:
            raise ValueError(f"{_cut(text)} names CPU {hi}: CPU ids are below {MAX_CPUS} (Linux's largest NR_CPUS)")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The set of CPUs in canonical ``0-11,24-35`` form (empty string for no CPUs)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start = prev = None
    for c in ordered:
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def canonical_cpulist(text: str) -> str:
    """``text`` rewritten in canonical form; ``N/A`` and empty become empty."""
    if text in ("", "N/A"):
        return ""
    return format_cpulist(parse_cpulist(text))


# --- derived facts ------------------------------------------------------------------------

def numa_from_affinity(gpus: Sequence[Gpu], nics: Sequence[Nic]) -> tuple[tuple[Gpu, ...], tuple[Nic, ...]]:
    """When no device has a known NUMA id, devices with the same CPU affinity share a NUMA
    domain, numbered 0, 1, … in order of first appearance (GPUs first, then NICs). Devices
    without an affinity stay at -1. Returns the devices unchanged when any NUMA id is known."""
    if any(d.numa >= 0 for d in (*gpus, *nics)):
        return tuple(gpus), tuple(nics)
    ids: dict[str, int] = {}
    for d in (*gpus, *nics):
        if d.cpu_affinity:
            ids.setdefault(d.cpu_affinity, len(ids))

    def numa(d):
        return ids.get(d.cpu_affinity, -1)

    return (tuple(msgspec.structs.replace(g, numa=numa(g)) for g in gpus),
            tuple(msgspec.structs.replace(n, numa=numa(n)) for n in nics))


def infer_nic_numa(gpus: Sequence[Gpu], nics: Sequence[Nic],
                   relations: Mapping[str, Mapping[str, str]]) -> tuple[Nic, ...]:
    """A NIC whose NUMA id is unknown takes the NUMA id of the GPUs it reaches without
    crossing the inter-socket link (PIX, PXB, PHB or NODE), when those GPUs agree on one id.
    A NIC that is SYS to every GPU, or near GPUs of different domains, stays at -1."""
    out = []
    for nic in nics:
        if nic.numa < 0:
            near = {g.numa for g in gpus
                    if g.numa >= 0 and relations[nic.name][g.name] in ("PIX", "PXB", "PHB", "NODE")}
            if len(near) == 1:
                nic = msgspec.structs.replace(nic, numa=near.pop())
        out.append(nic)
    return tuple(out)


def detect_nvswitch(gpu_names: Sequence[str], relations: Mapping[str, Mapping[str, str]]) -> bool:
    """True when the matrix shows an NVSwitch fabric: every GPU pair is ``NV<k>`` with one
    ``k``, and ``k * (n - 1)`` is more links than any GPU has (so the bundles cannot be direct).
    The DGX-1V cube mesh (NV1/NV2/SYS) and a 4-GPU direct mesh (NV4 each) are not fabrics."""
    n = len(gpu_names)
    if n < 2:
        return False
    counts = {nvlink_count(relations[a][b]) for i, a in enumerate(gpu_names) for b in gpu_names[i + 1:]}
    if len(counts) != 1:
        return False
    k = counts.pop()
    return k > 0 and k * (n - 1) > MAX_DIRECT_NVLINKS


def device_problem(gpus: Sequence[Gpu], nics: Sequence[Nic]) -> str | None:
    """Why these devices cannot be one node's (a count, index, memory size, NUMA or socket id
    beyond what any node has, or a CPU list that is not one), or None."""
    if len(gpus) > MAX_GPUS:
        return f"{len(gpus)} GPUs: a node has at most {MAX_GPUS}"
    if len(nics) > MAX_NICS:
        return f"{len(nics)} NICs: a node's topology lists at most {MAX_NICS}"
    for d in (*gpus, *nics):
        name = _cut(d.name)
        if isinstance(d, Gpu) and d.index >= MAX_GPUS:
            return f"{name}: index {d.index}: a GPU index is below {MAX_GPUS} (no node has more GPUs)"
        if isinstance(d, Gpu) and d.memory_mib > MAX_GPU_MEMORY_MIB:
            return f"{name}: memory_mib {d.memory_mib}: no GPU has more than {MAX_GPU_MEMORY_MIB} MiB (1 TiB)"
        if not -1 <= d.numa < MAX_NUMA:
            return f"{name}: numa {d.numa}: a NUMA id is -1 (unknown) or below {MAX_NUMA}"
        if not -1 <= d.socket < MAX_SOCKETS:
            return f"{name}: socket {d.socket}: a socket id is -1 (unknown) or below {MAX_SOCKETS}"
        if d.cpu_affinity:
            try:
                parse_cpulist(d.cpu_affinity)
            except ValueError as e:
                return f"{name}: cpu_affinity: {e}"
    return None


def finish(node: str, gpus: Sequence[Gpu], nics: Sequence[Nic], relations: dict[str, dict[str, str]],
           *, source: str, nvswitch: bool | None = None) -> NodeTopology:
    """Build the model with the derived facts every reader fills in the same way: NUMA from
    CPU affinity when no id is known, NIC NUMA from nearby GPUs, NVSwitch from the matrix
    (unless the reader knows it, as NVML does). Raises ``TopologyParseError`` for devices
    beyond any node's (``device_problem``) or a model the wire rules refuse
    (``phalanx_proto.topology.topology_problem``)."""
    problem = device_problem(gpus, nics)
    if problem:
        raise TopologyParseError(problem)
    gpus, nics = numa_from_affinity(gpus, nics)
    nics = infer_nic_numa(gpus, nics, relations)
    if nvswitch is None:
        nvswitch = detect_nvswitch([g.name for g in gpus], relations)
    topo = NodeTopology(node=node, gpus=tuple(gpus), nics=tuple(nics), relations=relations,
                        nvswitch=nvswitch, source=source)
    problem = topology_problem(topo)
    if problem:
        raise TopologyParseError(problem)
    return topo
