"""Topology-aware gang placement: the engine the placement service, the simulator and the
benchmarks call. Pure: a ``Cluster`` (scratch state built from a ``Snapshot``) and a gang's
members in, a ``Decision`` or a ``NoFit`` with per-node reasons out.

Overview (docs/placement.md has the full objective):

1. **Filter** every node (enabled, heartbeat fresh, has GPUs) and count the reasons of those
   that fail, kube-scheduler style.
2. **Single member**: candidate nodes are visited from the tightest (fewest free whole GPUs
   that still suffice) upwards; the first ``CANDIDATES`` that fit are compared by the
   quality of the GPU set they would give (ring bottleneck, pairwise links, RDMA level),
   then by tightness (best fit keeps big holes for big requests), then by name.
3. **Gang**: domains from the network tiers, smallest first — one node, HyperNode, leaf
   switch, network-pod. At each tier, domains whose free whole GPUs cannot cover the gang's
   whole-GPU need are pruned before any detailed fit; the survivors are tried tightest first,
   packing members (largest first) onto the fewest nodes (nodes with most free GPUs first),
   each member's GPUs chosen as in 2. The first domain that holds every member wins: all or
   nothing. If no network-pod can hold it, the reason says so.

Per member kind: whole GPUs use ``gpuset.choose_gpus`` (or ``rdma.choose_gpus_and_nics``);
TDM shares go to GPUs with enough free core % and memory (best fit on one GPU, topology-aware
choice across several); MIG goes to MIG-enabled GPUs through ``mig.choose_gpu``. A GPU
carries whole, TDM or MIG work, never two kinds at once (R5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from phalanx_engine import mig
from phalanx_engine.gpuset import NoChoice, choose_gpus
from phalanx_engine.rdma import choose_gpus_and_nics
from phalanx_engine.snapshot import Decision, NodeView, NoFit, Snapshot
from phalanx_proto.events import Assignment, MemberSpec, RequestKind
from phalanx_topology.links import FABRIC_LINKS, LinkClass, link_rank

CANDIDATES = 8
"""Feasible nodes compared in detail for one member (bounds the decision time)."""

TIERS = ("node", "hypernode", "leaf", "netpod")
TIER_NAMES = {"node": "node", "hypernode": "HyperNode", "leaf": "leaf switch", "netpod": "network-pod"}

R_NOT_ENABLED = "not enabled for Phalanx"
R_STALE = "topology heartbeat stale"
R_NO_GPUS = "no GPUs reported"
R_GPUS = "insufficient free GPUs"
R_CORE = "insufficient aliyun.com/gpu-core"
R_MEMORY = "insufficient aliyun.com/gpu-memory"
R_MEM_UNKNOWN = "GPU memory not reported"
R_NO_MIG = "no MIG-capable GPU"
R_MIG_OFF = "MIG mode not enabled"
R_MIG_FULL = "no free MIG slot"
R_NO_RDMA = "no RDMA NIC"
R_AMD_SLICE = "AMD GPUs take whole-GPU requests only"
R_VENDOR = "GPU vendor does not match"


def _units(m: MemberSpec) -> int:
    """Whole free GPUs a member needs (0 for shares, which fit on partly used GPUs)."""
    return m.gpus if m.kind is RequestKind.WHOLE else 0


class NodeState:
    """Mutable scratch view of one node's free capacity (never shared between decisions)."""

    __slots__ = ("view", "whole", "core", "mem", "mig_inst", "gpus", "_free")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self.gpus = {g.index: g for g in view.topology.gpus}
        self.whole: set[int] = set()
        self.core: dict[int, int] = {}
        self.mem: dict[int, int] = {}
        self.mig_inst: dict[int, list[mig.MigInstance]] = {}
        self._free: set[int] | None = None
        for a in view.allocations:
            self.take(a)

    def copy(self) -> NodeState:
        other = NodeState.__new__(NodeState)
        other.view, other.gpus = self.view, self.gpus
        other.whole, other.core, other.mem = set(self.whole), dict(self.core), dict(self.mem)
        other.mig_inst = {k: list(v) for k, v in self.mig_inst.items()}
        other._free = self._free
        return other

    def take(self, a: Assignment) -> None:
        self._free = None
        match a.kind:
            case RequestKind.MIG:
                for g in a.gpus:
                    self.mig_inst.setdefault(g, []).append(mig.MigInstance(profile=a.mig_profile, start=a.mig_start))
            case RequestKind.TDM:
                for g in a.gpus:
                    self.core[g] = self.core.get(g, 0) + a.core_pct
                    self.mem[g] = self.mem.get(g, 0) + a.memory_mib
            case _:
                self.whole.update(a.gpus)

    def free_whole(self) -> set[int]:
        """GPUs with no work of any kind (and not in MIG mode). Cached until the next take."""
        if self._free is None:
            self._free = {i for i, g in self.gpus.items() if i not in self.whole and i not in self.core
                          and i not in self.mig_inst and not g.mig_enabled}
        return self._free

    def fit(self, m: MemberSpec) -> Assignment | str:
        """Where ``m`` would go on this node, or the reason it does not fit."""
        kind = m.kind
        if kind is RequestKind.NONE:
            return self._assignment(m, ())
        vendors = {g.vendor for g in self.gpus.values()}
        if m.vendor and m.vendor not in vendors:
            return R_VENDOR
        if kind is not RequestKind.WHOLE and vendors == {"amd"}:
            return R_AMD_SLICE
        if kind is RequestKind.WHOLE:
            return self._fit_whole(m)
        if kind is RequestKind.TDM:
            return self._fit_tdm(m)
        return self._fit_mig(m)

    def _fit_whole(self, m: MemberSpec) -> Assignment | str:
        free = self.free_whole()
        need = m.gpus
        if len(free) < need:
            return R_GPUS
        topo = self.view.topology
        if m.rdma:
            choice = choose_gpus_and_nics(topo, free, need)
            if isinstance(choice, NoChoice):
                return R_NO_RDMA if choice.code == "no-rdma-nic" else R_GPUS
            return self._assignment(m, choice.gpus.gpus, nics=choice.nics, rdma_level=str(choice.level))
        choice = choose_gpus(topo, free, need)
        if isinstance(choice, NoChoice):
            return R_GPUS
        return self._assignment(m, choice.gpus)

    def _fit_tdm(self, m: MemberSpec) -> Assignment | str:
        need = max(1, m.gpus)
        ok, why = [], Counter()
        for i, g in self.gpus.items():
            if i in self.whole or i in self.mig_inst or g.mig_enabled:
                why[R_GPUS] += 1
                continue
            if self.core.get(i, 0) + m.core_pct > 100:
                why[R_CORE] += 1
                continue
            if m.memory_mib:
                if not g.memory_mib:
                    why[R_MEM_UNKNOWN] += 1
                    continue
                if self.mem.get(i, 0) + m.memory_mib > g.memory_mib:
                    why[R_MEMORY] += 1
                    continue
            ok.append(i)
        if len(ok) < need:
            return why.most_common(1)[0][0] if why else R_GPUS
        if need == 1:
            # Best fit: the GPU left with the least free core, then least free memory.
            best = min(ok, key=lambda i: (100 - self.core.get(i, 0) - m.core_pct,
                                          self.gpus[i].memory_mib - self.mem.get(i, 0) - m.memory_mib, i))
            return self._assignment(m, (best,))
        choice = choose_gpus(self.view.topology, set(ok), need)
        if isinstance(choice, NoChoice):
            return R_GPUS
        return self._assignment(m, choice.gpus)

    def _fit_mig(self, m: MemberSpec) -> Assignment | str:
        capable = [g for g in self.gpus.values() if mig.mig_capable(g.model)]
        if not capable:
            return R_NO_MIG
        enabled = {g.index: g for g in capable if g.mig_enabled and g.index not in self.whole
                   and g.index not in self.core}
        if not enabled:
            return R_MIG_OFF
        gpus = {}
        for i, g in enabled.items():
            table = mig.mig_table(g.model, g.memory_mib)
            if table is not None:
                gpus[i] = mig.MigGpu(table=table, instances=tuple(self.mig_inst.get(i, ())))
        slot = mig.choose_gpu(gpus, m.mig_slices, m.memory_mib) if gpus else None
        if slot is None or isinstance(slot, NoChoice):
            return R_MIG_FULL
        return self._assignment(m, (slot.gpu,), mig_profile=slot.profile, mig_start=slot.start)

    def _assignment(self, m: MemberSpec, gpus: Iterable[int], **extra) -> Assignment:
        gpus = tuple(gpus)
        return Assignment(pod=m.pod, node=self.view.name, gpus=gpus,
                          gpu_uuids=tuple(self.gpus[i].uuid for i in gpus),
                          core_pct=m.core_pct, memory_mib=m.memory_mib, **extra)


