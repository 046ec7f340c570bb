"""One node's free capacity during a decision: the scratch state every plugin reads.

Built from a ``NodeView`` (the immutable snapshot: topology, reservations, Kubernetes state);
``take`` books an assignment into it. A decision copies the nodes it changes (``copy``), so
the ``Cluster`` it started from is never modified (style rule 4).
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx_engine import mig
from phalanx_engine.dra import NodeDevices, Ranking, gather
from phalanx_engine.snapshot import NodeView
from phalanx_proto.dra import ClaimAllocated
from phalanx_proto.events import Assignment, RequestKind
from phalanx_proto.scheduling import HostPort, RunningPod

ANY_IP = "0.0.0.0"


def port_key(p: HostPort) -> tuple[str, str, int]:
    """(host IP, protocol, port) with kube-scheduler's defaults: no IP is every IP."""
    return (p.host_ip or ANY_IP, p.protocol or "TCP", p.port)


class _NodeDra:
    """A node's DRA devices and their ranking, kept for the view they were read from (shared by
    the node's scratch copies)."""

    __slots__ = ("devices", "ranking", "_on_gpu")

    def __init__(self, devices: NodeDevices, ranking: Ranking) -> None:
        self.devices, self.ranking = devices, ranking
        self._on_gpu: dict[tuple[str, str, str], int] | None = None

    def on_gpu(self) -> dict[tuple[str, str, str], int]:
        if self._on_gpu is None:
            self._on_gpu = {c.key: j[0] for c in self.devices.candidates if (j := self.ranking.join(c)) is not None}
        return self._on_gpu


