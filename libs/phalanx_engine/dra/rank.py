"""Which valid DRA allocation to prefer: the best-connected GPUs. Upstream's allocator takes
the first devices that fit, in pool/slice/device order; any valid allocation is as acceptable to
Kubernetes, so Phalanx tries GPU devices in the order of its own intra-node choice
(``phalanx_engine.gpuset``: NVLink-best set first, leftover quality kept). Made by the caller
of ``phalanx_engine.dra.allocate`` (one per node topology) and passed to it.

Joining devices to the node's GPUs (``NodeTopology.gpus``): a device is a GPU when its NVIDIA
``uuid`` attribute (``gpu.nvidia.com``'s unqualified ``uuid``) is that GPU's UUID; a device
without such a match sits on the GPU whose PCI address is its
``resource.kubernetes.io/pciBusID`` (a MIG device: its parent). PCI addresses are compared
case-blind, with the domain as a number (``0000:65:00.0`` is ``00000000:65:00.0``). Only devices
that *are* GPUs (by UUID, or by PCI address when they have no UUID at all) are ranked; a device
on a GPU (MIG) only reports it (``ClaimAllocated.gpus``).

The ranking, for one request of ``k`` devices: when every free candidate is a distinct GPU,
the ``k``-sets in ``gpuset.ranked_sets`` order; otherwise upstream's order (combinations in
pool/slice/device order). A NIC tied to a GPU by ``matchAttribute:
resource.kubernetes.io/pcieRoot`` then follows from the constraint.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache

from phalanx_engine.dra.pools import Candidate
from phalanx_engine.gpuset import ranked_sets
from phalanx_proto.dra import NVIDIA_GPU_DRIVER, NVIDIA_UUID, PCI_BUS_ID
from phalanx_proto.topology import NodeTopology

_UUID_FQN = f"{NVIDIA_GPU_DRIVER}/{NVIDIA_UUID}"
_RANKABLE = 1024


@lru_cache(maxsize=4096)
def pci_address(text: str) -> str:
    """A PCI address in one form: lower case, a 4-digit domain (``0000:65:00.0``); the text
    itself, lower-cased, when it is not shaped like one."""
    t = text.strip().lower()
    parts = t.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return t
    if len(parts) == 2:  # no domain: domain 0
        return f"0000:{t}"
    return t


class Ranking:
    """How ``allocate`` orders its choices on one node, and how it names the GPUs it gave.
    ``connected=False`` keeps upstream's first-fit order but still reports GPUs. Keep one per
    node topology (with the node's ``NodeDevices``): it remembers each device's GPU."""

    __slots__ = ("topology", "connected", "_by_uuid", "_by_pci", "_joined", "_rankable")

    def __init__(self, topology: NodeTopology, *, connected: bool = True) -> None:
        self.topology = topology
        self.connected = connected
        self._by_uuid = {g.uuid: g.index for g in topology.gpus if g.uuid}
        self._by_pci = {pci_address(g.pci_bus_id): g.index for g in topology.gpus if g.pci_bus_id}
        self._joined: dict[tuple[str, str, str], tuple[int, bool] | None] = {}
        self._rankable: OrderedDict[tuple[Candidate, ...], bool] = OrderedDict()

    def join(self, device: Candidate) -> tuple[int, bool] | None:
        """(GPU index, whether the device is that whole GPU), or None when it is on no GPU."""
        key = device.key
        if key not in self._joined:
            self._joined[key] = self._join(device)
        return self._joined[key]

    def ranks(self, candidates: tuple[Candidate, ...]) -> bool:
        """Could a request with these candidates be ranked (each a whole GPU, none twice)?"""
        hit = self._rankable.get(candidates)
        if hit is None:
            seen: set[int] = set()
            hit = self.connected
            for d in candidates if hit else ():
                j = self.join(d)
                if j is None or not j[1] or j[0] in seen:
                    hit = False
                    break
                seen.add(j[0])
            self._rankable[candidates] = hit
            if len(self._rankable) > _RANKABLE:
                self._rankable.popitem(last=False)
        return hit

    def _join(self, device: Candidate) -> tuple[int, bool] | None:
        attrs = device.device.attributes
        uuid = attrs.get(_UUID_FQN) or (attrs.get(NVIDIA_UUID) if device.key[0] == NVIDIA_GPU_DRIVER else None)
        if uuid is not None and uuid.string in self._by_uuid:
            return self._by_uuid[uuid.string], True
        pci = attrs.get(PCI_BUS_ID)
        if pci is not None and pci.string:
            index = self._by_pci.get(pci_address(pci.string))
            if index is not None:
                return index, uuid is None
        return None

    def gpus(self, devices: Iterable[Candidate]) -> tuple[int, ...]:
        """The GPUs (sorted indices) the devices are or sit on."""
        found = {j[0] for d in devices if (j := self.join(d)) is not None}
        return tuple(sorted(found))

    def orders(self, free: Sequence[Candidate], count: int) -> Iterator[tuple[int, ...]] | None:
        """Positions in ``free`` to try, set by set, when this request is ranked; None: try
        upstream's combinations."""
        if not self.connected or count > len(free):
            return None
        at: dict[int, int] = {}
        for pos, d in enumerate(free):
            j = self.join(d)
            if j is None or not j[1] or j[0] in at:
                return None
            at[j[0]] = pos
        return (tuple(sorted(at[g] for g in gpus)) for gpus in ranked_sets(self.topology, set(at), count))