def node_reason(view: NodeView) -> str | None:
    if not view.enabled:
        return R_NOT_ENABLED
    if not view.fresh:
        return R_STALE
    if not view.topology.gpus:
        return R_NO_GPUS
    return None


@dataclass
class Cluster:
    """The engine's working state: usable nodes' scratch capacity plus filter reasons."""

    nodes: dict[str, NodeState]
    total: int
    filtered: Counter = field(default_factory=Counter)
    by_free: dict[int, set[str]] = field(default_factory=dict)
    """Free whole-GPU count → node names: lets one member skip nodes that cannot hold it."""

    def __post_init__(self) -> None:
        for n, st in self.nodes.items():
            self.by_free.setdefault(len(st.free_whole()), set()).add(n)

    def tightest(self, need: int):
        """Node names with at least ``need`` free whole GPUs, tightest first, lazily."""
        for count in sorted(c for c in self.by_free if c >= need):
            yield from sorted(self.by_free[count])

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Cluster:
        nodes, filtered = {}, Counter()
        for view in snapshot.nodes:
            why = node_reason(view)
            if why is None:
                nodes[view.name] = NodeState(view)
            else:
                filtered[why] += 1
        return cls(nodes=nodes, total=len(snapshot.nodes), filtered=filtered)


def _quality(a: Assignment, state: NodeState) -> tuple:
    """Larger is better: RDMA level, then the GPU set's links."""
    rdma = {"pcie-switch": 3, "numa": 2, "socket": 1, "cross-socket": 0}.get(a.rdma_level, 3)
    topo = state.view.topology
    names = [state.gpus[i].name for i in a.gpus]
    worst = (int(LinkClass.NVLINK) + 1, FABRIC_LINKS + 1)
    total = 0
    for x in range(len(names)):
        for y in range(x + 1, len(names)):
            r = link_rank(topo.relation(names[x], names[y]), nvswitch=topo.nvswitch)
            worst = min(worst, r)
            total += r[0] * 10_000 + r[1]
    return (rdma, worst, total)