class NodeState:
    """Mutable scratch view of one node: which GPUs carry whole, TDM or MIG work (R5: never
    two kinds on one GPU), core % and GPU memory taken per shared GPU, MIG instances per GPU;
    and for the Kubernetes filters the resources requested, the pods and the host ports in
    use — by pods Phalanx did not place (``NodeView.kube``) plus Phalanx's reservations."""

    __slots__ = ("view", "gpus", "unhealthy", "whole", "core", "mem", "mig_inst", "_free", "_capacity", "_vendors",
                 "requested", "pods", "ports", "memo", "_dra", "claims",
                 "running")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.unhealthy = frozenset(view.unhealthy) & {g.index for g in view.topology.gpus}
        """The node's GPUs reported unhealthy (``NodeView.unhealthy``)."""
        self.gpus = {g.index: g for g in view.topology.gpus if g.index not in self.unhealthy}
        """The GPUs new work may use: every GPU of the node but the unhealthy ones. A reservation
        already on an unhealthy GPU is booked all the same (``take``) until it is released."""
        self.whole: set[int] = set()
        self.core: dict[int, int] = {}
        self.mem: dict[int, int] = {}
        self.mig_inst: dict[int, list[mig.MigInstance]] = {}
        self._free: set[int] | None = None
        self._capacity = -1
        self._vendors: frozenset[str] | None = None
        kube = view.kube
        self.requested: dict[str, int] = dict(kube.requested) if kube else {}
        self.pods = kube.pods if kube else 0
        self.ports: set[tuple[str, str, int]] = {port_key(p) for p in kube.host_ports} if kube else set()
        self.running: list[RunningPod] = list(kube.running) if kube else []
        """The pods on the node as pod (anti-)affinity sees them: those Phalanx did not place,
        then its reservations (``take``)."""
        self.memo: dict[bytes, tuple] = {}
        """Per member shape, what the single-member search found here (``candidates``); emptied
        by ``take``, the only way the state changes."""
        self._dra: _NodeDra | None = None
        self.claims: list[ClaimAllocated] = []
        """The ResourceClaim allocations the node's reservations hold (``take``)."""
        for a in view.allocations:
            self.take(a)
        if any(p.in_use for p in view.dra):  # GPUs other schedulers gave through DRA are not free here
            on_gpu = self.dra_gpus()
            self.whole.update(g for p in view.dra for u in p.in_use
                              if (g := on_gpu.get((p.driver, p.pool, u.device))) is not None)

    @property
    def name(self) -> str:
        return self.view.name

    def copy(self) -> NodeState:
        other = NodeState.__new__(NodeState)
        other.view, other.gpus, other.unhealthy = self.view, self.gpus, self.unhealthy
        other.whole, other.core, other.mem = set(self.whole), dict(self.core), dict(self.mem)
        other.mig_inst = {k: list(v) for k, v in self.mig_inst.items()}
        other._free, other._capacity, other._vendors = self._free, self._capacity, self._vendors
        other.requested, other.pods, other.ports = dict(self.requested), self.pods, set(self.ports)
        other.memo = {}
        other._dra = self._dra
        other.claims = list(self.claims)
        other.running = list(self.running)
        return other

    def take(self, a: Assignment) -> None:
        """Book ``a`` (a reservation read from the ledger, or one just decided)."""
        self._free = None
        if self.memo:
            self.memo = {}
        self.pods += 1
        for r, q in a.requests.items():
            self.requested[r] = self.requested.get(r, 0) + q
        self.ports.update(port_key(p) for p in a.host_ports)
        self.running.append(RunningPod(namespace=a.pod.namespace, labels=a.labels, anti_affinity=a.anti_affinity))
        match a.kind:
            case RequestKind.MIG:
                for g in a.gpus:
                    self.mig_inst.setdefault(g, []).append(mig.MigInstance(profile=a.mig_profile, start=a.mig_start))
            case RequestKind.TDM:
                for g in a.gpus:
                    self.core[g] = self.core.get(g, 0) + a.core_pct
                    self.mem[g] = self.mem.get(g, 0) + a.memory_mib
            case RequestKind.WHOLE:
                self.whole.update(a.gpus)
        for c in a.claims:  # a GPU a claim's device is, or sits on, is not free for a whole-GPU request
            self.whole.update(c.gpus)
            self.claims.append(c)

    # -- Dynamic Resource Allocation (docs/dra.md) ---------------------------------------------
    def _dra_of(self) -> _NodeDra:
        if self._dra is None:
            kube = self.view.kube
            devices = gather(self.view.dra, self.view.name, kube.labels if kube is not None else {})
            self._dra = _NodeDra(devices, Ranking(self.view.topology))
        return self._dra

    def dra(self) -> NodeDevices:
        """The DRA devices the node reaches (kept with the view: it caches what selectors said)."""
        return self._dra_of().devices

    def ranking(self) -> Ranking:
        """How the node's DRA devices are joined to its GPUs and ranked."""
        return self._dra_of().ranking

    def dra_gpus(self) -> dict[tuple[str, str, str], int]:
        """Each DRA device that is, or sits on, one of the node's GPUs → that GPU."""
        return self._dra_of().on_gpu()

    def whole_gpus_of(self, claims: Iterable[ClaimAllocated]) -> tuple[int, ...]:
        """The node's GPUs that allocated devices are, whole (not a MIG device on one)."""
        nd = self._dra_of()
        out = set()
        for c in claims:
            for d in c.allocation.devices:
                cand = nd.devices.by_key.get((d.driver, d.pool, d.device))
                joined = nd.ranking.join(cand) if cand is not None else None
                if joined is not None and joined[1]:
                    out.add(joined[0])
        return tuple(sorted(out))

    def compute_domains(self) -> set[str]:
        """The ComputeDomains whose channels the node's reservations hold."""
        return {c.compute_domain for c in self.claims if c.compute_domain}

    def plugin_gpus(self) -> set[int]:
        """GPUs held for whole, shared or MIG work by any reservation (a claim's included)."""
        return self.whole | set(self.core) | set(self.mig_inst)

    def free_whole(self) -> set[int]:
        """GPUs with no work of any kind (and not in MIG mode). Cached until the next take."""
        if self._free is None:
            self._free = {i for i, g in self.gpus.items() if i not in self.whole and i not in self.core
                          and i not in self.mig_inst and not g.mig_enabled}
        return self._free

    def vendors(self) -> frozenset[str]:
        """The vendors of the node's GPUs, unhealthy ones included (fixed for the node)."""
        if self._vendors is None:
            self._vendors = frozenset(g.vendor for g in self.view.topology.gpus)
        return self._vendors

    def whole_capacity(self) -> int:
        """GPUs that could ever be given whole: every healthy GPU not in MIG mode."""
        if self._capacity < 0:
            self._capacity = sum(1 for g in self.gpus.values() if not g.mig_enabled)
        return self._capacity
