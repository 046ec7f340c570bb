"""The stranding-aware packing score (docs/packing.md): FGD's fragmentation of a node against a
workload mix, plus the GPU capacity the node's free CPU can no longer feed.

``StrandingScore`` is a score plugin: for one placement it compares the node's fragmentation
before and after, ``floor(100 * sigmoid((F'(n) - F'(n')) / 1000))``, where

* ``F'(n) = F(n) + w * S(n)``;
* ``S(n) = max(0, G - cpu_free / c)``: of the node's free GPU capacity ``G`` (in milli of a
  GPU: 1000 per free whole GPU, ``10 x`` the free core percent of a shared one), what its
  free CPU cannot feed at ``c`` CPU millicores per GPU milli (what the workload asks; 10.9 on
  the openb trace, about 11 cores per GPU);
* ``F(n)`` is FGD's expected fragmentation against a ``ShapeMix`` (Weng et al., USENIX
  ATC'23), or 0 without one.

It ranks after the GPU-topology and TDM-tightness scores, so a share still goes to the tightest
GPU and this score decides between equally tight choices (which node opens a fresh GPU). A
node without reported Kubernetes state (no free CPU known) scores neutrally.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

from phalanx_engine.framework import Member
from phalanx_engine.nodestate import NodeState
from phalanx_proto.events import Assignment, MemberSpec, RequestKind
from phalanx_proto.scheduling import CPU

MILLI = 1000
CPU_PER_GPU_MILLI = 11.0
"""CPU millicores per GPU milli when the mix does not say (about 11 cores per GPU)."""
_MEMO_LIMIT = 1_000_000


def gpu_milli(spec: MemberSpec) -> tuple[int, int]:
    """(milli of each GPU, GPUs) a member takes: 1000 for whole GPUs, ten times the core
    percent for a TDM share; (0, 0) for no GPU and for MIG (MIG GPUs are not shared capacity)."""
    match spec.kind:
        case RequestKind.WHOLE:
            return MILLI, spec.gpus
        case RequestKind.TDM:
            return spec.core_pct * 10, max(1, spec.gpus)
    return 0, 0


class ShapeMix:
    """The target workload FGD measures fragmentation against: request shapes (CPU milli, GPU
    milli, GPUs) with their probabilities. ``fragmentation`` is memoised (pure, bounded)."""

    def __init__(self, shapes: Iterable[tuple[int, int, int, float]]) -> None:
        self.shapes = tuple(shapes)
        self.cpu_only = sum(p for _, _, n, p in self.shapes if n == 0)
        self._gpu = tuple(s for s in self.shapes if s[2] > 0)
        self._memo: dict[tuple, float] = {}

    @classmethod
    def from_specs(cls, specs: Iterable[MemberSpec], coverage: float = 0.95) -> ShapeMix:
        """The most frequent shapes covering ``coverage`` of ``specs``, renormalised (FGD's rule)."""
        counts = Counter((s.requests.get(CPU, 0), *gpu_milli(s)) for s in specs)
        total, kept, covered = sum(counts.values()), [], 0
        for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], tuple(-x for x in kv[0]))):
            if covered >= coverage * total:
                break
            kept.append((shape, n))
            covered += n
        return cls((cpu, milli, n_gpus, k / covered) for (cpu, milli, n_gpus), k in kept)

    def cpu_per_gpu_milli(self) -> float:
        gpu = sum(p * milli * n for _, milli, n, p in self._gpu)
        return sum(p * cpu for cpu, _, _, p in self._gpu) / gpu if gpu else CPU_PER_GPU_MILLI

    def fragmentation(self, cpu_free: int, gpus_desc: tuple[int, ...]) -> float:
        """FGD's F: for each shape, all free GPU milli if the shape needs no GPU or does not fit
        (CPU, or too few GPUs with its milli), else the milli of the GPUs too small for it."""
        key = (cpu_free, gpus_desc)
        value = self._memo.get(key)
        if value is None:
            total = sum(gpus_desc)
            value = self.cpu_only * total
            for cpu, milli, n, p in self._gpu:
                if cpu > cpu_free or n > len(gpus_desc) or gpus_desc[n - 1] < milli:
                    value += p * total
                elif gpus_desc[-1] < milli:
                    value += p * sum(g for g in gpus_desc if g < milli)
            if len(self._memo) > _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = value
        return value


def free_milli(node: NodeState) -> dict[int, int]:
    """Free GPU milli per shareable GPU (not in MIG mode): 0 for a GPU with whole or MIG work."""
    return {i: _free(node, i) for i, g in node.gpus.items() if not g.mig_enabled}


def _free(node: NodeState, i: int) -> int:
    if i in node.whole or i in node.mig_inst or node.gpus[i].mig_enabled:
        return 0
    return MILLI - node.core.get(i, 0) * 10


class StrandingScore:
    """FGD's fragmentation (with a mix) plus CPU stranding, as a node score (module docstring)."""

    name = "StrandingScore"

    def __init__(self, mix: ShapeMix | None = None, cpu_per_gpu: float | None = None, weight: float = 1.0,
                 kinds: frozenset[RequestKind] = frozenset(RequestKind)) -> None:
        self.mix = mix
        self.c = cpu_per_gpu or (mix.cpu_per_gpu_milli() if mix else CPU_PER_GPU_MILLI)
        self.weight = weight
        self.kinds = kinds
        """The request kinds it scores (others score neutrally); the placement profile scores
        every kind (docs/packing.md: whole GPUs and CPU-only pods are where most of the gain
        over FGD comes from)."""

    def _f(self, cpu_free: int, gpus: dict[int, int]) -> float:
        desc = tuple(sorted(gpus.values(), reverse=True))
        stranded = max(0.0, sum(desc) - cpu_free / self.c)
        return (self.mix.fragmentation(cpu_free, desc) if self.mix else 0.0) + self.weight * stranded

    def score(self, member: Member, node: NodeState, a: Assignment) -> int:
        kube = node.view.kube
        if kube is None or member.kind not in self.kinds:
            return 0
        cpu_free = kube.allocatable.get(CPU, 0) - node.requested.get(CPU, 0)
        cpu_after = cpu_free - member.spec.requests.get(CPU, 0)
        milli, _ = gpu_milli(member.spec)
        if self.mix is None:  # F' is the stranding term alone: no need to sort the GPUs
            total = len(node.free_whole()) * MILLI + sum(MILLI - c * 10 for i, c in node.core.items()
                                                         if not node.gpus[i].mig_enabled)
            taken = sum(min(_free(node, g), milli) for g in a.gpus)
            x = self.weight * (max(0.0, total - cpu_free / self.c)
                               - max(0.0, total - taken - cpu_after / self.c)) / 1000
        else:
            before = free_milli(node)
            after = {g: m - (min(m, milli) if g in a.gpus else 0) for g, m in before.items()}
            x = (self._f(cpu_free, before) - self._f(cpu_after, after)) / 1000
        return 0 if x < -700 else int(1.0 / (1.0 + math.exp(-x)) * 100)


def stranded_milli(node: NodeState, cpu_per_gpu: float = CPU_PER_GPU_MILLI) -> float:
    """``S(n)``: the node's free GPU milli its free CPU cannot feed at ``cpu_per_gpu`` CPU
    millicores per GPU milli (0 without reported Kubernetes state). What ``phalanx sim``
    reports as stranded GPUs (divided by 1000)."""
    kube = node.view.kube
    if kube is None:
        return 0.0
    cpu_free = kube.allocatable.get(CPU, 0) - node.requested.get(CPU, 0)
    return max(0.0, sum(free_milli(node).values()) - cpu_free / cpu_per_gpu)
