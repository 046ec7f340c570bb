"""A PCIe tree that reproduces a topology's PCIe relations, for ``phalanx_nvmlfake.nvml``.

A matrix only says how devices relate, not where they sit. To run the real adapter on fake
hardware, the fake needs PCI paths from which ``phalanx_nvml.pcie`` computes the same
relations. Overview of the construction (each step refuses relations that are not a tree):

1. host bridges: devices joined by PIX/PXB/PHB share one (union-find);
2. root ports: within a bridge, devices joined by PIX/PXB share one; others meet at the bridge;
3. switches: within a port, devices joined by PIX share one switch; several PIX groups under
   one port hang off an upper switch, so they meet two switches apart (PXB);
4. between bridges the relation is NODE or SYS, one value per bridge pair. The fake NVML
   answers it for GPU pairs; for a bridge without GPUs the adapter uses NUMA, so the fake
   checks that NUMA gives the same answer.

NVLink pairs (``NV#``) carry no PCIe relation in the matrix; they are "don't care" above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from phalanx_nvml.pcie import numa_relation, same_bridge_relation

Relation = Callable[[str, str], "str | None"]
"""The PCIe relation of two devices, or None when the matrix shows NVLink instead."""


@dataclass(slots=True)
class _Buses:
    """Hands out PCI bus numbers; a bus is 8 bits."""

    last: int = -1

    def take(self) -> int:
        self.last += 1
        if self.last > 0xFF:
            raise ValueError("the fake PCIe tree needs more than 256 buses")
        return self.last


@dataclass(frozen=True, slots=True)
class PciLayout:
    paths: dict[str, tuple[str, ...]]
    """Device → PCI path (host bridge first, the device's own bus id last)."""
    bridge_relation: dict[tuple[str, str], str] = field(default_factory=dict)
    """(bridge, bridge) → NODE or SYS, both orders."""

    def relation(self, a: str, b: str) -> str:
        pa, pb = self.paths[a], self.paths[b]
        if pa[0] == pb[0]:
            return same_bridge_relation(pa, pb)
        return self.bridge_relation[(pa[0], pb[0])]


def _groups(names: Sequence[str], rel: Relation, joining: set[str]) -> list[list[str]]:
    """Union-find of ``names`` by pairs whose relation is in ``joining``; groups in name order."""
    parent = {n: n for n in names}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if rel(a, b) in joining:
                parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def _refuse(group: list[str], rel: Relation, forbidden: set[str], what: str) -> None:
    for i, a in enumerate(group):
        for b in group[i + 1:]:
            r = rel(a, b)
            if r in forbidden:
                raise ValueError(f"no PCIe tree has {a}–{b} {r} while both share one {what} "
                                 f"with {', '.join(group)}")


def _endpoint(name: str, bus: int, bus_ids: dict[str, str]) -> str:
    return bus_ids.get(name) or f"0000:{bus:02x}:00.0"


def _port(members: list[str], rel: Relation, prefix: tuple[str, ...], buses: _Buses,
          bus_ids: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Paths below one root port: one switch per PIX group, under an upper switch if several."""
    switches = _groups(members, rel, {"PIX"})
    _refuse(members, rel, {"PHB"}, "root port")
    for sw in switches:
        _refuse(sw, rel, {"PXB"}, "PCIe switch")
    up_bus = buses.take()
    up = f"0000:{up_bus:02x}:00.0"
    inner = buses.take()
    paths = {}
    if len(switches) == 1:
        for d, dev in enumerate(switches[0]):
            down = f"0000:{inner:02x}:{d:02x}.0"
            paths[dev] = (*prefix, up, down, _endpoint(dev, buses.take(), bus_ids))
        return paths
    for s, sw in enumerate(switches):
        down1 = f"0000:{inner:02x}:{s:02x}.0"
        up2 = f"0000:{buses.take():02x}:00.0"
        inner2 = buses.take()
        for d, dev in enumerate(sw):
            down2 = f"0000:{inner2:02x}:{d:02x}.0"
            paths[dev] = (*prefix, up, down1, up2, down2, _endpoint(dev, buses.take(), bus_ids))
    return paths


def _between(bridges: dict[str, list[str]], rel: Relation, gpus: set[str],
             numa: dict[str, int]) -> dict[tuple[str, str], str]:
    """NODE/SYS for every pair of bridges, checked against the matrix (see module doc, step 4)."""
    out: dict[tuple[str, str], str] = {}
    roots = list(bridges)
    for i, ra in enumerate(roots):
        for rb in roots[i + 1:]:
            pairs = [(a, b, rel(a, b)) for a in bridges[ra] for b in bridges[rb]]
            known = {r for _, _, r in pairs if r is not None}
            if len(known) > 1:
                raise ValueError(f"devices of two host bridges relate as {' and '.join(sorted(known))}: "
                                 f"{', '.join(bridges[ra])} / {', '.join(bridges[rb])}")
            has_gpus = gpus & set(bridges[ra]) and gpus & set(bridges[rb])
            if not has_gpus:
                for a, b, r in pairs:
                    if r is not None and numa_relation(numa[a], numa[b]) != r:
                        raise ValueError(f"{a}–{b} is {r}, but a host bridge without GPUs relates by "
                                         f"NUMA ({numa[a]} vs {numa[b]}) as {numa_relation(numa[a], numa[b])}")
            if known:
                value = known.pop()
            else:
                ids = {numa[g] for g in (*bridges[ra], *bridges[rb]) if g in gpus}
                value = "NODE" if len(ids) == 1 and min(ids) >= 0 else "SYS"
            out[(ra, rb)] = out[(rb, ra)] = value
    return out


def layout(names: Sequence[str], rel: Relation, *, gpus: set[str], numa: dict[str, int],
           bus_ids: dict[str, str] | None = None) -> PciLayout:
    """PCI paths for ``names`` whose relations reproduce ``rel``; raises ValueError when the
    relations cannot come from any PCIe tree. ``bus_ids`` fixes a device's own address."""
    bus_ids = bus_ids or {}
    buses = _Buses()
    bridge_groups = _groups(names, rel, {"PIX", "PXB", "PHB"})
    paths: dict[str, tuple[str, ...]] = {}
    bridges: dict[str, list[str]] = {}
    for members in bridge_groups:
        _refuse(members, rel, {"NODE", "SYS"}, "host bridge")
        root_bus = buses.take()
        root = f"pci0000:{root_bus:02x}"
        bridges[root] = members
        for p, port in enumerate(_groups(members, rel, {"PIX", "PXB"})):
            root_port = f"0000:{root_bus:02x}:{p + 1:02x}.0"
            paths.update(_port(port, rel, (root, root_port), buses, bus_ids))
    return PciLayout(paths=paths, bridge_relation=_between(bridges, rel, gpus, numa))