def _place_one(states: dict[str, NodeState], m: MemberSpec, order: Iterable[str],
               reasons: Counter | None) -> Assignment | None:
    """The best node for one member among ``order`` (tightest first); ``fit`` never mutates."""
    best = None
    seen = 0
    for name in order:
        st = states[name]
        got = st.fit(m)
        if isinstance(got, str):
            if reasons is not None:
                reasons[got] += 1
            continue
        key = (_quality(got, st), _tightness(got, st), -len(st.free_whole()), _neg_name(name))
        if best is None or key > best[0]:
            best = (key, got)
        seen += 1
        if seen >= CANDIDATES:
            break
    return None if best is None else best[1]


def _tightness(a: Assignment, st: NodeState) -> tuple:
    """For a TDM share, larger when the chosen GPU is left with less free core % and memory:
    the tightest GPU anywhere in the cluster wins (the share-packing rule measured in
    docs/packing.md). Whole GPUs and MIG: neutral."""
    if a.kind is not RequestKind.TDM:
        return (0, 0)
    g = a.gpus[0]
    return (-(100 - st.core.get(g, 0) - a.core_pct), -(st.gpus[g].memory_mib - st.mem.get(g, 0) - a.memory_mib))


def _neg_name(name: str) -> tuple:
    return tuple(-ord(c) for c in name)


