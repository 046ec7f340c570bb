"""The GPU plugins: node usability, vendor, whole GPUs, TDM shares, MIG, RDMA, their scores,
and the gang's network-domain capacity.

Reason texts are Phalanx's own (kube-scheduler has no GPU-topology plugins); codes are in
``status.Code``. Resolvability: a shortfall that an empty node would not have is resolvable
(other reservations may leave); a node that could never serve the request (wrong vendor, no
MIG-capable GPU, a request larger than the node) is not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from phalanx_engine import mig
from phalanx_engine.framework import Member
from phalanx_engine.gpuset import NoChoice, choose_gpus
from phalanx_engine.nodestate import NodeState
from phalanx_engine.rdma import choose_gpus_and_nics
from phalanx_engine.snapshot import NodeView
from phalanx_engine.status import Code, Status, refuse
from phalanx_proto.events import Assignment, RequestKind
from phalanx_proto.kubeapi import GPU_CORE, GPU_MEMORY
from phalanx_topology.links import FABRIC_LINKS, LinkClass, link_rank

R_NOT_ENABLED = "not enabled for Phalanx"
R_INVALID = "node report invalid"
R_NODE_ERROR = "node could not be evaluated"
R_STALE = "topology heartbeat stale"
R_NO_GPUS = "no GPUs reported"
R_GPUS = "insufficient free GPUs"
R_UNHEALTHY = "GPU reported unhealthy"
R_CORE = f"insufficient {GPU_CORE}"
R_MEMORY = f"insufficient {GPU_MEMORY}"
R_MEM_UNKNOWN = "GPU memory not reported"
R_NO_MIG = "no MIG-capable GPU"
R_MIG_OFF = "MIG mode not enabled"
R_MIG_FULL = "no free MIG slot"
R_NO_RDMA = "no RDMA NIC"
R_AMD_SLICE = "AMD GPUs take whole-GPU requests only"
R_VENDOR = "GPU vendor does not match"


def node_usable(view: NodeView) -> Status | None:
    """The pod-independent check, done once when the cluster is built: the node's records
    can be believed, its labels enable Phalanx and its topology heartbeat is fresh. None is
    resolvable by waiting for other pods (a stale node is like kube-scheduler's not-ready
    taint: unresolvable)."""
    if view.invalid:
        return refuse("NodeUsable", Code.REPORT_INVALID, R_INVALID, resolvable=False, detail=view.invalid)
    if not view.enabled:
        return refuse("NodeUsable", Code.NOT_ENABLED, R_NOT_ENABLED, resolvable=False)
    if not view.fresh:
        return refuse("NodeUsable", Code.HEARTBEAT_STALE, R_STALE, resolvable=False)
    return None


def unhealthy(node: NodeState) -> str:
    """``GPU 1, 3 reported unhealthy`` for a node with unhealthy GPUs (a refusal's detail), else
    "": those GPUs take no new work (``NodeState.gpus`` leaves them out)."""
    return f"GPU {', '.join(map(str, sorted(node.unhealthy)))} reported unhealthy" if node.unhealthy else ""


def assignment(member: Member, node: NodeState, gpus: Iterable[int], *, nics: tuple[str, ...] = (),
               rdma_level: str = "", mig_profile: str = "", mig_start: int = -1) -> Assignment:
    """The assignment of ``member`` to ``gpus`` of ``node`` (and NICs, or a MIG slot: the
    defaults are ``Assignment``'s). It carries the member's other requests and host ports, so
    the ledger accounts for them, and its labels and anti-affinity terms, so pod (anti-)affinity
    sees it there."""
    gpus = tuple(gpus)
    m = member.spec
    return Assignment(pod=m.pod, node=node.name, gpus=gpus, gpu_uuids=tuple(node.gpus[i].uuid for i in gpus),
                      core_pct=m.core_pct, memory_mib=m.memory_mib, requests=m.requests, host_ports=m.host_ports,
                      nics=nics, rdma_level=rdma_level, mig_profile=mig_profile, mig_start=mig_start,
                      labels=m.labels, anti_affinity=m.pod_anti_affinity)


class GpuPresent:
    """A GPU request needs a node that reported GPUs."""

    name = "GpuPresent"

    def applies(self, member: Member) -> bool:
        return member.kind is not RequestKind.NONE

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if member.kind is RequestKind.NONE or node.gpus:
            return None
        if node.unhealthy:
            return refuse(self.name, Code.GPU_UNHEALTHY, R_UNHEALTHY, resolvable=False, detail=unhealthy(node))
        return refuse(self.name, Code.NO_GPUS, R_NO_GPUS, resolvable=False)


class GpuVendor:
    """The vendor hint must match a GPU of the node; AMD GPUs take whole GPUs only."""

    name = "GpuVendor"

    def applies(self, member: Member) -> bool:
        return member.kind is not RequestKind.NONE

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if member.kind is RequestKind.NONE:
            return None
        vendors = node.vendors()
        if member.spec.vendor and member.spec.vendor not in vendors:
            return refuse(self.name, Code.GPU_VENDOR, R_VENDOR, resolvable=False, detail=member.spec.vendor)
        if member.kind is not RequestKind.WHOLE and vendors == {"amd"}:
            return refuse(self.name, Code.AMD_WHOLE_ONLY, R_AMD_SLICE, resolvable=False)
        return None


class RdmaNic:
    """Joint GPU + NIC placement needs an RDMA-capable NIC on the node."""

    name = "RdmaNic"

    def applies(self, member: Member) -> bool:
        return member.spec.rdma

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if not member.spec.rdma or any(n.rdma for n in node.view.topology.nics):
            return None
        return refuse(self.name, Code.NO_RDMA_NIC, R_NO_RDMA, resolvable=False)


class WholeGpus:
    """Whole GPUs: enough GPUs with no work at all; the set by the topology objective
    (``gpuset.choose_gpus``), or GPUs and NICs together for RDMA (``rdma``)."""

    name = "WholeGpus"

    def applies(self, member: Member) -> bool:
        return member.kind is RequestKind.WHOLE

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if member.kind is not RequestKind.WHOLE:
            return None
        if len(node.free_whole()) >= member.units:
            return None
        return self._short(member, node)

    def allocate(self, member: Member, node: NodeState) -> Assignment | Status:
        free, need, topo = node.free_whole(), member.units, node.view.topology
        if member.spec.rdma:
            choice = choose_gpus_and_nics(topo, free, need)
            if isinstance(choice, NoChoice):
                if choice.code == "no-rdma-nic":
                    return refuse(self.name, Code.NO_RDMA_NIC, R_NO_RDMA, resolvable=False)
                return self._short(member, node)
            return assignment(member, node, choice.gpus.gpus, nics=choice.nics, rdma_level=str(choice.level))
        got = choose_gpus(topo, free, need)
        if isinstance(got, NoChoice):
            return self._short(member, node)
        return assignment(member, node, got.gpus)

    def _short(self, member: Member, node: NodeState) -> Status:
        """Too few free GPUs; said as "GPU reported unhealthy" where the unhealthy GPUs, were they
        healthy and idle, would have made up the difference."""
        capacity, free = node.whole_capacity(), len(node.free_whole())
        held = node.plugin_gpus() if node.unhealthy else set()
        idle_sick = sum(1 for g in node.view.topology.gpus
                        if g.index in node.unhealthy and g.index not in held and not g.mig_enabled)
        code, text = ((Code.GPU_UNHEALTHY, R_UNHEALTHY) if free + idle_sick >= member.units
                      else (Code.INSUFFICIENT_GPUS, R_GPUS))
        return refuse(self.name, code, text, resolvable=member.units <= capacity,
                      resource=member.spec.resource_name, requested=member.units, free=free,
                      capacity=capacity, detail=unhealthy(node))


class TdmShare:
    """TDM shares: ``gpus`` GPUs, each with ``core_pct`` and ``memory_mib`` still free and no
    whole or MIG work. One GPU: best fit (least core, then memory, left); several: the topology
    objective among the GPUs that can take the share."""

    name = "TdmShare"

    def applies(self, member: Member) -> bool:
        return member.kind is RequestKind.TDM

    def _usable(self, member: Member, node: NodeState) -> tuple[list[int], Counter[str]]:
        m, ok = member.spec, []
        why: Counter[str] = Counter()
        for i, g in node.gpus.items():
            if i in node.whole or i in node.mig_inst or g.mig_enabled:
                why[R_GPUS] += 1
            elif node.core.get(i, 0) + m.core_pct > 100:
                why[R_CORE] += 1
            elif m.memory_mib and not g.memory_mib:
                why[R_MEM_UNKNOWN] += 1
            elif m.memory_mib and node.mem.get(i, 0) + m.memory_mib > g.memory_mib:
                why[R_MEMORY] += 1
            else:
                ok.append(i)
        return ok, why

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if member.kind is not RequestKind.TDM:
            return None
        ok, why = self._usable(member, node)
        return None if len(ok) >= max(1, member.spec.gpus) else self._short(member, node, ok, why)

    def allocate(self, member: Member, node: NodeState) -> Assignment | Status:
        m, need = member.spec, max(1, member.spec.gpus)
        ok, why = self._usable(member, node)
        if len(ok) < need:
            return self._short(member, node, ok, why)
        if need == 1:
            best = min(ok, key=lambda i: (100 - node.core.get(i, 0) - m.core_pct,
                                          node.gpus[i].memory_mib - node.mem.get(i, 0) - m.memory_mib, i))
            return assignment(member, node, (best,))
        got = choose_gpus(node.view.topology, set(ok), need)
        return self._short(member, node, ok, why) if isinstance(got, NoChoice) else assignment(member, node, got.gpus)

    def _short(self, member: Member, node: NodeState, ok: list[int], why: Counter) -> Status:
        m, need = member.spec, max(1, member.spec.gpus)
        text = why.most_common(1)[0][0] if why else R_GPUS
        sharable = [i for i, g in node.gpus.items() if not g.mig_enabled]
        shared = [i for i in sharable if i not in node.whole and i not in node.mig_inst]
        # Would the share fit once every other reservation is gone?
        resolvable = sum(1 for i in sharable if not m.memory_mib or node.gpus[i].memory_mib >= m.memory_mib) >= need
        sick = unhealthy(node)
        if text == R_CORE:
            free = max((100 - node.core.get(i, 0) for i in shared), default=0)
            return refuse(self.name, Code.INSUFFICIENT_GPU_CORE, text, resolvable=resolvable,
                          resource="gpu-core", requested=m.core_pct, free=free, capacity=100, detail=sick)
        if text == R_MEMORY:
            free = max((node.gpus[i].memory_mib - node.mem.get(i, 0) for i in shared), default=0)
            capacity = max((node.gpus[i].memory_mib for i in shared), default=0)
            return refuse(self.name, Code.INSUFFICIENT_GPU_MEMORY, text, resolvable=resolvable,
                          resource="gpu-memory", requested=m.memory_mib, free=free, capacity=capacity, detail=sick)
        if text == R_MEM_UNKNOWN:
            return refuse(self.name, Code.GPU_MEMORY_UNKNOWN, text, resolvable=False)
        return refuse(self.name, Code.INSUFFICIENT_GPUS, R_GPUS, resolvable=resolvable,
                      resource="gpus", requested=need, free=len(ok), capacity=len(sharable), detail=sick)


class MigSlice:
    """MIG: a MIG-capable GPU in MIG mode with a legal free slot for the profile
    (``mig.choose_gpu``: the slot that keeps the most capacity, partly used GPUs first)."""

    name = "MigSlice"

    def applies(self, member: Member) -> bool:
        return member.kind is RequestKind.MIG

    def filter(self, member: Member, node: NodeState) -> Status | None:
        if member.kind is not RequestKind.MIG:
            return None
        capable = [g for g in node.gpus.values() if mig.mig_capable(g.model)]
        if not capable:
            return refuse(self.name, Code.NO_MIG_GPU, R_NO_MIG, resolvable=False)
        if not any(g.mig_enabled for g in capable):
            return refuse(self.name, Code.MIG_NOT_ENABLED, R_MIG_OFF, resolvable=False)
        return None

    def allocate(self, member: Member, node: NodeState) -> Assignment | Status:
        m = member.spec
        tables = {g.index: mig.mig_table(g.model, g.memory_mib) for g in node.gpus.values()
                  if g.mig_enabled and mig.mig_capable(g.model) and g.index not in node.whole
                  and g.index not in node.core}
        gpus = {i: mig.MigGpu(table=t, instances=tuple(node.mig_inst.get(i, ()))) for i, t in tables.items() if t}
        slot = mig.choose_gpu(gpus, m.mig_slices, m.memory_mib) if gpus else None
        if slot is None or isinstance(slot, NoChoice):
            legal = any(mig.profile_for(t, m.mig_slices, m.memory_mib) for t in tables.values() if t)
            return refuse(self.name, Code.NO_MIG_SLOT, R_MIG_FULL, resolvable=legal, detail=unhealthy(node))
        return assignment(member, node, (slot.gpu,), mig_profile=slot.profile, mig_start=slot.start)


class NoGpu:
    """A member without GPUs takes none (its CPU, memory and ports are the other plugins')."""

    name = "NoGpu"

    def allocate(self, member: Member, node: NodeState) -> Assignment | Status:
        return assignment(member, node, ())


_RDMA_RANK = {"pcie-switch": 3, "numa": 2, "socket": 1, "cross-socket": 0}
_NO_PAIR = (int(LinkClass.NVLINK) + 1, FABRIC_LINKS + 1)


class GpuTopology:
    """The GPU set's quality: RDMA level, then the slowest pair link, then the pairwise sum."""

    name = "GpuTopology"

    def score(self, member: Member, node: NodeState, a: Assignment) -> tuple:
        if len(a.gpus) < 2:  # no pair: every single GPU (or none) ties on links
            return (_RDMA_RANK.get(a.rdma_level, 3), _NO_PAIR, 0)
        topo = node.view.topology
        names = [node.gpus[i].name for i in a.gpus]
        worst = _NO_PAIR
        total = 0
        for x in range(len(names)):
            for y in range(x + 1, len(names)):
                r = link_rank(topo.relation(names[x], names[y]), nvswitch=topo.nvswitch)
                worst = min(worst, r)
                total += r[0] * 10_000 + r[1]
        return (_RDMA_RANK.get(a.rdma_level, 3), worst, total)


class TdmTightness:
    """For a TDM share, larger when the chosen GPU is left with less free core % and memory:
    the tightest GPU wins (the share-packing rule measured in docs/packing.md). Neutral
    for every other kind."""

    name = "TdmTightness"

    def score(self, member: Member, node: NodeState, a: Assignment) -> tuple:
        if a.kind is not RequestKind.TDM:
            return (0, 0)
        g = a.gpus[0]
        return (-(100 - node.core.get(g, 0) - a.core_pct),
                -(node.gpus[g].memory_mib - node.mem.get(g, 0) - a.memory_mib))


class FewestFreeGpus:
    """Best fit across nodes: the node with the fewest free whole GPUs keeps big holes for
    big requests."""

    name = "FewestFreeGpus"

    def score(self, member: Member, node: NodeState, a: Assignment) -> int:
        return -len(node.free_whole())


class GangGpuCapacity:
    """A gang is tried in a network domain only if the domain's free whole GPUs cover the
    whole GPUs its members need (before any per-node fit)."""

    name = "GangGpuCapacity"

    def filter_domain(self, members: Sequence[Member], nodes: Sequence[NodeState]) -> Status | None:
        need = sum(m.units for m in members)
        free = sum(len(n.free_whole()) for n in nodes)
        if free >= need:
            return None
        capacity = sum(n.whole_capacity() for n in nodes)
        return refuse(self.name, Code.GANG_DOMAIN, "not enough free GPUs in the domain",
                      resolvable=need <= capacity, resource="gpus", requested=need, free=free, capacity=capacity)