def decide(cluster: Cluster, members: tuple[MemberSpec, ...]) -> Decision | NoFit:
    """Place every member or none. ``cluster`` is not modified."""
    if not members:
        return Decision(assignments=())
    if len(members) == 1:
        m = members[0]
        got = _place_one(cluster.nodes, m, cluster.tightest(_units(m)), None)
        if got is None:
            reasons = Counter(cluster.filtered)
            for st in cluster.nodes.values():
                why = st.fit(m)
                reasons[why if isinstance(why, str) else R_GPUS] += 1
            return NoFit(total_nodes=cluster.total, reasons=reasons)
        return Decision(assignments=(got,))
    return _decide_gang(cluster, members)


def _domain(state: NodeState, tier: str) -> str:
    t = state.view.tiers
    value = {"node": state.view.name, "hypernode": t.hypernode, "leaf": t.leaf, "netpod": t.netpod}[tier]
    return value or f"node:{state.view.name}"


def _decide_gang(cluster: Cluster, members: tuple[MemberSpec, ...]) -> Decision | NoFit:
    need = sum(_units(m) for m in members)
    free = {n: len(st.free_whole()) for n, st in cluster.nodes.items()}
    ordered = sorted(members, key=lambda m: (-_units(m), -m.gpus, str(m.pod)))
    tried_any = False
    for tier in TIERS:
        domains: dict[str, list[str]] = {}
        for n, st in cluster.nodes.items():
            domains.setdefault(_domain(st, tier), []).append(n)
        candidates = sorted((sum(free[n] for n in ns), d) for d, ns in domains.items()
                            if sum(free[n] for n in ns) >= need)
        for _, d in candidates:
            tried_any = True
            got = _pack(cluster, domains[d], ordered, free)
            if got is not None:
                order = {m.pod: i for i, m in enumerate(members)}
                assignments = tuple(sorted(got, key=lambda a: order[a.pod]))
                return Decision(assignments=assignments)
    reasons = Counter(cluster.filtered)
    usable = len(cluster.nodes)
    if usable:
        reasons[f"cannot hold the gang's {len(members)} members within one {TIER_NAMES['netpod']}"] += usable
    detail = (f"gang of {len(members)} members needs {need} whole GPU(s) in one network-pod"
              + ("" if tried_any else "; no network-pod has that many free"))
    return NoFit(total_nodes=cluster.total, reasons=reasons, detail=detail)


def _pack(cluster: Cluster, names: list[str], members: list[MemberSpec], free: dict[str, int]
          ) -> list[Assignment] | None:
    """Members onto the fewest nodes of one domain, or None."""
    order = sorted(names, key=lambda n: (-free[n], n))
    states: dict[str, NodeState] = {}
    out = []
    for m in members:
        placed = None
        for n in order:
            st = states.get(n)
            if st is None:
                st = states[n] = cluster.nodes[n].copy()
            got = st.fit(m)
            if not isinstance(got, str):
                placed = got
                st.take(got)
                break
        if placed is None:
            return None
        out.append(placed)
    return out


def place_snapshot(snapshot: Snapshot, members: tuple[MemberSpec, ...]) -> Decision | NoFit:
    """One-shot convenience: build the scratch state and decide."""
    return decide(Cluster.from_snapshot(snapshot), members)

